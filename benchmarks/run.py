"""fedsim against a bare PyTorch loop doing the same local training.

    .venv/bin/python benchmarks/run.py                  # every workload
    .venv/bin/python benchmarks/run.py lr --rounds 20   # one workload, shorter
    python benchmarks/run.py cnn --device cuda          # on a GPU (gpu_check.sh)

For each workload this runs, back to back in one process: fedsim with 1 and 2
Ray workers, fedsim in-process (no Ray), the batched executor
(``resources.vectorize``, :mod:`fedsim.batched`) with 1 Ray worker and
in-process, the same local training as a plain Ray program on 1 and 2 actors
(no fedsim: the bar fedsim's Ray path is held to), and the baseline, a plain
single-threaded PyTorch loop over the same clients, the same minibatches and
the same number of steps (no framework). It prints wall time, setup time,
steady seconds per round (median after warm-up), local steps per second, peak
memory and the ratios to the baseline, fedsim on n Ray workers against the
plain Ray program on n actors (a change that slows fedsim's Ray path shows
there first), checks that every variant and the baseline end with the same
model, and appends the tables to benchmarks/results.md.

With ``--device cuda`` every fedsim variant gets ``resources.gpus_per_worker``
(1 in-process and for one worker, 0.5 each for two) and the baseline trains
on the GPU too; ``--only`` picks variants, ``--set`` adds scenario overrides
(``--set selector.clients_per_round=100``).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from fedsim.data import DataMissingError, FederatedData, build_data  # noqa: E402
from fedsim.data.base import as_tensor  # noqa: E402
from fedsim.minibatches import client_seed  # noqa: E402
from fedsim.models import make_model  # noqa: E402
from fedsim.runtime import (
    run_scenario,  # noqa: E402
    run_setup,
)
from fedsim.scenario import load_scenario  # noqa: E402

HERE = Path(__file__).resolve().parent
WORKLOADS = {
    "lr": HERE / "lr.yaml",
    "mlp": HERE / "mlp.yaml",
    "cnn": HERE / "cnn.yaml",
    "cnn-mnist": HERE / "cnn-mnist.yaml",
}
WARMUP = 3
# variant -> (workers, batched); workers 0 is in-process (no Ray)
VARIANTS = {
    "1": (1, False),
    "2": (2, False),
    "local": (0, False),
    "batched1": (1, True),
    "batched": (0, True),
}
# the plain Ray program (no fedsim): variant -> actors
PLAIN = {"plain1": 1, "plain": 2}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def steady(round_times: list[float]) -> float:
    body = round_times[WARMUP:] or round_times
    return statistics.median(body)


def run_fedsim(
    path: Path,
    workers: int,
    overrides: list[str],
    batched: bool = False,
    device: str = "cpu",
) -> dict:
    t0 = time.perf_counter()
    ray_s = 0.0
    if workers:
        from fedsim.remote.ray_session import init_ray

        init_ray(num_cpus=max(2, workers))
        ray_s = time.perf_counter() - t0
    sc = load_scenario(
        path,
        [
            *overrides,
            f"resources.workers={workers}",
            f"resources.vectorize={str(batched).lower()}",
            *gpu_overrides(device, workers),
        ],
    )
    torch.set_num_threads(1)
    t1 = time.perf_counter()
    sim = run_scenario(sc, workers=workers)
    rows, clients = sim.rows, sim.clients
    wall = time.perf_counter() - t0
    data_s = (time.perf_counter() - t1) - rows[-1]["wall_time"]  # data, actors
    ends = [r["wall_time"] for r in rows]
    per_round = [b - a for a, b in zip([0.0, *ends[:-1]], ends, strict=True)]
    steps = sum(c["tau"] for c in clients if not c["dropped"])
    worker_rss = 0.0
    name = (
        f"fedsim {workers} worker{'s' if workers != 1 else ''}"
        if workers
        else "fedsim in-process"
    )
    return {
        "name": name + (", batched" if batched else ""),
        "workers": workers,
        "batched": batched,
        "wall_s": wall,
        "setup_s": wall - sum(per_round),
        "ray_init_s": ray_s,
        "data_s": data_s,
        "steady_s": steady(per_round),
        "steps_per_s": steps / sum(per_round),
        "peak_mb": peak_rss_mb() + worker_rss,
        "final": sim.final_params,
        "schedule": schedule_of(clients),
        "scenario": sc,
    }


def gpu_overrides(device: str, workers: int) -> list[str]:
    """A whole GPU for the in-process run and for one worker, half each for two."""
    if device == "cpu":
        return []
    return [f"resources.gpus_per_worker={1.0 if workers < 2 else 1.0 / workers}"]


def schedule_of(clients: list[dict]) -> list[list[tuple[int, int]]]:
    """Per round, the (client, tau) pairs that trained."""
    rounds: dict[int, list[tuple[int, int]]] = {}
    for c in clients:
        if not c["dropped"]:
            rounds.setdefault(c["round"], []).append((c["client_id"], c["tau"]))
    return [sorted(rounds.get(t, [])) for t in range(max(rounds) + 1)]


def train_client(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    rows: tuple[torch.Tensor, torch.Tensor],
    gen: torch.Generator,
    tau: int,
    batch: int,
) -> None:
    """A client's local training as a bare PyTorch program writes it: ``tau``
    SGD steps on its rows, minibatches of epochs of ``gen``'s permutations
    (drawn on the CPU, crossing to the rows' device once per epoch: the
    batches fedsim draws)."""
    xs, ys = rows
    n, dev = len(xs), xs.device
    perm, pos = None, n
    for _ in range(tau):
        if n <= batch:
            xb, yb = xs, ys
        else:
            if pos + batch > n:
                perm, pos = torch.randperm(n, generator=gen).to(dev), 0
            idx = perm[pos : pos + batch]
            pos += batch
            xb, yb = xs[idx], ys[idx]
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()


def add_delta(step: list[torch.Tensor], delta, w: float) -> None:
    """step += w * delta in float64, parameter by parameter (the FedAvg sum
    x + sum_i p_i (x_i - x) is taken as the clients come, in their order)."""
    for acc, d in zip(step, delta, strict=True):
        acc.add_(d.double(), alpha=w)


def run_baseline(
    sc, schedule: list[list[tuple[int, int]]], device: str = "cpu"
) -> dict:
    """The limit: plain PyTorch, one thread, the same clients, batches, steps.

    On a GPU the data and model live on the device; each epoch's permutation
    is drawn by the client's CPU generator (as fedsim's, so the batches are
    the same) and crosses to the device once.
    """
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    data = build_data(sc.data, sc.num_clients, sc.seed)
    trainer = PlainTrainer(data, sc, device)
    setup = time.perf_counter() - t0
    global_params = [p.detach().clone() for p in trainer.model.parameters()]
    per_round, steps = [], 0
    for t, chosen in enumerate(schedule):
        r0 = time.perf_counter()
        total_n = sum(float(data.weights[c]) for c, _ in chosen)
        step = [torch.zeros_like(g, dtype=torch.float64) for g in global_params]
        # each client's delta summed as it comes
        deltas = trainer.deltas(global_params, chosen, t)
        for (c, tau), delta in zip(chosen, deltas, strict=True):
            add_delta(step, delta, float(data.weights[c]) / total_n)
            steps += tau
        global_params = [
            g + a.float() for g, a in zip(global_params, step, strict=True)
        ]
        if device == "cuda":
            torch.cuda.synchronize()
        per_round.append(time.perf_counter() - r0)
    wall = time.perf_counter() - t0
    final = torch.cat([g.reshape(-1) for g in global_params]).cpu()
    return {
        "name": "baseline (bare PyTorch)",
        "wall_s": wall,
        "setup_s": setup,
        "steady_s": steady(per_round),
        "steps_per_s": steps / sum(per_round),
        "peak_mb": peak_rss_mb(),
        "final": final,
    }


class PlainTrainer:
    """The bare loop's clients: the model, an SGD optimizer and the dataset,
    in this process (the baseline) or as one actor of the plain Ray program
    (:func:`run_plain_ray`)."""

    def __init__(self, data: FederatedData | list, sc, device: str = "cpu") -> None:
        if isinstance(data, list):  # an actor: the reference in a list
            import ray

            data = ray.get(data[0])
        torch.set_num_threads(1)
        dev = torch.device(device)
        self.data = data
        self.model = make_model(run_setup(sc).network, data).to(dev)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=sc.client.lr)
        # views of the arrays (the object store's on an actor), never written
        self.x, self.y = as_tensor(data.x).to(dev), as_tensor(data.y).to(dev)
        self.seed, self.batch = sc.seed, sc.client.batch_size

    def deltas(
        self, params: list[torch.Tensor], jobs: list[tuple[int, int]], t: int
    ) -> Iterator[list[torch.Tensor]]:
        """Each job's (client, tau) delta from ``params``, one at a time."""
        for c, tau in jobs:
            with torch.no_grad():
                for p, g in zip(self.model.parameters(), params, strict=True):
                    p.copy_(g)
            lo, hi = int(self.data.offsets[c]), int(self.data.offsets[c + 1])
            gen = torch.Generator().manual_seed(client_seed(self.seed, t, c))
            rows = (self.x[lo:hi], self.y[lo:hi])
            train_client(self.model, self.opt, rows, gen, tau, self.batch)
            pairs = zip(self.model.parameters(), params, strict=True)
            yield [p.detach() - g for p, g in pairs]

    def train(
        self, params: list[torch.Tensor], jobs: list[tuple[int, int]], t: int
    ) -> list[list[torch.Tensor]]:
        """:meth:`deltas` as a list (what an actor call returns: plain
        tensors, pickled as Ray does by default)."""
        return list(self.deltas(params, jobs, t))


