"""A multi-node Ray cluster on this one machine, for tests.

:func:`multinode_cluster` starts a head and worker nodes with ``ray start
--block``, each in its own session and its own ``--temp-dir``, all on
127.0.0.1 with free ports and Ray token authentication on (a fresh token in a
temporary file; ``~/.ray/auth_token`` is never read or written). When the
``with`` block ends, even on an exception, every process the cluster started
is stopped: SIGTERM to each ``ray start --block`` (Ray then stops what it
started), then SIGKILL, by pid, to whatever of its sessions or its temporary
directory is left. It never runs ``ray stop``, which stops every Ray on the
machine, other people's included.

Why not ``ray.cluster_utils.Cluster``: it starts the nodes inside the test
process, so a node cannot have an environment of its own (this module gives
the worker nodes no data root, to show that data reaches them through the
object store) and its processes are not separable from the test's own.
Worker nodes join through :func:`_join_on_loopback` (see there): plain
``ray start --address`` on Linux either refuses to join or leaves loopback.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent  # the venv's bin: ray, fedsim, python
RAY = BIN / "ray"

__all__ = [
    "BIN",
    "RAY",
    "Cluster",
    "NodeSpec",
    "base_env",
    "free_ports",
    "is_loopback",
    "kill_node",
    "multinode_cluster",
    "node_pids",
]


def base_env(**extra: str) -> dict[str, str]:
    """This process's environment without any Ray address or token, plus
    ``extra``; the venv's bin comes first on PATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAY_AUTH", "RAY_ADDRESS", "RAY_API_SERVER", "FEDSIM_"))
    }
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        RAY_USAGE_STATS_ENABLED="0",
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        COLUMNS="120",
    )
    env.update(extra)
    return env


# Every port free_ports has handed out in this process. The probe sockets are
# closed before Ray binds the ports, so the kernel may offer a just-released
# port again to the next call: a head's dashboard port then came back as its
# own node-manager port and ``ray start`` refused ("trying to use a port
# number ... that is used by other components"; CI, 2026-12-03).
_HANDED_OUT: set[int] = set()


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 right now, none of them handed
    out before by this process (so the ports of one node, and of nodes started
    one after another, never collide with each other)."""
    socks = []
    ports: list[int] = []
    try:
        while len(ports) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)  # held open: the kernel offers it to no one else
            port = s.getsockname()[1]
            if port not in _HANDED_OUT:
                ports.append(port)
        _HANDED_OUT.update(ports)
        return ports
    finally:
        for s in socks:
            s.close()


def is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    return (getattr(addr, "ipv4_mapped", None) or addr).is_loopback


@dataclass(frozen=True)
class NodeSpec:
    """One worker node: its CPUs, (fake) GPUs, custom resources and the
    environment variables it adds to the cluster's."""

    name: str
    num_cpus: int = 1
    num_gpus: int = 0
    resources: Mapping[str, float] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Node:
    name: str
    proc: subprocess.Popen
    dir: Path
    log: Path


