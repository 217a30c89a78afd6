"""How many clients the batched executor trains at once, and how fast.

    python benchmarks/batched_k.py                         # CPU, cnn-mnist
    python benchmarks/batched_k.py --device cuda --k 100 400 1600 6400

For each K, one round of K clients x tau local steps goes through
:func:`fedsim.batched.train_batched` on one worker (the workload's model,
data and batches), timed after a warm-up, with the peak device memory. The
sweep stops at the first K that does not fit (out of memory) or once
``--max-seconds`` are spent, and reports the largest K that fitted. The
bare loop's local steps per second (plain PyTorch, one client after another,
the same batches, on the same device, from ``run.py``) and fedsim's
sequential worker are measured in the same process for the ratios.
Clients repeat when K exceeds the fleet (FedAvg keeps no client state).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime
from pathlib import Path

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import WORKLOADS, gpu_overrides, run_baseline  # noqa: E402

from fedsim.batched import train_batched  # noqa: E402
from fedsim.data import build_data  # noqa: E402
from fedsim.runtime import run_setup
from fedsim.scenario import load_scenario  # noqa: E402
from fedsim.server import Server  # noqa: E402
from fedsim.workers import Task, Worker  # noqa: E402


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _timed(fn, dev: torch.device) -> float:
    _sync(dev)
    t0 = time.perf_counter()
    fn()
    _sync(dev)
    return time.perf_counter() - t0


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="cnn-mnist", choices=list(WORKLOADS))
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--k", type=int, nargs="*", default=[10, 100])
    ap.add_argument("--max-seconds", type=float, default=120.0)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--out", type=Path, default=None, help="append the table here")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch sees no CUDA device", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    sc = load_scenario(
        WORKLOADS[args.workload],
        [*args.overrides, "resources.vectorize=true", *gpu_overrides(args.device, 1)],
    )
    tau = sc.round.max_steps
    data = build_data(sc.data, sc.num_clients, sc.seed)
    worker = Worker(run_setup(sc).worker, data)
    dev = worker.device
    payload = Server(run_setup(sc).server, data).payload()
    m = sc.num_clients

    def tasks(k: int) -> list[Task]:
        return [Task(client=j % m, round=0, tau=tau) for j in range(k)]

    # the references: 5 rounds of 10 clients each, one client at a time
    schedule = [[((10 * r + j) % m, tau) for j in range(10)] for r in range(5)]
    bare = run_baseline(sc, schedule, args.device)["steps_per_s"]
    worker.train_sequential(payload, tasks(2), {})  # warm-up
    seq = (
        20 * tau / _timed(lambda: worker.train_sequential(payload, tasks(20), {}), dev)
    )
    rows = [
        f"| bare PyTorch loop | 1 | {bare:,.0f} | 1.00x | - |",
        f"| fedsim sequential worker | 1 | {seq:,.0f} | {seq / bare:.2f}x | - |",
    ]
    train_batched(worker, payload, tasks(min(args.k)), {})  # warm-up
    start, largest = time.perf_counter(), None
    for k in sorted(args.k):
        if time.perf_counter() - start > args.max_seconds:
            print(f"K = {k}: not tried, --max-seconds {args.max_seconds:g} spent")
            break
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            dt = _timed(lambda k=k: train_batched(worker, payload, tasks(k), {}), dev)
        except (RuntimeError, MemoryError) as e:
            if not _is_oom(e) and not isinstance(e, MemoryError):
                raise
            print(f"K = {k}: out of memory")
            break
        peak = (
            f"{torch.cuda.max_memory_allocated() / 2**20:,.0f} MB"
            if dev.type == "cuda"
            else "-"
        )
        sps = k * tau / dt
        largest = k
        rows.append(f"| batched | {k} | {sps:,.0f} | {sps / bare:.2f}x | {peak} |")
        print(rows[-1], flush=True)
    name = torch.cuda.get_device_name(0) if dev.type == "cuda" else "CPU, 1 thread"
    text = (
        f"| {args.workload} on {name}, tau {tau} | K | local steps/s | vs bare "
        "| peak device memory |\n|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
        f"\nLargest K tried that fitted: {largest}.\n"
    )
    print(text)
    if args.out:
        stamp = datetime.now().strftime("%Y-%m-%d %H:%M")
        with open(args.out, "a") as f:
            f.write(f"\n## {stamp} batched K sweep (torch {torch.__version__})\n\n")
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