def run_plain_ray(sc, schedule: list[list[tuple[int, int]]], actors: int) -> dict:
    """The same local training in plain Ray actors, no fedsim: what a Ray
    program that does only this work costs (the bar fedsim's Ray path is
    held to). ``actors`` actors of one CPU each hold the model and the
    dataset (put in the object store once); each round the driver puts the
    parameters once, deals the clients round-robin, gathers the deltas
    (torch tensors, pickled as Ray does by default) and takes the FedAvg
    step as the bare loop does, so it ends with the bare loop's exact
    parameters."""
    import ray

    from fedsim.remote.ray_session import init_ray

    t0 = time.perf_counter()
    init_ray(num_cpus=max(2, actors))
    torch.set_num_threads(1)
    data = build_data(sc.data, sc.num_clients, sc.seed)
    box = [ray.put(data)]
    remote = ray.remote(num_cpus=1)(PlainTrainer)
    pool = [remote.remote(box, sc) for _ in range(actors)]
    model = make_model(run_setup(sc).network, data)
    global_params = [p.detach().clone() for p in model.parameters()]
    ray.get([a.__ray_ready__.remote() for a in pool])
    setup = time.perf_counter() - t0
    per_round, steps = [], 0
    for t, chosen in enumerate(schedule):
        r0 = time.perf_counter()
        ref = ray.put(global_params)
        shares = [chosen[j :: len(pool)] for j in range(len(pool))]
        calls = [a.train.remote(ref, s, t) for a, s in zip(pool, shares, strict=True)]
        deltas = {
            c: d
            for share, part in zip(shares, ray.get(calls), strict=True)
            for (c, _), d in zip(share, part, strict=True)
        }
        total_n = sum(float(data.weights[c]) for c, _ in chosen)
        step = [torch.zeros_like(g, dtype=torch.float64) for g in global_params]
        for c, _ in chosen:
            add_delta(step, deltas[c], float(data.weights[c]) / total_n)
        global_params = [
            g + a.float() for g, a in zip(global_params, step, strict=True)
        ]
        steps += sum(tau for _, tau in chosen)
        per_round.append(time.perf_counter() - r0)
    for a in pool:
        ray.kill(a)
    wall = time.perf_counter() - t0
    return {
        "name": f"plain Ray actors, {actors}",
        "workers": actors,
        "wall_s": wall,
        "setup_s": setup,
        "steady_s": steady(per_round),
        "steps_per_s": steps / sum(per_round),
        "peak_mb": peak_rss_mb(),
        "final": torch.cat([g.reshape(-1) for g in global_params]),
    }


