"""Peak memory (PSS) of a whole run's process tree: fedsim on 2 Ray workers
against a plain Ray-actor loop doing the same training.

    .venv/bin/python benchmarks/memory.py            # cnn workload, 5 rounds

Each variant runs in its own subprocess, which starts an embedded local Ray,
so the driver, Ray's own processes and the worker actors are all descendants
of it; this script samples the sum of their proportional set sizes (PSS:
shared pages counted once across the tree) every 0.2 s and prints the peak,
and the peak of the driver's own PSS (the subprocess itself, without Ray's
processes and the actors).

- ``fedsim``: ``fedsim run benchmarks/cnn.yaml --workers 2`` (the server in the
  driver, two worker actors).
  ``--server actor`` runs the server as a Ray actor instead.
- ``plain``: the least a Ray program can do for the same work: two actors,
  each holding the model and the dataset from the object store, training the
  round's clients for the same steps from parameters the driver sends, the
  driver averaging the deltas.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
CNN = ROOT / "benchmarks" / "cnn.yaml"

PLAIN = r"""
import sys, numpy as np, ray, torch, torch.nn.functional as F
from fedsim.runtime import run_setup
from fedsim.data import build_data
from fedsim.models import make_model
from fedsim.params import flatten
from fedsim.remote.ray_session import init_ray
from fedsim.scenario import load_scenario

sc = load_scenario(sys.argv[1], [f"rounds={sys.argv[2]}"])
init_ray(num_cpus=2)


@ray.remote(num_cpus=1)
class Trainer:
    def __init__(self, box, sc):
        torch.set_num_threads(1)
        self.data = ray.get(box[0])
        self.model = make_model(run_setup(sc).network, self.data)
        self.sc = sc

    def train(self, x, jobs):
        out = []
        for c, tau in jobs:
            torch.nn.utils.vector_to_parameters(x, self.model.parameters())
            opt = torch.optim.SGD(self.model.parameters(), lr=self.sc.client.lr)
            lo, hi = int(self.data.offsets[c]), int(self.data.offsets[c + 1])
            xs = torch.from_numpy(self.data.x[lo:hi])
            ys = torch.from_numpy(self.data.y[lo:hi])
            for s in range(tau):
                idx = torch.randint(0, hi - lo, (self.sc.client.batch_size,))
                opt.zero_grad()
                F.cross_entropy(self.model(xs[idx]), ys[idx]).backward()
                opt.step()
            out.append(flatten(self.model).detach() - x)
        return out


data = build_data(sc.data, sc.num_clients, sc.seed)
box = [ray.put(data)]
actors = [Trainer.remote(box, sc) for _ in range(2)]
x = flatten(make_model(run_setup(sc).network, data)).detach()
rng = np.random.default_rng(0)
for t in range(sc.rounds):
    chosen = rng.choice(sc.num_clients, sc.selector.clients_per_round, replace=False)
    jobs = [(int(c), sc.round.max_steps) for c in chosen]
    ref = ray.put(x)
    parts = ray.get([a.train.remote(ref, jobs[i::2]) for i, a in enumerate(actors)])
    x = x + torch.stack([d for p in parts for d in p]).mean(0)
print("plain done")
"""


def _pss(p: psutil.Process) -> int:
    """``p``'s PSS in bytes (0 once it is gone or unreadable)."""
    try:
        return p.memory_full_info().pss
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0


def tree_pss_mb(proc: psutil.Process) -> tuple[float, float]:
    """PSS in MB of ``proc``'s whole process tree, and of ``proc`` alone."""
    own = _pss(proc)
    kids = sum(_pss(p) for p in proc.children(recursive=True))
    return (own + kids) / 2**20, own / 2**20


def peak_of(cmd: list[str], tree: Path) -> tuple[float, float, float]:
    """Run ``cmd`` on the source ``tree``; return (peak PSS of its process
    tree in MB, peak PSS of the process itself, the driver, in MB, wall
    seconds)."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL)
    ps = psutil.Process(proc.pid)
    peak = own_peak = 0.0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak, own_peak
        while not stop.is_set():
            total, own = tree_pss_mb(ps)
            peak, own_peak = max(peak, total), max(own_peak, own)
            time.sleep(0.2)

    th = threading.Thread(target=sample)
    th.start()
    code = proc.wait()
    stop.set()
    th.join()
    if code:
        raise SystemExit(f"{cmd[:4]} exited {code}")
    return peak, own_peak, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tree", type=Path, default=ROOT, help="fedsim source tree")
    ap.add_argument("--skip-plain", action="store_true")
    ap.add_argument(
        "--server",
        choices=["driver", "actor"],
        default="driver",
        help="resources.server.home (actor: cpus 0, it shares the 2 CPUs)",
    )
    args = ap.parse_args()
    py = sys.executable
    out = Path("/tmp") / f"fedsim-memory-{os.getpid()}"
    fedsim = [
        py, "-m", "fedsim.tools.cli", "run", str(CNN), "--workers", "2", "--quiet",
        "--no-report", "--set", f"rounds={args.rounds}", "--out", str(out),
    ]  # fmt: skip
    if args.server == "actor":
        fedsim += ["--set", "resources.server.home=actor"]
        fedsim += ["--set", "resources.server.cpus=0"]
    plain = [py, "-c", PLAIN, str(CNN), str(args.rounds)]
    f_peak, f_own, f_wall = peak_of(fedsim, args.tree)
    print("| cnn, 2 Ray workers | peak PSS MB | driver's own peak PSS MB | wall s |")
    print("|---|---|---|---|")
    row = f"{f_peak:,.0f} | {f_own:,.0f} | {f_wall:.1f}"
    print(f"| fedsim, server {args.server} | {row} |")
    if not args.skip_plain:
        p_peak, p_own, p_wall = peak_of(plain, ROOT)
        print(f"| plain Ray actors | {p_peak:,.0f} | {p_own:,.0f} | {p_wall:.1f} |")
        print(f"ratio fedsim / plain: {f_peak / p_peak:.2f}")


if __name__ == "__main__":
    main()
