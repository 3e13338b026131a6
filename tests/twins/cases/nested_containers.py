"""A stage takes nested containers (dicts of lists of tuples, a namedtuple, an OrderedDict)
and keeps them: the same objects, the same types, with grad on or off (no inference
tensors, so nothing is cloned or rebuilt)."""

import collections

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:collect"
        action = "enable_grad"
    """,
    "modes": {"fix": {"events": ["grad_mode/enable_grad"]}},
}

Sample = collections.namedtuple("Sample", "points colors")
KEPT = []


def collect(batch, samples, options):
    KEPT.append((batch, samples, options))
    batch["seen"] = len(samples)
    samples.append(Sample(torch.zeros(1), torch.ones(1)))
    options["order"].append("collect")
    return len(KEPT)


def main():
    batch = {"points": [torch.ones(2), (torch.zeros(1), torch.ones(1))]}
    samples = [Sample(torch.ones(3), torch.zeros(3))]
    options = collections.OrderedDict(order=[], scale=torch.tensor(2.0))
    print(collect(batch, samples, options))
    with torch.no_grad():
        print(collect(batch, samples, options))
    kept_batch, kept_samples, kept_options = KEPT[-1]
    print(kept_batch is batch, kept_samples is samples, kept_options is options)
    print(type(kept_options).__name__, batch["seen"], len(samples), options["order"])