@dataclass
class Cluster:
    """A running cluster: where it is, how to reach it, what it started."""

    work: Path
    token: str
    env: dict[str, str]  # for clients: the token file, RAY_AUTH_MODE=token
    gcs: str
    dashboard: str
    nodes: list[Node]  # the head first

    def http(self, method: str, path: str, token: str | None = "", body=None):
        """(status, text) of a request to the dashboard; ``token=""`` sends
        the cluster's token, ``None`` none."""
        token = self.token if token == "" else token
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.dashboard + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def job(self, job_id: str) -> dict:
        """The job's record in Ray's job API (``status``, ``message``, ...)."""
        code, text = self.http("GET", f"/api/jobs/{job_id}")
        return json.loads(text) if code == 200 else {"status": f"HTTP {code}"}

    def job_logs(self, job_id: str) -> str:
        """The job's driver output, as Ray's job API holds it."""
        code, text = self.http("GET", f"/api/jobs/{job_id}/logs")
        return json.loads(text).get("logs", "") if code == 200 else f"HTTP {code}"

    def drive(self, mode: str, cfg: Any, timeout: float = 400) -> tuple[str, str]:
        """This module's driver as a job on the head (``python
        tests/cluster_utils.py MODE CFG``, with the repository as its working
        directory, as cluster/submit.sh ships it): (its status, its logs).
        ``mode``: ``drive`` (:func:`_drive`: a run that loses a node) or
        ``fedsim`` (:func:`_fedsim_in_turn`: command lines run in turn)."""
        job_id = f"fedsim-{mode}-{secrets.token_hex(4)}"
        cmd = [
            str(RAY),
            *("job", "submit", "--address", self.dashboard, "--submission-id", job_id),
            *("--working-dir", ".", "--runtime-env", "cluster/runtime_env.yaml"),
            "--",
            *("python", "tests/cluster_utils.py", mode, json.dumps(cfg).encode().hex()),
        ]
        root = Path(__file__).resolve().parent.parent
        subprocess.run(
            cmd, cwd=root, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        return self.job(job_id).get("status", "?"), self.job_logs(job_id)

    def fedsim_in_one_job(
        self, runs: dict[str, list[str]], timeout: float = 400
    ) -> tuple[str, dict]:
        """``fedsim run ARGS --quiet`` for each named run, in turn in one
        job's driver (:func:`_fedsim_in_turn`): runs that differ only in
        their settings share one submission and one driver start-up. The
        driver itself must succeed. Returns the job's logs and each run's
        exit code, by name. ``timeout``: seconds for the whole job."""
        argvs = [["run", *args, "--quiet"] for args in runs.values()]
        status, logs = self.drive("fedsim", argvs, timeout=timeout)
        assert status == "SUCCEEDED", logs[-6000:]
        codes = {}
        for name, argv in zip(runs, argvs, strict=True):
            end = f": fedsim {' '.join(argv)}"
            found = [ln.split(":")[0] for ln in logs.splitlines() if ln.endswith(end)]
            assert len(found) == 1, f"{name}: no exit line in\n{logs[-6000:]}"
            codes[name] = int(found[0].removeprefix("exit "))
        return logs, codes

    def state(self, what: str, **filters: str) -> list[dict]:
        """Rows of Ray's state API (``/api/v0/nodes``, ``.../actors``)."""
        query = "&".join(
            f"filter_keys={k}&filter_predicates=%3D&filter_values={v}"
            for k, v in filters.items()
        )
        code, text = self.http("GET", f"/api/v0/{what}?detail=1&limit=1000&{query}")
        if code != 200:
            raise RuntimeError(f"/api/v0/{what}: HTTP {code}: {text[:500]}")
        return json.loads(text)["data"]["result"]["result"]

    def alive_nodes(self) -> list[dict]:
        try:
            return [n for n in self.state("nodes") if n["state"] == "ALIVE"]
        except (OSError, RuntimeError, KeyError, ValueError):
            return []

    def pids(self) -> list[int]:
        """Every process this cluster started: those of its nodes' sessions
        or whose command line names its temporary directory."""
        import psutil

        sids = {n.proc.pid for n in self.nodes}
        marker = str(self.work)
        out = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                if p.pid == os.getpid():
                    continue
                cmd = " ".join(p.info["cmdline"] or [])
                if os.getsid(p.pid) in sids or marker in cmd:
                    out.append(p.pid)
            except (OSError, psutil.Error):
                continue
        return out

    def listening(self) -> list:
        """The addresses its processes listen on."""
        import psutil

        out = []
        for pid in self.pids():
            try:
                conns = psutil.Process(pid).net_connections(kind="inet")
            except psutil.Error:
                continue
            out += [c.laddr for c in conns if c.status == psutil.CONN_LISTEN]
        return out

    def log_tail(self, n: int = 40) -> str:
        parts = []
        for node in self.nodes:
            try:
                lines = node.log.read_text(errors="replace").splitlines()[-n:]
            except OSError:
                lines = ["(no log)"]
            parts.append(f"--- node {node.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def add_node(self, spec: NodeSpec, timeout_s: float = 150) -> Node:
        """Start one more worker node; return once the GCS lists it alive
        (see :func:`_start_worker`)."""
        return _start_worker(self, spec, timeout_s)

    def stop(self) -> None:
        """Worker nodes first, then the head: SIGTERM to each ``ray start
        --block``; then SIGKILL, by pid, whatever of the cluster is left."""
        for node in reversed(self.nodes):
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
        for node in reversed(self.nodes):
            try:
                node.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait(timeout=10)
        deadline = time.monotonic() + 15
        while (left := self.pids()) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def node_pids(node_dir: Path | str, sid: int) -> list[int]:
    """Every process of one node: its ``ray start`` session ``sid``, or a
    command line that names its temporary directory ``node_dir``."""
    import psutil

    marker = f"{node_dir}/"
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.pid == os.getpid():
                continue
            cmd = " ".join(p.info["cmdline"] or []) + " "
            if os.getsid(p.pid) == sid or marker in cmd or f"{node_dir} " in cmd:
                out.append(p.pid)
        except (OSError, psutil.Error):
            continue
    return out


def kill_node(node_dir: Path | str, sid: int) -> list[int]:
    """SIGKILL every process of one node (see :func:`node_pids`), as a
    machine that loses power would; the pids killed."""
    pids = node_pids(node_dir, sid)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return pids


def _join_on_loopback(argv: list[str]) -> None:
    """``ray start ARGV`` for a node that joins a cluster on 127.0.0.1.

    Ray binds its servers to loopback only when the node's IP is 127.0.0.1,
    and keeps that IP only with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (otherwise
    ``ray start`` swaps it for the machine's address); but with that variable
    at 0, ``ray start --address`` refuses to join ("Multi-node Ray clusters
    are not supported on Windows and OSX"). So this process keeps the
    variable at 0 for everything it starts and lifts only the join check, in
    itself. Test-only, tied to Ray 2.60's ``ray start``.
    """
    from ray._private import ray_constants, services
    from ray.scripts.scripts import main

    ray_constants.ENABLE_RAY_CLUSTER = True  # the join check
    services.resolve_ip_for_localhost = lambda host: host  # keep 127.0.0.1
    sys.argv = ["ray", "start", *argv]
    main()


def _start(name, args, env, work, cwd, join: bool = False) -> Node:
    node_dir = work / name
    node_dir.mkdir()
    log = work / f"{name}.log"
    nm, om, agent, agent_grpc, metrics, rt_env = free_ports(6)
    ray_start = [str(RAY), "start"]
    if join:
        ray_start = [sys.executable, str(Path(__file__).resolve()), "join"]
    cmd = [
        *ray_start,
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--node-manager-port={nm}",
        f"--object-manager-port={om}",
        f"--dashboard-agent-listen-port={agent}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--metrics-export-port={metrics}",
        f"--runtime-env-agent-port={rt_env}",
        f"--object-store-memory={200 * 1024 * 1024}",
        f"--temp-dir={node_dir}",
        "--disable-usage-stats",
        *args,
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own session: found and stopped by sid
        )
    return Node(name, proc, node_dir, log)


@contextmanager
def multinode_cluster(
    workers: Sequence[NodeSpec],
    head_env: Mapping[str, str] | None = None,
    timeout_s: float = 150,
) -> Iterator[Cluster]:
    """A head offering no CPUs (it runs the job drivers) and ``workers``,
    all on 127.0.0.1 with token authentication; stopped when the block ends.

    Yields once the head's job API answers and every worker node is alive.
    Node names must be short: Ray puts unix sockets under each node's
    temporary directory (a 108-byte limit).
    """
    work = Path(tempfile.mkdtemp(prefix="fsmn-", dir="/tmp"))
    token = secrets.token_hex(32)
    token_file = work / "auth_token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    env = base_env(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(token_file),
        # SIGTERM stops a node at once instead of draining for 30 s.
        RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",
    )
    gcs, dash, client = free_ports(3)
    cluster = Cluster(
        work, token, env, f"127.0.0.1:{gcs}", f"http://127.0.0.1:{dash}", []
    )
    try:
        head_args = [
            "--head",
            f"--port={gcs}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dash}",
            f"--ray-client-server-port={client}",
            "--num-cpus=0",  # no training on the head
            "--num-gpus=0",
        ]
        cluster.nodes.append(
            _start("h", head_args, {**env, **(head_env or {})}, work, work)
        )
        # One node at a time, each waited for: on busy cores, nodes started
        # together time out registering with the GCS ("Deadline Exceeded").
        _wait(cluster, timeout_s, lambda: _accepts(gcs), what="the GCS port")
        _wait(
            cluster,
            timeout_s,
            lambda: cluster.http("GET", "/api/jobs/")[0] == 200,
            what="the head's job API",
        )
        _wait(
            cluster,
            timeout_s,
            lambda: len(cluster.alive_nodes()) == 1,
            what="the head alive in the GCS",
        )
        for spec in workers:
            _start_worker(cluster, spec, timeout_s)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


def _worker_args(cluster: Cluster, spec: NodeSpec) -> list[str]:
    args = [
        f"--address={cluster.gcs}",
        f"--num-cpus={spec.num_cpus}",
        f"--num-gpus={spec.num_gpus}",
        # No log monitor on worker nodes (about 5 s of CPU each over a run of
        # the suite): it only copies the actors' stdout to the driver's
        # output; the tests read what the drivers print, and actors' errors
        # reach the driver through Ray's calls. The head keeps its own.
        "--include-log-monitor=false",
    ]
    if spec.resources:
        args.append(f"--resources={json.dumps(dict(spec.resources))}")
    return args


def _drive(cfg: dict) -> None:
    """A job's driver: ``run_scenario`` on the cluster, killing one worker
    node (:func:`kill_node`) just after round (or version) ``kill_at``, while
    the next one trains; then summary.json, as ``fedsim run`` writes it.

    The node killed is the first of ``cfg["candidates"]`` (name, node_dir,
    node_sid, node_id) that hosts one of this run's worker actors right then
    (the executor's own report says where they are), so the kill always
    hits the run whichever nodes Ray spread its workers on.

    ``cfg["kill"] == "server"``: the node killed is the one hosting the
    server actor (its own report), at once, before round ``kill_at``'s
    checkpoint; a run that stops prints the line ``fedsim run`` prints
    (with the resume command). ``cfg["resume"]``: continue ``out`` from its
    checkpoint, with ``cfg["resume_sets"]`` after ``sets`` (e.g. the server
    placed elsewhere), checked against the checkpoint's fingerprint as
    ``fedsim run --resume`` checks it."""
    import threading

    from fedsim import runtime
    from fedsim.checkpoint import check_fingerprint
    from fedsim.remote.ray_session import init_ray
    from fedsim.results import write_summary
    from fedsim.scenario import load_scenario
    from fedsim.tools.cli import _say_ending

    init_ray()
    resume = bool(cfg.get("resume"))
    sets = cfg["sets"] + (cfg.get("resume_sets", []) if resume else [])
    sc = load_scenario(cfg["scenario"], sets)
    out = Path(cfg["out"])
    out.mkdir(parents=True, exist_ok=True)
    if resume:
        check_fingerprint(out, sc)
    executors, servers = [], []
    place = runtime.place

    def recording_place(*args, **kwargs):
        placed = place(*args, **kwargs)
        executors.append(placed.executor)
        servers.append(placed.server)
        return placed

    runtime.place = recording_place

    def kill(victim: dict) -> None:
        pids = kill_node(victim["node_dir"], victim["node_sid"])
        print(
            f"killed node {victim['name']} ({victim['node_dir']}): "
            f"{len(pids)} processes",
            flush=True,
        )

    def on_round(row, _clients) -> None:
        print(f"round {row['round']}", flush=True)
        if row["round"] != cfg.get("kill_at"):
            return
        server = cfg.get("kill") == "server"
        if server:
            hosts = {servers[-1].report().get("node_id")}
        else:
            hosts = {
                hist[-1]["node_id"]
                for hist in executors[-1].report()["workers_nodes"]
                if hist
            }
        what = "the server" if server else "a worker"
        print(f"{what} on nodes {sorted(str(h)[:12] for h in hosts)}", flush=True)
        victims = [c for c in cfg["candidates"] if c["node_id"] in hosts]
        if not victims:
            print(f"no candidate node hosts {what}: nothing killed", flush=True)
        elif server:
            kill(victims[0])
        else:
            threading.Timer(0.02, kill, args=(victims[0],)).start()

    res = runtime.run_scenario(
        sc, workers=cfg["workers"], run_dir=out, on_round=on_round, resume=resume
    )
    write_summary(out / "summary.json", res.summary())
    print(f"status {res.status}", flush=True)
    if res.status != "completed":
        _say_ending(res, out)  # the line `fedsim run` ends with


def _fedsim_in_turn(argvs: list[list[str]]) -> None:
    """A job's driver: each ``fedsim`` command line of ``argvs`` in turn, in
    this one process, printing ``exit CODE: fedsim ARGS`` after each.

    Each command runs as the ``fedsim`` entry point runs it (its own exit
    code, its own output); the commands share this process's Python, torch
    and Ray start-up, which a job each would pay again, with its submission,
    its job supervisor and its upload (seconds of CPU a job on two cores).
    A command that fails does not stop the next one.

    The commands run in one warm pool (:func:`fedsim.remote.actors.warm_workers`):
    a run takes over the worker and server actors the run before it left,
    where their shapes match (``placement: spread``, the data shipped by the
    driver), instead of starting new processes (about 3.5 s of CPU each on
    a worker node: Python, Ray and torch). A run of another shape kills the
    parked actors first, so runs that can share go first in ``argvs``."""
    from fedsim.remote.actors import warm_workers
    from fedsim.tools.cli import main

    with warm_workers():
        for argv in argvs:
            sys.argv = ["fedsim", *argv]
            try:
                main()
                code = 0
            except SystemExit as exc:  # typer's exit, with the command's code
                code = (
                    exc.code if isinstance(exc.code, int) else int(exc.code is not None)
                )
            print(f"exit {code}: fedsim {' '.join(argv)}", flush=True)


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _start_worker(
    cluster: Cluster, spec: NodeSpec, timeout_s: float, tries: int = 2
) -> Node:
    """Start worker node ``spec`` and wait until the GCS lists exactly one
    more alive node than before (counted by index: node ``i`` of the cluster
    makes ``i + 1`` alive) and the head's job API still answers. A ``ray
    start`` that exits before registering (on busy cores: "Deadline
    Exceeded" from the GCS) is stopped, by pid, and started once more."""
    expected = len([n for n in cluster.nodes if n.proc.poll() is None]) + 1
    for attempt in range(1, tries + 1):
        name = spec.name if attempt == 1 else f"{spec.name}{attempt}"
        node = _start(
            name,
            _worker_args(cluster, spec),
            {**cluster.env, **spec.env},
            cluster.work,
            cluster.work,
            join=True,
        )
        node.name = spec.name
        cluster.nodes.append(node)
        try:
            _wait(
                cluster,
                timeout_s,
                lambda: (
                    len(cluster.alive_nodes()) == expected
                    and cluster.http("GET", "/api/jobs/")[0] == 200
                ),
                watch=[node],
                what=f"node {spec.name} alive in the GCS ({expected} nodes)",
            )
            return node
        except RuntimeError:
            if attempt == tries or node.proc.poll() is None:
                raise
            # it gave up registering: leave no process of it, try again
            cluster.nodes.remove(node)
            kill_node(node.dir, node.proc.pid)
    raise AssertionError("unreachable")


def _wait(cluster: Cluster, timeout_s: float, ready, watch=None, what="") -> None:
    """Until ``ready()``; fail if a node of ``watch`` (default: all) exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        for node in cluster.nodes if watch is None else watch:
            if node.proc.poll() is not None:
                raise RuntimeError(
                    f"ray start of node {node.name} exited "
                    f"({node.proc.returncode}) while waiting for {what}:\n"
                    f"{cluster.log_tail()}"
                )
        try:
            if ready():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the cluster did not come up: no {what} after {timeout_s:.0f}s:\n"
                f"{cluster.log_tail()}"
            )
        time.sleep(0.5)


if __name__ == "__main__" and sys.argv[1:2] == ["join"]:
    _join_on_loopback(sys.argv[2:])
if __name__ == "__main__" and sys.argv[1:2] == ["drive"]:
    _drive(json.loads(bytes.fromhex(sys.argv[2])))
if __name__ == "__main__" and sys.argv[1:2] == ["fedsim"]:
    _fedsim_in_turn(json.loads(bytes.fromhex(sys.argv[2])))
