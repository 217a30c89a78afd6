"""Per-client state at scale (issue 8): 10,000 SCAFFOLD clients of a
100k-parameter model, in memory and spilled to disk.

    .venv/bin/python benchmarks/store.py

Prints the memory the store takes once every client has trained, and the
store's cost per round (read 10 clients' c_i, write 10 back) in RAM and
spilled to memory-mapped files, next to the training time of the same round
(10 clients x 10 local steps of an MLP with ~100k parameters, batch 32), so
the slow-down a spill causes can be read off directly.
"""

from __future__ import annotations

import resource
import time

import numpy as np
import torch

from fedsim.store import ClientStore

CLIENTS, DIM, PER_ROUND = 10_000, 101_770, 10  # MLP 784-128-10


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def round_cost(store: ClientStore, rng: np.random.Generator, rounds: int = 30) -> float:
    times = []
    for _ in range(rounds):
        ids = rng.choice(CLIENTS, PER_ROUND, replace=False)
        t0 = time.perf_counter()
        states = store.get(ids)
        for c in ids:
            store.put(int(c), {"c": states[int(c)].get("c", torch.zeros(DIM)) + 1.0})
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def training_round() -> float:
    torch.set_num_threads(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 784), torch.randint(0, 10, (32,))
    t0 = time.perf_counter()
    for _ in range(PER_ROUND * 10):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return time.perf_counter() - t0


def main() -> None:
    rng = np.random.default_rng(0)
    train_s = training_round()
    before = rss_mb()
    ram = ClientStore(CLIENTS, DIM)
    for c in range(CLIENTS):  # every client has trained once
        ram.put(c, {"c": torch.full((DIM,), 0.5)})
    print(
        f"state: {CLIENTS:,} clients x {DIM:,} floats = "
        f"{CLIENTS * DIM * 4 / 2**30:.2f} GiB; in RAM: +{rss_mb() - before:.0f} MB RSS"
    )
    in_ram = round_cost(ram, rng)
    ram.close()
    spill = ClientStore(CLIENTS, DIM, budget_bytes=1 << 20)  # force the spill
    for c in range(CLIENTS):
        spill.put(c, {"c": torch.full((DIM,), 0.5)})
    print(f"spilled to {spill._tmp} (memory-mapped .npy, float32)")
    spilled = round_cost(spill, rng)
    spill.close()
    print(f"training round (10 clients x 10 steps): {train_s * 1000:.1f} ms")
    print(
        f"store per round, in RAM:  {in_ram * 1000:.2f} ms "
        f"({in_ram / train_s:.1%} of the round)"
    )
    print(
        f"store per round, spilled: {spilled * 1000:.2f} ms "
        f"({spilled / train_s:.1%} of the round)"
    )


if __name__ == "__main__":
    main()
