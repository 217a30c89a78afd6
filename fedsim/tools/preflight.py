"""Checks that a valid scenario can run, before any data is built or Ray started.

Each raises :class:`fedsim.scenario.ScenarioError` in one line naming the file
(or option) and the field (docs/scenarios.md, "Checks before a run"). No torch
or Ray here (``fedsim validate`` stays fast): parameters are counted by formula.

Why before: a model that cannot read the samples, a float float32 rounds to
infinity, availability sessions that would take millions of steps or a run that
cannot fit in memory would otherwise fail minutes into building data or
training, with a traceback instead of the field to change. What the checks
know of the data comes from the dataset itself (:func:`data_info`), of the
model from the model (``data_problem``, ``param_count``: built-in networks
answer as plug-ins do), of the algorithm's memory from ``Algorithm.memory``;
nothing here is specific to one dataset or network.

Only :func:`preflight` reads the loaded scenario; each check receives the
run's :class:`~fedsim.facts.RunFacts` (what plug-ins see too), the algorithm
or the ``resources`` section it is about.

Example:
    >>> from fedsim.scenario import load_scenario
    >>> sc = load_scenario("scenarios/quickstart.yaml")
    >>> preflight(sc, "scenarios/quickstart.yaml", available_bytes=2**33).params
    610
    >>> check_ray_resources(sc.resources, workers=2, cluster={"CPU": 2.0})
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from fedsim.data.base import DataInfo, DatasetSpec
from fedsim.facts import RunFacts
from fedsim.spec import Model, ResourceSpec, ServerHomeSpec

if TYPE_CHECKING:
    from fedsim.algorithms.base import Algorithm
    from fedsim.scenario import Scenario, ScenarioError

__all__ = [
    "DataInfo",
    "MemoryEstimate",
    "count_params",
    "data_info",
    "preflight",
]

FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38  # smallest normal float32


def _error(message: str) -> ScenarioError:
    """The error every check raises (the CLI prints it as one line)."""
    # imported here: fedsim.scenario pulls in every plug-in (and torch)
    from fedsim.scenario import ScenarioError

    return ScenarioError(message)


def data_info(data: DatasetSpec, num_clients: int) -> DataInfo:
    """The dataset's sample kind, shape, classes and size, from its spec alone.

    Each dataset states its own (``DatasetSpec.info``; no tensor built, at most a
    file header read); one that cannot tell yields a vector of unknown shape, for
    which the checks that need a shape are skipped.

    Args:
        data: the ``data`` section.
        num_clients: the fleet's size.
    """
    stated = data.info(num_clients)
    return stated if stated is not None else DataInfo("vector", None, None, None)


def check_model_data(facts: RunFacts, source: str = "<scenario>") -> None:
    """Refuse a model that cannot read the dataset's samples, as the model
    says (``Model.data_problem``: the built-in networks answer as a plug-in
    does), and one whose formula finds the images too small.

    Args:
        facts: the run (its model and data sections).
        source: Its file (or option), named in the message.

    Raises:
        ScenarioError: e.g. an LSTM on non-sequences, an image network on
            sequences, on vectors that are no square image or on images
            smaller than its convolutions and poolings shrink to nothing, a
            classifier on an objective.
    """
    info = data_info(facts.data, facts.num_clients)
    why = facts.model.data_problem(info)
    if why is None:
        count_params(facts.model, info)  # raises for an image too small
        return
    raise _error(
        f"{source}: model.name {facts.model.name!r} does not fit data.dataset "
        f"{facts.dataset!r}: {why}"
    )


def count_params(spec: Model, info: DataInfo) -> int | None:
    """Trainable parameters of a model on the data ``info`` describes, by the
    model's own formula (checked against the real networks by
    tests/test_cli_startup.py); None where only the data tells.

    Args:
        spec: the ``model`` section.
        info: what the dataset states of its samples.

    Raises:
        ScenarioError: the images are too small for the network.

    >>> from fedsim.scenario import load_scenario
    >>> facts = load_scenario("scenarios/quickstart.yaml").facts
    >>> count_params(facts.model, data_info(facts.data, 30))   # 60 x 10 + 10
    610
    """
    if info.shape is None or info.classes is None:
        return None
    try:
        return spec.param_count(info.shape, info.classes)
    except ValueError as exc:  # an image too small for the network
        raise _error(str(exc)) from None


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """A lower estimate of a run's memory: bytes by part (``model``, ``algorithm``,
    ``data``), and the model's parameter count (0 when unknown)."""

    params: int
    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())


