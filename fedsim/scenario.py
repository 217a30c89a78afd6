"""Scenario files: the typed, frozen, validated description of one experiment.

This is the only module that parses files. A scenario is YAML read with the
safe loader, then validated by pydantic models that reject unknown keys, so a
typo is an error and not a silently ignored setting.

Example:
    >>> from fedsim.scenario import load_scenario
    >>> sc = load_scenario("scenarios/quickstart.yaml", overrides=["rounds=3"])
    >>> sc.rounds
    3

Errors are raised as :class:`ScenarioError`, whose message names the file, the
field path (``fleet.groups[1].speed.sigma``) and what was expected.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

__all__ = [
    "Scenario",
    "ScenarioError",
    "load_scenario",
    "parse_scenario",
    "apply_overrides",
    "dump_scenario",
]

MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_NESTING = 64


class ScenarioError(ValueError):
    """An invalid scenario: the message is meant for the user, as is."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Prob = Annotated[float, Field(ge=0, le=1)]


# --------------------------------------------------------------------------- model
class ModelSpec(_Spec):
    """Which network to train. ``hidden`` is used by ``mlp`` only."""

    name: Literal["logreg", "mlp", "quadratic"] = "logreg"
    hidden: list[Annotated[int, Field(ge=1, le=65536)]] = [200, 200]
    dtype: Literal["float32", "float64"] = "float32"


# ---------------------------------------------------------------------------- data
class SyntheticData(_Spec):
    """Synthetic(alpha, beta) of the FedProx/LEAF generator (ALGORITHMS.md 2.1).

    ``alpha`` and ``beta`` are standard deviations, as in NumPy's ``scale``.
    ``clients`` defaults to the number of devices in the fleet.
    """

    dataset: Literal["synthetic"]
    alpha: NonNegFloat = 1.0
    beta: NonNegFloat = 1.0
    iid: bool = False
    clients: Annotated[int, Field(ge=1, le=10_000_000)] | None = None
    features: Annotated[int, Field(ge=1, le=100_000)] = 60
    classes: Annotated[int, Field(ge=2, le=10_000)] = 10
    test_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.1
    size_mean: float = Field(4.0, ge=-10, le=10)
    size_sigma: float = Field(2.0, ge=0, le=5)
    min_samples: Annotated[int, Field(ge=1, le=1_000_000)] = 50
    max_samples: Annotated[int, Field(ge=1, le=1_000_000)] = 10_000


class QuadraticData(_Spec):
    """The FedNova paper's quadratic objectives (ALGORITHMS.md section 6).

    Client i minimises F_i(x) = h_i/2 ||x - e_i||^2 with deterministic
    gradients. ``centers`` are the e_i (scalars, or vectors of length
    ``dim``), ``weights`` the p_i (normalised; equal when omitted) and
    ``curvatures`` the h_i (1 when omitted).
    """

    dataset: Literal["quadratic"]
    centers: list[float | list[float]] = Field(min_length=1)
    weights: list[PosFloat] | None = None
    curvatures: list[PosFloat] | None = None
    x0: float = 0.0

    @model_validator(mode="after")
    def _lengths(self) -> QuadraticData:
        m = len(self.centers)
        for name in ("weights", "curvatures"):
            value = getattr(self, name)
            if value is not None and len(value) != m:
                raise ValueError(
                    f"{name} has {len(value)} entries but centers has {m}; "
                    "give one per client"
                )
        dims = {1 if isinstance(c, float | int) else len(c) for c in self.centers}
        if len(dims) != 1 or 0 in dims:
            raise ValueError("centers must all have the same (non-zero) length")
        return self

    @property
    def clients(self) -> int:
        return len(self.centers)

    @property
    def dim(self) -> int:
        c = self.centers[0]
        return 1 if isinstance(c, float | int) else len(c)


DataSpec = Annotated[SyntheticData | QuadraticData, Field(discriminator="dataset")]


