"""A Dataset whose ``__getitem__`` calls a guarded stage, loaded by a DataLoader with two
worker processes: the same batches, nothing logged."""

import torch
from torch.utils.data import DataLoader, Dataset

TWIN = {
    "policy": """
        [[rules]]
        target = "case:augment"
        action = "snapshot"
        [[rules]]
        target = "case:Points.__getitem__"
        action = "enable_grad"
    """,
}


def augment(points, index):
    return points * (1 + index)


class Points(Dataset):
    def __init__(self):
        self.points = torch.arange(12.0).reshape(6, 2)

    def __len__(self):
        return len(self.points)

    def __getitem__(self, index):
        return augment(self.points[index], index)


def main():
    loader = DataLoader(Points(), batch_size=2, num_workers=2)
    batches = list(loader)
    torch.save(batches, "result.pt")
    print([b.tolist() for b in batches])