# Model-sized vectors alive at once (docs/scenarios.md, "Checks before a run")
_SERVER_COPIES = 3
_WORKER_COPIES = 4


def estimate_memory(
    facts: RunFacts, algorithm: Algorithm, workers: int | None = None
) -> MemoryEstimate:
    """What the run needs at least (activations and Ray left out): a lower
    estimate, so that the memory check errs towards letting a run start.

    Args:
        facts: the run (model, data, fleet size).
        algorithm: the run's algorithm (what it keeps: ``memory``).
        workers: The worker processes, each holding its own model copies.
    """
    info = data_info(facts.data, facts.num_clients)
    params = count_params(facts.model, info) or 0
    elem = facts.elem_bytes
    n_workers = max(1, workers or 1)
    parts = {"model": params * elem * (_SERVER_COPIES + _WORKER_COPIES * n_workers)}
    if (kept := algorithm.memory(facts, params, info)) is not None:
        parts["algorithm"] = kept[0]
    if info.samples is not None and info.sample_bytes is not None:
        parts["data"] = info.samples * (info.sample_bytes + 8)
    return MemoryEstimate(params=params, parts=parts)


def mem_available(meminfo: str | Path = "/proc/meminfo") -> int | None:
    """``MemAvailable`` in bytes, or None where the file does not tell."""
    try:
        lines = Path(meminfo).read_text().splitlines()
        fields = next(x for x in lines if x.startswith("MemAvailable:")).split()
        return int(fields[1]) * (1024 if fields[-1].lower() == "kb" else 1)
    except (OSError, StopIteration, IndexError, ValueError):
        return None


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**27 else f"{n / 2**20:.1f} MiB"


def check_memory(
    facts: RunFacts,
    algorithm: Algorithm,
    source: str = "<scenario>",
    workers: int | None = None,
    available_bytes: int | None = None,
) -> MemoryEstimate:
    """Refuse a run whose estimated memory exceeds ``available_bytes`` (default:
    MemAvailable; no check where unknown). Returns the estimate.

    Args:
        facts: the run.
        algorithm: the run's algorithm.
        source: the scenario's file (or option), named in the message.
        workers: the worker processes (each holds model copies).
        available_bytes: the memory to fit in (None: MemAvailable).
    """
    est = estimate_memory(facts, algorithm, workers)
    avail = available_bytes if available_bytes is not None else mem_available()
    if avail is None or est.total <= avail:
        return est
    part, size = max(est.parts.items(), key=lambda kv: kv[1])
    if part == "algorithm":  # the algorithm names what it keeps
        info = data_info(facts.data, facts.num_clients)
        kept = algorithm.memory(facts, est.params, info)
        what = kept[1] if kept is not None else f"algorithm {algorithm.name!r}"
    elif part == "model":
        what = f"model.name {facts.model.name!r} has {est.params:,} parameters"
    else:
        what = f"data.dataset {facts.dataset!r}"
    raise _error(
        f"{source}: needs at least {_gib(est.total)} of memory but "
        f"{_gib(avail)} is available; the largest part: {what} ({_gib(size)})"
    )


def _floats(obj: object, path: str) -> list[tuple[str, float]]:
    if isinstance(obj, dict):
        return [kv for k, v in obj.items() for kv in _floats(v, f"{path}.{k}")]
    if isinstance(obj, list | tuple):
        return [kv for i, v in enumerate(obj) for kv in _floats(v, f"{path}[{i}]")]
    if isinstance(obj, float):
        return [(path, obj)]
    return []