# -------------------------------------------------------------------------- client
class ClientSpec(_Spec):
    """Local training. ``solver`` is the local optimizer (ALGORITHMS.md 5.2).

    - ``sgd``: x <- x - lr * g
    - ``momentum``: u <- momentum * u + g; x <- x - lr * u (buffer reset each round)
    - ``prox``: x <- x - lr * (g + mu * (x - x_global))
    """

    solver: Literal["sgd", "momentum", "prox"] = "sgd"
    lr: PosFloat = 0.01
    batch_size: Annotated[int, Field(ge=1, le=1_000_000)] = 20
    momentum: float = Field(0.9, ge=0, lt=1)
    mu: NonNegFloat = 0.0
    weight_decay: NonNegFloat = 0.0

    @model_validator(mode="after")
    def _prox_needs_mu(self) -> ClientSpec:
        if self.solver == "prox" and self.mu == 0:
            raise ValueError("solver 'prox' needs mu > 0 (mu = 0 is plain sgd)")
        return self


# --------------------------------------------------------------------------- fleet
class SpeedSpec(_Spec):
    """Compute speed in local steps per simulated second.

    ``fixed`` uses ``steps_per_s`` for every device; ``lognormal`` draws each
    device's speed once as median * exp(sigma * N(0, 1)).
    """

    dist: Literal["fixed", "lognormal"] = "fixed"
    steps_per_s: PosFloat | None = None
    median_steps_per_s: PosFloat | None = None
    sigma: NonNegFloat = 0.0

    @model_validator(mode="after")
    def _one_speed(self) -> SpeedSpec:
        if self.dist == "fixed" and self.steps_per_s is None:
            raise ValueError("dist 'fixed' needs steps_per_s")
        if self.dist == "lognormal" and self.median_steps_per_s is None:
            raise ValueError("dist 'lognormal' needs median_steps_per_s")
        if self.sigma > 5:
            raise ValueError("sigma above 5 gives speeds spanning 10^4x; check units")
        return self

    @property
    def median(self) -> float:
        assert self.steps_per_s is not None or self.median_steps_per_s is not None
        return float(self.steps_per_s or self.median_steps_per_s)  # type: ignore[arg-type]


class NetworkSpec(_Spec):
    """Link of a device: time to send B bytes = 8 B / (mbps * 1e6) + latency_s."""

    down_mbps: PosFloat = 100.0
    up_mbps: PosFloat = 100.0
    latency_s: NonNegFloat = 0.0


class SlowdownSpec(_Spec):
    """Distribution of a straggler's slowdown factor (>= 1; speed is divided by it).

    ``fixed``: ``factor``; ``uniform``: U(low, high); ``pareto``: 1 + Pareto(shape),
    i.e. heavy-tailed with minimum 1.
    """

    dist: Literal["fixed", "uniform", "pareto"] = "fixed"
    factor: Annotated[float, Field(ge=1)] = 4.0
    low: Annotated[float, Field(ge=1)] = 2.0
    high: Annotated[float, Field(ge=1)] = 10.0
    shape: PosFloat = 2.0

    @model_validator(mode="after")
    def _range(self) -> SlowdownSpec:
        if self.dist == "uniform" and self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self


class StragglerSpec(_Spec):
    """Each round, each selected device is slowed with probability ``p``."""

    p: Prob = 0.0
    slowdown: SlowdownSpec = SlowdownSpec()


class AvailabilitySpec(_Spec):
    """When a device is online: ``always``, or an alternating on/off process with
    exponentially distributed durations of means ``mean_on_s`` and ``mean_off_s``.
    A device that goes offline mid-round drops out of the round."""

    kind: Literal["always", "on_off"] = "always"
    mean_on_s: PosFloat = 3600.0
    mean_off_s: PosFloat = 1800.0


class DeviceGroup(_Spec):
    name: str = Field(min_length=1, max_length=200)
    count: Annotated[int, Field(ge=1, le=10_000_000)]
    speed: SpeedSpec
    network: NetworkSpec = NetworkSpec()
    stragglers: StragglerSpec = StragglerSpec()
    availability: AvailabilitySpec = AvailabilitySpec()


class FleetSpec(_Spec):
    groups: list[DeviceGroup] = Field(min_length=1, max_length=10_000)

    @property
    def size(self) -> int:
        return sum(g.count for g in self.groups)

    @model_validator(mode="after")
    def _unique_names(self) -> FleetSpec:
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ValueError(f"group names must be unique, got {names}")
        if self.size > 10_000_000:
            raise ValueError(f"fleet has {self.size} devices; the limit is 10,000,000")
        return self


