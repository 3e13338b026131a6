"""Guarded generator, coroutine and async-generator stages driven with grad on (a data
pipeline): values, send/throw/close and return values as unguarded, nothing logged."""

import asyncio

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:batches"
        action = "enable_grad"
        [[rules]]
        target = "case:averaged"
        action = "enable_grad"
        [[rules]]
        target = "case:stream"
        action = "enable_grad"
    """,
    "modes": ["fix", "strict"],
}


def batches(data, size):
    received = []
    try:
        for start in range(0, len(data), size):
            received.append((yield data[start : start + size]))
    except KeyError:
        yield "caught"
    return received


async def averaged(chunks):
    total = torch.zeros(())
    for chunk in chunks:
        await asyncio.sleep(0)
        total = total + chunk.mean()
    return total


async def stream(n):
    for i in range(n):
        await asyncio.sleep(0)
        yield torch.full((2,), float(i), requires_grad=True).sum()


async def consume():
    return [x.item() async for x in stream(3)]


def main():
    data = torch.arange(10.0)
    generator = batches(data, 4)
    print(next(generator).tolist(), generator.send("a").tolist(), generator.throw(KeyError))
    generator.close()
    generator = batches(data, 5)
    chunks = [next(generator), generator.send(1)]
    try:
        generator.send(2)
    except StopIteration as stop:
        print("returned", stop.value)
    print(asyncio.run(averaged(chunks)).item(), asyncio.run(consume()))