def check_numeric_ranges(
    facts: RunFacts, algorithm: Algorithm, source: str = "<scenario>"
) -> None:
    """Refuse a ``client``, ``algorithm`` or trained ``data`` float that float32
    training cannot represent (simulated time is float64, not checked).

    Args:
        facts: the run (``client``, ``data`` and the model's dtype).
        algorithm: the ``algorithm`` section.
        source: the scenario's file (or option), named in the message.
    """
    if facts.model.dtype != "float32":
        return
    # a dataset whose fields are training values (quadratic) is checked too
    sections: list[tuple[str, object]] = [
        ("client", facts.client),
        ("algorithm", algorithm),
    ]
    if facts.data.float32_fields:
        sections.append(("data", facts.data))
    for section, spec in sections:
        for path, v in _floats(_dump(spec), section):
            if abs(v) > FLOAT32_MAX:
                raise _error(
                    f"{source}: {path}: {v:g} is too large for float32 training "
                    f"(the largest float32 is {FLOAT32_MAX:.4g})"
                )
            if v != 0 and abs(v) < FLOAT32_TINY:
                raise _error(
                    f"{source}: {path}: {v:g} is too small for float32 training "
                    f"(the smallest normal float32 is {FLOAT32_TINY:.4g}); use 0 "
                    "or a larger value"
                )


MAX_FLIPS = 1e6  # per device and run (docs/scenarios.md, "Checks before a run")


def check_availability(facts: RunFacts, source: str = "<scenario>") -> None:
    """Refuse availability sessions too short for the run's length (rounds x
    window or deadline; unchecked where unknown): each flip is a step.

    Args:
        facts: the run (round policy, rounds, fleet groups).
        source: the scenario's file (or option), named in the message.
    """
    rnd = facts.round
    if rnd.policy == "fixed_window":
        per_round, what = rnd.window_s, "round.window_s"
    elif rnd.policy == "fixed_epochs" and rnd.deadline_s is not None:
        per_round, what = rnd.deadline_s, "round.deadline_s"
    else:
        return
    horizon = facts.rounds * per_round
    for i, g in enumerate(facts.fleet.groups):
        a = g.availability
        if a.kind == "on_off":
            cycle, fields = a.mean_on_s + a.mean_off_s, "mean_on_s + mean_off_s"
        elif a.kind == "daily":
            cycle, fields = a.mean_on_s, "mean_on_s"
        else:
            continue
        if (flips := 2 * horizon / cycle) > MAX_FLIPS:
            raise _error(
                f"{source}: fleet.groups[{i}].availability: sessions of "
                f"{fields} = {cycle:g} s flip each device about {flips:.2g} "
                f"times in {facts.rounds} rounds x {what} = {per_round:g} s; "
                f"fedsim steps through every flip (at most {MAX_FLIPS:.0e}): "
                f"use sessions of at least {2 * horizon / MAX_FLIPS:.3g} s or "
                "a shorter run"
            )


# Speeds a fleet may draw, in its unit (steps/s or FLOP/s): times are work /
# speed in float64, and a speed near a float's range (or a drawn inf) turns
# them into inf, 0 or NaN in the clock. A draw is taken as within
# SPEED_SIGMAS standard deviations of its median: further out is a chance of
# about 1e-15 a device.
SPEED_RANGE = (1e-100, 1e100)
SPEED_SIGMAS = 8.0