# --------------------------------------------------------------------------- round
class RoundSpec(_Spec):
    """How tau_i(t) arises (see docs/architecture.md, "Round policies").

    ``fixed_window``: the round lasts ``window_s``; a device computes in the
    time left after download and upload, tau = floor(time * speed) clipped to
    [0, max_steps]. ``fixed_epochs``: tau = floor(E_i * n_i / B) with E_i =
    ``epochs`` or drawn uniformly from ``[epochs_low, epochs_high]`` each
    round; the round ends when the slowest device arrives or at
    ``deadline_s`` (later arrivals are dropped).
    """

    policy: Literal["fixed_window", "fixed_epochs"] = "fixed_window"
    window_s: PosFloat = 10.0
    max_steps: Annotated[int, Field(ge=1, le=10_000_000)] = 100
    epochs: Annotated[int, Field(ge=1, le=100_000)] | None = 1
    epochs_low: Annotated[int, Field(ge=1, le=100_000)] | None = None
    epochs_high: Annotated[int, Field(ge=1, le=100_000)] | None = None
    deadline_s: PosFloat | None = None

    @model_validator(mode="after")
    def _epochs(self) -> RoundSpec:
        lo, hi = self.epochs_low, self.epochs_high
        if (lo is None) != (hi is None):
            raise ValueError("give both epochs_low and epochs_high, or neither")
        if lo is not None and hi is not None and hi < lo:
            raise ValueError(f"epochs_high ({hi}) must be >= epochs_low ({lo})")
        return self


# ----------------------------------------------------------------------- algorithm
class FedAvgSpec(_Spec):
    """FedAvg: x <- x + server_lr * sum_i p_i Delta_i over the round's updates."""

    name: Literal["fedavg"]
    server_lr: PosFloat = 1.0


class FedProxSpec(_Spec):
    """FedProx: FedAvg with the proximal local solver (penalty mu/2 ||x - x_t||^2)."""

    name: Literal["fedprox"]
    mu: PosFloat = 0.01
    server_lr: PosFloat = 1.0


class FedNovaSpec(_Spec):
    """FedNova: x <- x + server_lr * tau_eff * sum_i p_i Delta_i / ||a_i||_1.

    ``tau_eff``: ``fedavg`` (sum p_i ||a_i||_1, the default), ``steps``
    (sum p_i tau_i, recommended with a proximal solver), or ``fixed``
    (``tau_eff_value``).
    """

    name: Literal["fednova"]
    tau_eff: Literal["fedavg", "steps", "fixed"] = "fedavg"
    tau_eff_value: PosFloat | None = None
    server_lr: PosFloat = 1.0

    @model_validator(mode="after")
    def _fixed_value(self) -> FedNovaSpec:
        if self.tau_eff == "fixed" and self.tau_eff_value is None:
            raise ValueError("tau_eff 'fixed' needs tau_eff_value")
        return self


AlgorithmSpec = Annotated[
    FedAvgSpec | FedProxSpec | FedNovaSpec, Field(discriminator="name")
]


# ------------------------------------------------------------------------ selector
class SelectorSpec(_Spec):
    """Who trains each round. ``uniform``: uniformly without replacement among
    the devices online at the round's start."""

    name: Literal["uniform"] = "uniform"
    clients_per_round: Annotated[int, Field(ge=1, le=10_000_000)] = 10


class EvalSpec(_Spec):
    every_rounds: Annotated[int, Field(ge=1)] = 1
    batch_size: Annotated[int, Field(ge=1)] = 4096


class ResourceSpec(_Spec):
    """Ray resources. ``workers``: a count, or ``auto`` (one per available CPU,
    divided by ``cpus_per_worker``). ``workers: 0`` trains in the driver
    process without Ray (useful for debugging)."""

    workers: Literal["auto"] | Annotated[int, Field(ge=0, le=4096)] = "auto"
    cpus_per_worker: Annotated[float, Field(gt=0, le=1024)] = 1.0
    gpus_per_worker: Annotated[float, Field(ge=0, le=64)] = 0.0


