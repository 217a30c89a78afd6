"""Check that a refactor leaves every ready scenario's results unchanged.

Runs each scenario in ``scenarios/`` (shortened to a few rounds, in-process)
through the ``fedsim`` command line of a given source tree, and records a
digest of every column of ``rounds.parquet`` and ``clients.parquet``
(``wall_time`` excluded: it is real time). Comparing the records of two trees
lists, per scenario, the columns whose values differ::

    python benchmarks/golden_check.py record /tmp/before.json --tree /path/to/old
    python benchmarks/golden_check.py record /tmp/after.json
    python benchmarks/golden_check.py compare /tmp/before.json /tmp/after.json

The command line is the one interface every version shares, which is why
this drives it rather than a library call. Record both on one machine: the
digests are bit for bit, and on another CPU type float columns may differ
in their last bits (docs/architecture.md, "Determinism").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
SKIP_COLUMNS = {"wall_time"}
# Scenarios too costly to run even for a few rounds on a CPU: name -> why.
SKIP_SCENARIOS = {
    "scenarios/papers/feddm-fmnist.yaml": "FedDM on a ConvNet: hours per round",
    # 16 clients x 60,000 Fashion-MNIST images for 2 to 5 epochs: over ten
    # minutes a round on 2 cores
    "scenarios/papers/fednova-fmnist-proxy.yaml": "full Fashion-MNIST epochs per round",
}


def _digest(table_path: Path) -> dict[str, str]:
    table = pq.read_table(table_path)
    out = {"_rows": str(table.num_rows)}
    for name in sorted(table.column_names):
        if name in SKIP_COLUMNS:
            continue
        values = table.column(name).to_pylist()
        blob = json.dumps(values, sort_keys=True, default=repr).encode()
        out[name] = hashlib.sha256(blob).hexdigest()[:16]
    return out


def record(tree: Path, rounds: int, only: list[str]) -> dict[str, dict]:
    env = {**os.environ, "PYTHONPATH": str(tree), "RAY_USAGE_STATS_ENABLED": "0"}
    shared = ROOT.parent / "shared" / "data"
    if "FEDSIM_DATA_ROOT" not in env and shared.is_dir():
        env["FEDSIM_DATA_ROOT"] = str(shared)  # the MNIST test set, offline
    results: dict[str, dict] = {}
    scenarios = sorted((tree / "scenarios").rglob("*.yaml"))
    for path in scenarios:
        rel = str(path.relative_to(tree))
        if only and not any(o in rel for o in only):
            continue
        if rel in SKIP_SCENARIOS:
            print(f"{rel}: skipped ({SKIP_SCENARIOS[rel]})", flush=True)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "run"
            cmd = [
                sys.executable,
                "-m",
                "fedsim.tools.cli",
                "run",
                str(path),
                "--workers",
                "0",
                "--set",
                f"rounds={rounds}",
                "--out",
                str(out),
                "--no-report",
                "--quiet",
            ]
            proc = subprocess.run(
                cmd, env=env, cwd=tree, capture_output=True, text=True
            )
            entry: dict = {"exit": proc.returncode}
            for table in ("rounds", "clients"):
                f = out / f"{table}.parquet"
                if f.exists():
                    entry[table] = _digest(f)
            if proc.returncode:
                entry["stderr"] = proc.stderr.strip().splitlines()[-1:]
        results[rel] = entry
        print(f"{rel}: exit {proc.returncode}", file=sys.stderr, flush=True)
    return results


def compare(before: dict[str, dict], after: dict[str, dict]) -> int:
    changed = 0
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name), after.get(name)
        if a is None or b is None:
            print(f"{name}: only in {'after' if a is None else 'before'}")
            changed += 1
            continue
        diffs = []
        if a["exit"] != b["exit"]:
            diffs.append(f"exit {a['exit']} -> {b['exit']}")
        for table in ("rounds", "clients"):
            ta, tb = a.get(table, {}), b.get(table, {})
            cols = sorted(set(ta) | set(tb))
            bad = [c for c in cols if ta.get(c) != tb.get(c)]
            if bad:
                diffs.append(f"{table}: {', '.join(bad)}")
        print(f"{name}: {'identical' if not diffs else '; '.join(diffs)}")
        changed += bool(diffs)
    print(f"{changed} of {len(set(before) | set(after))} scenarios differ")
    return 1 if changed else 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("out", type=Path)
    r.add_argument("--tree", type=Path, default=ROOT)
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--only", nargs="*", default=[])
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = p.parse_args()
    if args.cmd == "record":
        res = record(args.tree.resolve(), args.rounds, args.only)
        args.out.write_text(json.dumps(res, indent=1, sort_keys=True))
    else:
        sys.exit(
            compare(
                json.loads(args.before.read_text()), json.loads(args.after.read_text())
            )
        )


if __name__ == "__main__":
    main()