def check_speeds(facts: RunFacts, source: str = "<scenario>") -> None:
    """Refuse a group whose speeds (median times exp(+-8 sigma), for each
    tier) leave :data:`SPEED_RANGE`: a FLOP/s speed of 1e308 with sigma 3
    overflowed in the clock.

    Args:
        facts: the run (its fleet groups).
        source: the scenario's file (or option), named in the message.
    """
    low, high = (math.log(b) for b in SPEED_RANGE)
    for i, g in enumerate(facts.fleet.groups):
        if g.speed is None:
            continue
        for median, sigma in g.speed.laws():
            reach = SPEED_SIGMAS * sigma
            if math.log(median) + reach > high or math.log(median) - reach < low:
                raise _error(
                    f"{source}: fleet.groups[{i}].speed: a median of {median:g} "
                    f"with sigma {sigma:g} draws speeds out to {median:g} x "
                    f"exp(+-{reach:g}), beyond {SPEED_RANGE[0]:g} to "
                    f"{SPEED_RANGE[1]:g} that simulated time can be counted in; "
                    "use a median or sigma nearer the devices'"
                )


def _dump(spec: object) -> dict[str, object]:
    """A section's fields: a pydantic model's, or a plug-in dataclass's."""
    if dataclasses.is_dataclass(spec):
        return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    assert isinstance(spec, BaseModel)  # every other section is a pydantic spec
    return spec.model_dump(mode="python")


def preflight(
    scenario: Scenario, source: str = "<scenario>", **memory: int | None
) -> MemoryEstimate:
    """Every check that needs no cluster; call after loading, before building data.

    The one function here that reads the loaded scenario: it hands each
    check the run's facts and the part it is about.

    Args:
        scenario: the loaded scenario.
        source: its file (or option), named in messages.
        memory: ``workers`` and ``available_bytes``, as :func:`check_memory` takes.

    Raises:
        ScenarioError: one line, naming ``source`` and the field.
    """
    facts = scenario.facts
    check_model_data(facts, source)
    check_numeric_ranges(facts, scenario.algorithm, source)
    check_availability(facts, source)
    check_speeds(facts, source)
    return check_memory(facts, scenario.algorithm, source, **memory)


def check_ray_resources(
    res: ResourceSpec, workers: int, cluster: dict[str, float]
) -> None:
    """Refuse a worker layout the Ray cluster cannot place: the workers, and
    with ``resources.server.home: actor`` the server actor besides them.

    The check is on the cluster's totals; whether one node has room for the
    server's CPUs, GPUs and custom resources together is Ray's to find out
    when it places the actor (``resources.placement_timeout_s``).

    Args:
        res: the scenario's ``resources`` section.
        workers: the worker count the run will start; 0 runs without Ray.
        cluster: ``ray.cluster_resources()``, e.g. ``{"CPU": 2.0, "GPU": 1.0}``.

    Raises:
        ScenarioError: naming the option or field and what the cluster has.
    """
    if workers <= 0:
        return
    server = res.server if res.server.home == "actor" else None
    cpus, gpus = float(cluster.get("CPU", 0.0)), float(cluster.get("GPU", 0.0))
    opt = f"{'resources.workers' if res.workers == workers else '--workers'} {workers}"
    # what the server actor takes of each unit (0 in the driver's home)
    server_cpus = server.cpus if server else 0.0
    server_gpus = server.gpus if server else 0.0
    room = max(0.0, cpus - server_cpus)
    most = f" (at most {int(room // res.cpus_per_worker)} workers)"
    cpus_has = f"{cpus:g} CPUs; lower it"
    gpus_has = f"{gpus:g} GPUs" if gpus else "no GPU; set it to 0"
    # (unit, per worker, the server's, the cluster's, what it has, a hint)
    limits = [
        ("cpu", res.cpus_per_worker, server_cpus, cpus, cpus_has, most),
        ("gpu", res.gpus_per_worker, server_gpus, gpus, gpus_has, ""),
    ]
    for unit, per, _, total, has, _ in limits:
        if per > total:
            raise _error(
                f"resources.{unit}s_per_worker {per:g}: the Ray cluster has {has}"
            )
    if server is not None:
        _check_server_alone(server, cluster)
    for unit, per, own, total, _, hint in limits:
        if (need := workers * per + own) <= total + 1e-9:
            continue
        if not own:  # the server takes none of it (or runs in the driver)
            raise _error(
                f"{opt} x resources.{unit}s_per_worker {per:g} needs {need:g} "
                f"{unit.upper()}s; the Ray cluster has {total:g}{hint}"
            )
        raise _error(
            f"{opt} x resources.{unit}s_per_worker {per:g} + the server actor's "
            f"resources.server.{unit}s {own:g} need {need:g} {unit.upper()}s; the "
            f"Ray cluster has {total:g}{hint}; lower resources.server.{unit}s "
            "(0 shares the workers'), or run the server in the driver "
            "(resources.server.home: driver)"
        )