class Scenario(_Spec):
    """One experiment. Every field is documented in docs/scenarios.md."""

    name: str = Field(min_length=1, max_length=200)
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0
    rounds: Annotated[int, Field(ge=1, le=10_000_000)]
    model: ModelSpec = ModelSpec()
    data: DataSpec
    client: ClientSpec = ClientSpec()
    fleet: FleetSpec
    round: RoundSpec = RoundSpec()
    algorithm: AlgorithmSpec
    selector: SelectorSpec = SelectorSpec()
    eval: EvalSpec = EvalSpec()
    resources: ResourceSpec = ResourceSpec()

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]*", v):
            raise ValueError(
                "use letters, digits, '-', '_' and '.' only (it names the run folder)"
            )
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        n_dev = self.fleet.size
        n_clients = self.data.clients
        if n_clients is not None and n_clients != n_dev:
            raise ValueError(
                f"data has {n_clients} clients but the fleet has {n_dev} devices; "
                "each device is one client, so they must match "
                "(or leave data.clients out)"
            )
        if self.selector.clients_per_round > n_dev:
            raise ValueError(
                f"selector.clients_per_round is {self.selector.clients_per_round} "
                f"but the fleet has only {n_dev} devices"
            )
        if (self.data.dataset == "quadratic") != (self.model.name == "quadratic"):
            raise ValueError(
                "model.name 'quadratic' goes with data.dataset 'quadratic' "
                "(and only with it)"
            )
        return self

    @property
    def num_clients(self) -> int:
        return self.fleet.size


# ------------------------------------------------------------------------- loading
def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            # pydantic puts the chosen union member's tag in the path; drop it
            if part in _TAGS:
                continue
            out += ("." if out else "") + str(part)
    return out or "(top level)"


_TAGS = {"synthetic", "quadratic", "fedavg", "fedprox", "fednova"}


def _format_validation(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors(include_url=False):
        loc = _format_loc(tuple(e["loc"]))
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see docs/scenarios.md)"
        elif e["type"] == "missing":
            msg = "required field is missing"
        elif e["type"] == "union_tag_invalid":
            msg = f"unknown choice: {msg}"
        got = e.get("input")
        shown = ""
        if e["type"] not in ("missing", "extra_forbidden") and not isinstance(
            got, dict | list
        ):
            text = repr(got)
            shown = f" (got {text[:60]}{'...' if len(text) > 60 else ''})"
        lines.append(f"  {loc}: {msg}{shown}")
    n = len(lines)
    head = f"{source}: invalid scenario ({n} problem{'s' if n > 1 else ''}):"
    return "\n".join([head, *lines[:20]] + (["  ..."] if n > 20 else []))


def _depth(obj: Any, limit: int = MAX_NESTING) -> int:
    stack = [(obj, 1)]
    deepest = 0
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if d > limit:
            return d
        if isinstance(node, dict):
            stack.extend((v, d + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, d + 1) for v in node)
    return deepest


