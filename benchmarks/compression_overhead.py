"""What top-k with error feedback adds to a CNN client's round on the CPU.

    nice -n 10 python benchmarks/compression_overhead.py [--steps 10]

One client's round of the FedAvg paper's MNIST CNN (fedsim.models.CNN, 1.66M
parameters, batch 20) trained for ``--steps`` local steps, with and
without compressing its update (top-1% and error feedback, as
fedsim.workers does after the steps), alternating 7 times; prints the
median of each and their ratio. The issue's bound: at most 1.10.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from fedsim.compression import TopK, compress_update, compression_generator
from fedsim.models import CNN, batch_loss, build_model
from fedsim.params import flatten


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(CNN(), 784, 10, 0, 0.0, (1, 28, 28))
    x, y = torch.randn(20, 1, 28, 28), torch.randint(0, 10, (20,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    comp = TopK(fraction=0.01, error_feedback=True)
    residual = torch.zeros(sum(p.numel() for p in model.parameters()))

    def round_(compress: bool) -> float:
        nonlocal residual
        t0 = time.perf_counter()
        start = flatten(model).clone()
        for _ in range(args.steps):
            opt.zero_grad()
            batch_loss(model, x, y).backward()
            opt.step()
        if compress:
            out = compress_update(
                comp, flatten(model) - start, residual, compression_generator(7)
            )
            assert out.residual is not None
            residual = out.residual
        return time.perf_counter() - t0

    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(7):
        for c in (False, True) if i % 2 else (True, False):
            times[c].append(round_(c))
    plain, comp_t = (float(np.median(times[c])) for c in (False, True))
    print(f"parameters                {residual.numel():,}")
    print(f"round, {args.steps} steps, dense   {plain * 1000:.1f} ms (median of 7)")
    print(f"round with top-1% + EF    {comp_t * 1000:.1f} ms")
    print(f"ratio                     {comp_t / plain:.3f}")


if __name__ == "__main__":
    main()