def _check_server_alone(server: ServerHomeSpec, cluster: dict[str, float]) -> None:
    """Refuse a server actor that asks for more of one resource than the
    whole cluster has (``resources.server`` of :func:`check_ray_resources`)."""
    asked = {"cpus": ("CPU", server.cpus), "gpus": ("GPU", server.gpus)}
    asked |= {f"resources.{k}": (k, v) for k, v in server.resources.items()}
    for field, (name, want) in asked.items():
        have = float(cluster.get(name, 0.0))
        if want > have + 1e-9:
            has = f"{have:g} {name}" if have else f"no {name}"
            raise _error(
                f"resources.server.{field} {want:g}: the Ray cluster has {has} "
                "for the server actor (resources.server.home: actor)"
            )


_RAY_CURRENT = Path("/tmp/ray/ray_current_cluster")
_CLIENT_PORT = 10001  # Ray Client's default
_GCS_PORT = 6379


def _split_host_port(text: str, default_port: int, what: str) -> tuple[str, int]:
    """(host, port) of ``host[:port]`` or ``[ipv6][:port]``; ``what`` names the
    option in the error."""
    text = text.strip().rstrip("/")
    if text.startswith("["):  # [::1]:6379
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    if not host:
        raise _error(f"{what}: no host in {text!r}")
    if port_text and not (port_text.isdigit() and 0 < int(port_text) < 65536):
        raise _error(f"{what}: bad port {port_text!r} (expected 1..65535)")
    return host, int(port_text) if port_text else default_port


def resolve_address(address: str, what: str = "--address") -> str:
    """The Ray address to connect to: ``address`` itself, or for ``auto``
    ``$RAY_ADDRESS``, else the one ``ray start`` wrote.

    Args:
        address: The option's value.
        what: The option, named in the error.

    Raises:
        ScenarioError: ``auto`` and no running cluster is found.
    """
    if address.strip() != "auto":
        return address.strip()
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env and env != "auto":
        return env
    try:
        found = _RAY_CURRENT.read_text(errors="replace").strip()
    except OSError:
        found = ""
    if not found:
        raise _error(
            f"{what} auto: no running Ray cluster found (RAY_ADDRESS is not set "
            f"and {_RAY_CURRENT} does not exist); start one with `ray start "
            "--head` or give its address"
        )
    return found.splitlines()[0].strip()


def check_address(address: str, timeout_s: float = 5.0) -> None:
    """Refuse a Ray address nothing answers on, by a TCP connect.

    ``host[:6379]``, ``ray://host[:10001]`` or ``auto``; ``local`` and ``""``
    start a new cluster, so are not checked.

    Raises:
        ScenarioError: one line naming the address and why it failed.
    """
    what = f"--address {address}"
    if address.strip() in ("", "local"):
        return
    resolved = resolve_address(address, what)
    text, port = resolved, _GCS_PORT
    if "://" in resolved:
        scheme, _, text = resolved.partition("://")
        if scheme != "ray":
            raise _error(f"{what}: unknown scheme {scheme!r} (expected ray://)")
        port = _CLIENT_PORT
    host, port = _split_host_port(text, port, what)
    via = f" (from {address})" if resolved != address.strip() else ""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except TimeoutError:
        raise _error(
            f"{what}: no answer from {host}:{port}{via} within {timeout_s:g} s; "
            "is the Ray head running and the port open?"
        ) from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise _error(
            f"{what}: cannot reach {host}:{port}{via} ({reason}); is the Ray "
            "head running?"
        ) from None