def _check_plain(obj: Any, source: str, path: str = "") -> None:
    """Reject NaN/inf and non-plain values early with a clear path."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, str):
                raise ScenarioError(
                    f"{source}: {path or '(top level)'}: keys must be strings, got {k!r}"
                )
            _check_plain(v, source, f"{path}.{k}" if path else k)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _check_plain(v, source, f"{path}[{i}]")
    elif isinstance(obj, float) and not math.isfinite(obj):
        raise ScenarioError(f"{source}: {path}: expected a finite number, got {obj}")
    elif obj is not None and not isinstance(obj, str | int | float | bool):
        raise ScenarioError(
            f"{source}: {path}: expected a plain value, got {type(obj).__name__}"
        )


def _read_yaml(text: str, source: str) -> Any:
    if len(text.encode("utf-8", "replace")) > MAX_FILE_BYTES:
        raise ScenarioError(
            f"{source}: file is larger than {MAX_FILE_BYTES // 1024 // 1024} MiB; "
            "a scenario is a short YAML file"
        )
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScenarioError(
            f"{source}: malformed YAML{where}: {problem}. "
            "Scenario files are plain YAML mappings (no tags such as !!python/...)."
        ) from None
    except RecursionError:
        raise ScenarioError(f"{source}: YAML nested too deeply") from None
    return data


_SEGMENT = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _split_path(path: str) -> list[str | int]:
    """``fleet.groups[1].speed.sigma`` or ``fleet.groups.1.speed.sigma``."""
    if not path or path.startswith(".") or path.endswith("."):
        raise ScenarioError(f"--set: bad field path {path!r}")
    parts: list[str | int] = []
    pos = 0
    for m in _SEGMENT.finditer(path):
        gap = path[pos : m.start()]
        if gap not in ("", "."):
            raise ScenarioError(f"--set: bad field path {path!r}")
        pos = m.end()
        if m.group(2) is not None:
            parts.append(int(m.group(2)))
        elif m.group(1).isdigit():
            parts.append(int(m.group(1)))
        else:
            parts.append(m.group(1))
    if pos != len(path):
        raise ScenarioError(f"--set: bad field path {path!r}")
    return parts


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``raw`` with ``path=value`` overrides applied.

    Values are parsed as YAML scalars or flow collections, so ``rounds=5``
    sets an int and ``algorithm={name: fedavg}`` a mapping.

    >>> apply_overrides({"a": {"b": 1}}, ["a.b=2", "c=[1, 2]"])
    {'a': {'b': 2}, 'c': [1, 2]}
    """
    import copy

    out = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise ScenarioError(f"--set {item!r}: expected path.to.key=value")
        path, text = item.split("=", 1)
        keys = _split_path(path.strip())
        value = _read_yaml(text, f"--set {path}")
        node: Any = out
        for i, key in enumerate(keys[:-1]):
            nxt = keys[i + 1]
            if isinstance(key, int):
                if not isinstance(node, list) or key >= len(node):
                    raise ScenarioError(
                        f"--set {path}: index [{key}] does not exist in the scenario"
                    )
                node = node[key]
            else:
                if not isinstance(node, dict):
                    raise ScenarioError(f"--set {path}: {key!r} is not a mapping")
                if key not in node or node[key] is None:
                    node[key] = [] if isinstance(nxt, int) else {}
                node = node[key]
        last = keys[-1]
        if isinstance(last, int):
            if not isinstance(node, list) or last >= len(node):
                raise ScenarioError(
                    f"--set {path}: index [{last}] does not exist in the scenario"
                )
            node[last] = value
        else:
            if not isinstance(node, dict):
                raise ScenarioError(f"--set {path}: parent is not a mapping")
            node[last] = value
    return out


def parse_scenario(
    text: str, source: str = "<scenario>", overrides: list[str] | None = None
) -> Scenario:
    """Parse and validate scenario YAML text."""
    raw = _read_yaml(text, source)
    if not isinstance(raw, dict):
        raise ScenarioError(
            f"{source}: expected a YAML mapping at the top level "
            f"(name:, rounds:, ...), got {type(raw).__name__}"
        )
    if _depth(raw) > MAX_NESTING:
        raise ScenarioError(f"{source}: nested more than {MAX_NESTING} levels deep")
    if overrides:
        raw = apply_overrides(raw, overrides)
    _check_plain(raw, source)
    try:
        return Scenario.model_validate(raw)
    except ValidationError as exc:
        raise ScenarioError(_format_validation(exc, source)) from None
    except RecursionError:
        raise ScenarioError(f"{source}: nested too deeply") from None


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    """Read, parse and validate a scenario file."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ScenarioError(
                f"{p}: file is {size} bytes; a scenario is a short YAML file "
                f"(limit {MAX_FILE_BYTES} bytes)"
            )
        text = p.read_text(encoding="utf-8")
    except ScenarioError:
        raise
    except FileNotFoundError:
        raise ScenarioError(f"{p}: no such scenario file") from None
    except IsADirectoryError:
        raise ScenarioError(f"{p}: is a directory, expected a YAML file") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{p}: not UTF-8 text") from None
    except OSError as exc:
        raise ScenarioError(f"{p}: cannot read ({exc.strerror})") from None
    return parse_scenario(text, str(p), overrides)


def dump_scenario(sc: Scenario) -> str:
    """The fully resolved scenario (every default filled in) as YAML."""
    return yaml.safe_dump(
        sc.model_dump(mode="json"), sort_keys=False, default_flow_style=None
    )
