"""torch's closure optimizers (LBFGS, and SGD given a closure) with a learning-rate
scheduler, foreach and single-tensor paths: the same weights, nothing logged."""

import torch
from torch import nn

TWIN = {"modes": ["fix"]}


def fit_lbfgs():
    torch.manual_seed(0)
    x = torch.randn(16, 2)
    y = x @ torch.tensor([[2.0], [-1.0]]) + 0.5
    model = nn.Linear(2, 1)
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)

    def closure():
        optimizer.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        return loss

    for _ in range(3):
        loss = optimizer.step(closure)
    return model.state_dict(), loss.detach()


def fit_sgd(foreach):
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5, foreach=foreach)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    for _ in range(5):

        def closure():
            optimizer.zero_grad()
            loss = model(torch.ones(4, 3)).pow(2).sum()
            loss.backward()
            return loss

        optimizer.step(closure)
        scheduler.step()
    return model.state_dict(), scheduler.get_last_lr()


def main():
    results = {"lbfgs": fit_lbfgs(), "foreach": fit_sgd(True), "single": fit_sgd(False)}
    torch.save(results, "result.pt")
    print(results["foreach"][1], results["lbfgs"][1].item())