def missing_data(path: Path, overrides: list[str]) -> str:
    """Why ``path``'s workload has no data here (the first line of the
    DataMissingError), or "" when it has. Only datasets read from files are
    built here (synthetic ones cannot be missing)."""
    sc = load_scenario(path, overrides)
    if "root" not in type(sc.data).model_fields:
        return ""
    try:
        build_data(sc.data, sc.num_clients, sc.seed)
    except DataMissingError as exc:
        return str(exc).splitlines()[0]
    return ""


def table(workload: str, results: list[dict], base: dict) -> str:
    head = (
        f"| {workload} | wall s | setup s | steady s/round | steps/s | peak MB "
        "| wall / base | steady / base |\n|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in [*results, base]:
        lines.append(
            f"| {r['name']} | {r['wall_s']:.2f} | {r['setup_s']:.2f} | "
            f"{r['steady_s'] * 1000:.2f} ms | {r['steps_per_s']:.0f} | "
            f"{r['peak_mb']:.0f} | {r['wall_s'] / base['wall_s']:.2f}x | "
            f"{r['steady_s'] / base['steady_s']:.2f}x |"
        )
    return head + "\n".join(lines) + "\n"


def against_plain(results: list[dict], plain: list[dict]) -> str:
    """fedsim on n Ray workers against the plain Ray program on n actors
    (steady s/round, same run): above 1.00x, fedsim's Ray path costs more
    than Ray itself does for the same training."""
    lines = []
    for p in plain:
        for r in results:
            if r["workers"] == p["workers"] and not r["batched"]:
                ratio = r["steady_s"] / p["steady_s"]
                lines.append(f"- {r['name']} / {p['name']}: {ratio:.2f}x steady")
    return "\n".join(lines) + "\n" if lines else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workloads", nargs="*", default=list(WORKLOADS))
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--no-append", action="store_true")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument(
        "--only",
        nargs="*",
        choices=[*VARIANTS, *PLAIN],
        default=[*VARIANTS, *PLAIN],
        help="variants to run (default: all); the plain Ray ones (CPU only) "
        "train the schedule of the first fedsim variant, which must be run",
    )
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--out", type=Path, default=HERE / "results.md")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch sees no CUDA device", file=sys.stderr)
        return 2
    if not set(args.only) & set(VARIANTS):
        print("--only: name at least one fedsim variant", file=sys.stderr)
        return 2
    overrides = [f"rounds={args.rounds}"] if args.rounds else []
    overrides += args.overrides
    out = []
    for name in args.workloads:
        path = WORKLOADS[name]
        if not path.exists():
            print(f"skipping {name}: {path} is missing")
            continue
        why = missing_data(path, overrides)
        if why:  # e.g. cnn-mnist without MNIST: the other workloads still run
            print(f"skipping {name}: its data is missing ({why})")
            continue
        results = [
            run_fedsim(path, w, overrides, batched=b, device=args.device)
            for v, (w, b) in VARIANTS.items()
            if v in args.only
        ]
        first = results[0]
        plain = [
            run_plain_ray(first["scenario"], first["schedule"], n)
            for v, n in PLAIN.items()
            if v in args.only and args.device == "cpu"
        ]
        base = run_baseline(first["scenario"], first["schedule"], args.device)
        for r in [*results, *plain]:
            assert r.get("schedule", first["schedule"]) == first["schedule"]
            diff = float((r["final"] - base["final"]).abs().max())
            print(f"{r['name']}: max |x - x_baseline| = {diff:.3g}")
        label = name if args.device == "cpu" else f"{name} ({args.device})"
        text = table(label, [*results, *plain], base)
        text += "\n" + against_plain(results, plain) if plain else ""
        print(text)
        out.append(text)
    if out and not args.no_append:
        stamp = datetime.now().strftime("%Y-%m-%d %H:%M")
        machine = (
            f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
            f"{platform.python_version()}, torch {torch.__version__}"
        )
        if args.device == "cuda":
            machine += f", {torch.cuda.get_device_name(0)}"
        if args.overrides:
            machine += ", " + " ".join(args.overrides)
        with open(args.out, "a") as f:
            f.write(f"\n## {stamp} ({machine})\n\n" + "\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
