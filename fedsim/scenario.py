"""Scenario files: the typed, frozen, validated description of one experiment.

YAML read with the safe loader, validated by pydantic models that reject
unknown keys; a :class:`ScenarioError` names the file, the field path and what
was expected. Every field: docs/scenarios.md.

How a file becomes a :class:`Scenario` (:func:`load_scenario`, then
:func:`parse_scenario`), each step refusing with a :class:`ScenarioError`:

1. the file: a regular UTF-8 file of at most ``MAX_FILE_BYTES``;
2. the YAML (:func:`read_yaml`): the safe loader with YAML 1.2 scalars
   (``yes`` is text, ``0755`` ambiguous and refused), no duplicate key;
3. the shape and the values, before pydantic sees them: not too deep or
   large (aliases), finite numbers, plain values only;
4. ``--set`` overrides applied to the raw mapping, the shape checked again;
5. each plug-in named (a section's ``name``, ``dataset`` or ``kind``) found;
6. pydantic validation of every section, then the checks across sections
   (:meth:`Scenario._consistent`) and each plug-in's own ``check``;
7. a true/false given for a number (or the reverse), which pydantic's lax mode
   would have converted silently.

What needs no cluster but more than the file (memory, model against data) is
checked next by :mod:`fedsim.tools.preflight`. :func:`dump_scenario` writes the
resolved scenario back, every default filled in, as ``fedsim validate`` shows.

Example:
    >>> sc = load_scenario("scenarios/quickstart.yaml", overrides=["rounds=3"])
    >>> sc.rounds
    3
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import stat
import warnings
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast, get_args

import yaml
from pydantic import (
    BaseModel,
    Field,
    PlainValidator,
    ValidationError,
    field_validator,
    model_validator,
)

from fedsim.algorithms.sampling import pairing_problem
from fedsim.clock import RoundSpec
from fedsim.data.heldout import federated_problem
from fedsim.data.validation import validation_problem
from fedsim.errors import LoadError
from fedsim.facts import RunFacts
from fedsim.fleet import FleetSpec
from fedsim.links import LinksSpec
from fedsim.plugins import (
    KINDS,
    PluginError,
    did_you_mean,
    resolve,
    section_names,
    section_validator,
)
from fedsim.privacy import PrivacySpec
from fedsim.privacy import scenario_problem as privacy_problem
from fedsim.secagg import SecAggSpec
from fedsim.selectors import DEFAULT as SELECTOR_DEFAULT
from fedsim.servertime import ServerSpec
from fedsim.spec import (
    CheckpointSpec,
    ClientSpec,
    EvalSpec,
    Model,
    Problem,
    ResourceSpec,
    ScenarioWarning,
    ServerHomeSpec,
    Spec,
)

__all__ = [
    "CheckpointSpec",
    "ClientSpec",
    "EvalSpec",
    "ResourceSpec",
    "ServerHomeSpec",
    "Scenario",
    "ScenarioError",
    "ScenarioWarning",
    "dump_scenario",
    "load_scenario",
    "parse_scenario",
]

# Limits on what is read, far above any real scenario: a file past them is a
# mistake or an attack, refused before it can exhaust memory or the stack.
MAX_FILE_BYTES = 1024 * 1024
MAX_NESTING = 64
MAX_VALUES = 1_000_000  # YAML aliases can expand a short file to billions
MAX_INT_BITS = 64  # no setting needs more (4300 digits cannot even be printed)


class ScenarioError(LoadError, ValueError):
    """An invalid scenario: the message is meant for the user, as is.

    It names the file (or ``--set`` option) and the field, and says what was
    expected; the CLI prints it without a traceback and exits with status 2.
    """


if TYPE_CHECKING:  # a dataset's fields differ; a plug-in section is its base class
    from fedsim.algorithms.base import Algorithm
    from fedsim.compression import Compressor
    from fedsim.selectors.base import Selector

    DataSpec = Any
    CompressionSpec = Compressor
    AlgorithmSpec = Algorithm
    SelectorSpec = Selector
    ModelSection = Model
else:
    # resolved when a file is loaded, not frozen at import: the choosing key
    # names a built-in, an installed plug-in or a module:Class (fedsim.plugins);
    # typed Any so that a section dumps every field of the class it chose
    DataSpec = Annotated[Any, PlainValidator(section_validator("data"))]
    AlgorithmSpec = Annotated[Any, PlainValidator(section_validator("algorithm"))]
    SelectorSpec = Annotated[Any, PlainValidator(section_validator("selector"))]
    ModelSection = Annotated[Any, PlainValidator(section_validator("model"))]
    CompressionSpec = Annotated[Any, PlainValidator(section_validator("compression"))]


def _default_selector() -> Selector:
    """The registry's default selector with its default fields."""
    return cast("Selector", resolve("selector", SELECTOR_DEFAULT)())


def _default_model() -> Model:
    """The registry's default network with its default fields."""
    from fedsim.models import DEFAULT  # (no torch: it is imported lazily)

    return cast(Model, resolve("model", DEFAULT)())


class Scenario(Spec):
    """One experiment. Every field is documented in docs/scenarios.md."""

    name: str = Field(min_length=1, max_length=200)
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0
    rounds: Annotated[int, Field(ge=1, le=10_000_000)]
    model: ModelSection = Field(default_factory=_default_model)
    data: DataSpec
    client: ClientSpec = ClientSpec()
    fleet: FleetSpec
    round: RoundSpec = RoundSpec()
    algorithm: AlgorithmSpec
    selector: SelectorSpec = Field(default_factory=_default_selector)
    eval: EvalSpec = EvalSpec()
    checkpoint: CheckpointSpec = CheckpointSpec()
    resources: ResourceSpec = ResourceSpec()
    links: LinksSpec | None = None  # fleet-data links (fedsim/links.py)
    server: ServerSpec | None = None  # the server's speed (fedsim/servertime.py)
    compression: CompressionSpec | None = None  # fedsim/compression.py
    privacy: PrivacySpec | None = None  # differential privacy (fedsim/privacy.py)
    secure_aggregation: SecAggSpec | None = None  # its cost (fedsim/secagg.py)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        """The run's name as a safe folder name (no path separator, no dot
        first)."""
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]*", v):
            raise ValueError(
                "use letters, digits, '-', '_' and '.' only (it names the run folder)"
            )
        return v

    @model_validator(mode="before")
    @classmethod
    def _default_weighting(cls, data: object) -> object:
        """An unset ``algorithm.sampling`` becomes the selector's default."""
        if not isinstance(data, dict):
            return data
        alg, sel = data.get("algorithm"), data.get("selector")
        if not (isinstance(alg, dict) and isinstance(sel, dict)) or "sampling" in alg:
            return data
        try:
            a_cls = resolve("algorithm", alg["name"])
            s_cls = resolve("selector", sel.get("name", SELECTOR_DEFAULT))
        except (KeyError, TypeError, PluginError):
            return data  # a bad or missing name: the field validation reports it
        default = getattr(s_cls, "default_weighting", None)
        if default is None or "sampling" not in getattr(
            a_cls, "__dataclass_fields__", {}
        ):
            return data
        return {**data, "algorithm": {**alg, "sampling": default}}

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        """Checks across sections, in order; the first problem refuses the file."""
        checks = (
            self._size_problem,
            # sampling and weighting are one decision (docs/scenarios.md)
            lambda: pairing_problem(self.selector, self.algorithm),
            lambda: validation_problem(
                self.algorithm, self.data, self.selector.clients_per_round
            ),
            self._links_problem,
            # federated evaluation needs the clients' own rows (and rounds)
            lambda: federated_problem(self.eval, self.data, self.round.policy),
            self._compression_problem,
            # DP needs a summing rule, synchronous rounds and Opacus
            lambda: privacy_problem(
                self.privacy, self.algorithm, self.compression, self.round
            ),
            self._secagg_problem,
        )
        for check in checks:
            if (problem := check()) is not None:
                raise ValueError(problem)
        self._plugin_checks()
        # the algorithm builds the solver: a pair it refuses fails here, not in training
        try:
            self.algorithm.solver(self.client)
        except ValueError as exc:
            raise ValueError(
                f"client.solver {self.client.solver!r} with algorithm "
                f"{self.algorithm.name!r}: {exc}"
            ) from None
        return self

    def _size_problem(self) -> str | None:
        """Device i is client i: the data's client count (if it gives one) and
        the selection size must fit the fleet."""
        n_dev, n_clients = self.fleet.size, getattr(self.data, "clients", None)
        if n_clients is not None and n_clients != n_dev:
            return (
                f"data has {n_clients} clients but the fleet has {n_dev} devices; "
                "each device is one client, so they must match "
                "(or leave data.clients out)"
            )
        if self.selector.clients_per_round > n_dev:
            return (
                f"selector.clients_per_round is {self.selector.clients_per_round} "
                f"but the fleet has only {n_dev} devices"
            )
        return None

    def _compression_problem(self) -> str | None:
        """A compressor needs a rule whose clients upload a model update;
        error feedback needs rounds (a client's state between jobs)."""
        if self.compression is None:
            return None
        if self.compression.error_feedback and self.round.policy == "async":
            return (
                "compression.error_feedback needs synchronous rounds: under "
                "round.policy 'async' a device's next job may train before its "
                "last one's residual is known (set error_feedback: false)"
            )
        if self.algorithm.compressible:
            return None
        return (
            f"compression.name {self.compression.name!r}: algorithm "
            f"{self.algorithm.name!r} does not upload a model update to "
            "compress (its rule needs what its clients send, dense); remove "
            "the compression section"
        )

    def _secagg_problem(self) -> str | None:
        """Secure aggregation needs a cohort (synchronous rounds), a
        threshold within it, and a rule that sums dense model updates."""
        spec = self.secure_aggregation
        if spec is None:
            return None
        problem = spec.problem(self.selector.clients_per_round, self.round.policy)
        if problem is None and self.compression is not None:
            problem = (
                "secure_aggregation with compression: a masked update is a dense "
                "vector of ring elements, so a compressor's sizes do not apply "
                "(remove one of the two sections)"
            )
        if problem is None and not self.algorithm.compressible:
            problem = (
                f"secure_aggregation: algorithm {self.algorithm.name!r} does not "
                "upload a model update the server sums (its rule needs what each "
                "client sends); remove the secure_aggregation section"
            )
        return problem

    def _links_problem(self) -> str | None:
        """A declared fleet-data link must name groups the fleet has and ask
        for what the fleet can give (fedsim/links.py says what is checked)."""
        return None if self.links is None else self.links.problem(self.fleet)

    def _plugin_checks(self) -> None:
        """Each plug-in's own checks against the rest of the scenario: the first
        error refuses it, warnings go out as :class:`ScenarioWarning`."""
        found: list[Problem] = []
        facts = self.facts
        for part in (self.algorithm, self.selector):
            check = getattr(part, "check", None)
            found += list(check(facts)) if check is not None else []
        for p in found:
            if not p.warning:
                raise ValueError(p.message)
        for p in found:
            warnings.warn(p.message, ScenarioWarning, stacklevel=2)

    @property
    def num_clients(self) -> int:
        """The client count: device i is client i, so the fleet's size."""
        return self.fleet.size

    @property
    def facts(self) -> RunFacts:
        """What a plug-in's questions about this run read (a small typed
        record: :class:`fedsim.facts.RunFacts`)."""
        return RunFacts(
            seed=self.seed,
            rounds=self.rounds,
            num_clients=self.num_clients,
            clients_per_round=self.selector.clients_per_round,
            client=self.client,
            round=self.round,
            fleet=self.fleet,
            data=self.data,
            dataset=str(self.data.dataset),
            model=self.model,
            server_home=self.resources.server.home,
            checkpoint_every=self.checkpoint.every_rounds,
            federated_every=self.eval.federated_every,
        )


def _format_loc(loc: tuple[object, ...], raw: object = None) -> str:
    """pydantic's ``loc`` as ``fleet.groups[1].speed.sigma``, less union tags."""
    out, node = "", raw
    for part in loc:
        fields = node if isinstance(node, dict) else {}
        tags = (fields.get("name"), fields.get("dataset"), fields.get("kind"))
        if isinstance(part, int):
            out += f"[{part}]"
            node = (
                node[part] if isinstance(node, list) and 0 <= part < len(node) else None
            )
        elif part in fields or part not in tags:  # not a member pydantic adds
            out += ("." if out else "") + str(part)
            node = fields.get(part)
    return out or "(top level)"


# "selector.name 'x' ...", "algorithm.sampling 'x' ...": a field path first
_CROSS_FIELD = re.compile(r"([a-z_]+(?:\.[a-z_]+|\[\d+\])+)\b")
_UNKNOWN_KEY = "unknown key (check the spelling; see docs/scenarios.md)"
# pydantic error types whose message is replaced, without the input shown
_PLAIN_MESSAGES = {
    "extra_forbidden": _UNKNOWN_KEY,
    "unexpected_keyword_argument": _UNKNOWN_KEY,
    "missing": "required field is missing",
}


def _format_validation(err: ValidationError, source: str, raw: object) -> str:
    """pydantic's errors as one message: a line per problem, each the field's
    path in the file's own terms, the reason and the value given.

    Args:
        err: The validation error.
        source: The file (or option) named in the head line.
        raw: The mapping validated, to tell a field from a union's tag.
    """
    lines = []
    for e in err.errors(include_url=False):
        loc = _format_loc(tuple(e["loc"]), raw)
        msg = _PLAIN_MESSAGES.get(e["type"], e["msg"])
        if e["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            known = _known_keys(tuple(e["loc"]), raw)
            hint = did_you_mean(str(e["loc"][-1]), known) if e["loc"] else ""
            msg = f"unknown key ({hint}check the spelling; see docs/scenarios.md)"
        if e["type"] == "union_tag_invalid":
            msg = f"unknown choice: {msg}"
        elif e["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
            # a check across sections names its fields itself: lead with the
            # first, said once ("selector.q: 1e-300 ...", not "selector.q:
            # selector.q 1e-300 ...")
            if not e["loc"] and (first := _CROSS_FIELD.match(msg)):
                loc, msg = first.group(1), msg[first.end() :].lstrip(" :")
        got, shown = e.get("input"), ""
        # a whole section as "got" would swamp the line; so would a long value
        if e["type"] not in _PLAIN_MESSAGES and not isinstance(got, dict | list):
            text = repr(got)
            shown = f" (got {text[:60]}{'...' if len(text) > 60 else ''})"
        lines.append(f"  {loc}: {msg}{shown}")
    return _problems(source, lines)


def _known_keys(loc: tuple[object, ...], raw: object) -> list[str]:
    """The keys the section at ``loc[:-1]`` takes (a pydantic spec's fields,
    a plug-in's, found by the name the file gives), for "did you mean";
    [] where they cannot be told (a hint is a help, never a new error)."""
    classes: list[Any] = [Scenario]
    node = raw
    try:
        for part in loc[:-1]:
            if isinstance(part, int):  # a list's item: the list's own classes
                node = node[part] if isinstance(node, list) else None
                continue
            node = node.get(part) if isinstance(node, dict) else None
            classes = _section_classes(classes, str(part), node)
        return sorted({k for c in classes for k in _field_types(c)})
    except Exception:  # noqa: BLE001 - an unusual section: no hint
        return []


def _section_classes(parents: list[Any], part: str, node: object) -> list[Any]:
    """The spec classes of the section ``part`` below a section of classes
    ``parents``: the plug-in class the file names in a top-level plug-in
    section (``node``, the section as written), else the field's types."""
    kind = next((k for k, v in KINDS.items() if v.section == part), None)
    if kind is not None and parents == [Scenario]:
        name = node.get(KINDS[kind].key) if isinstance(node, dict) else None
        return [resolve(kind, name)] if isinstance(name, str) else []
    hints = [_field_types(c).get(part) for c in parents]
    return [m for h in hints if h is not None for m in _spec_classes(h)]


def _field_types(cls: Any) -> dict[str, Any]:
    """A spec class's fields and their types (a plug-in dataclass's names)."""
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return {k: f.annotation for k, f in cls.model_fields.items()}
    if dataclasses.is_dataclass(cls):
        return {f.name: f.type for f in dataclasses.fields(cls)}
    return {}


def _spec_classes(hint: Any) -> list[type]:
    """The spec classes inside a type hint (through Optional, list, unions)."""
    if isinstance(hint, type) and _field_types(hint):
        return [hint]
    return [c for arg in get_args(hint) for c in _spec_classes(arg)]


def _problems(source: str, lines: list[str]) -> str:
    """The head line naming ``source`` and the count, then at most 20 lines."""
    n = len(lines)
    head = f"{source}: invalid scenario ({n} problem{'s' if n > 1 else ''}):"
    return "\n".join([head, *lines[:20]] + (["  ..."] if n > 20 else []))


def _check_shape(raw: object, source: str) -> None:
    """Refuse structures too deep or too large to walk or validate."""
    stack: list[tuple[object, int]] = [(raw, 1)]
    seen = 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise ScenarioError(
                f"{source}: expands to more than {MAX_VALUES:,} values "
                "(YAML anchors and aliases?); a scenario is a short file"
            )
        if depth > MAX_NESTING:
            raise ScenarioError(f"{source}: nested more than {MAX_NESTING} levels deep")
        if isinstance(node, dict | list):
            values = node.values() if isinstance(node, dict) else node
            stack.extend((v, depth + 1) for v in values)


def _check_plain(obj: object, source: str, path: str = "") -> None:
    """Refuse NaN/inf, huge ints and non-plain values, naming the path."""
    problem: str | None = None
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, str):
                problem = f"keys must be strings, got {k!r}"
                break
            _check_plain(v, source, f"{path}.{k}" if path else k)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _check_plain(v, source, f"{path}[{i}]")
    else:
        problem = _scalar_problem(obj)
    if problem is not None:
        raise ScenarioError(f"{source}: {path or '(top level)'}: {problem}")


def _scalar_problem(obj: object) -> str | None:
    """Why a scalar cannot be a setting: not finite, more bits than any setting
    needs (a huge int would also make pydantic slow), or not a YAML scalar."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return f"expected a finite number, got {obj}"
    if isinstance(obj, int) and obj.bit_length() > MAX_INT_BITS:
        return f"number too large ({obj.bit_length()} bits)"
    if obj is not None and not isinstance(obj, str | int | float | bool):
        return f"expected a plain value, got {type(obj).__name__}"
    return None


# libyaml's safe loader when PyYAML has it: the pure-Python one takes ~20 s/MiB.
# Both construct only plain YAML types (SafeConstructor): no tags, no objects.
_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_STR = "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"


class _Loader(_BaseLoader):  # type: ignore[misc,valid-type]
    """The safe loader reading plain scalars as YAML 1.2 (docs/scenarios.md)."""


# PyYAML resolves plain scalars by YAML 1.1 (``yes`` a bool, ``010`` octal);
# its bool, int and float resolvers are dropped and YAML 1.2's put in their place
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in entries if tag not in (_BOOL, _INT, _FLOAT)]
    for first, entries in yaml.resolver.Resolver.yaml_implicit_resolvers.items()
}
_YAML12_SCALARS = {  # tag: (pattern, the characters a match can start with)
    _BOOL: (r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    _FLOAT: (
        r"""^(?:[-+]?[0-9][0-9_]*(?:\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[eE][-+]?[0-9]+)
        |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        "-+0123456789.",
    ),
    _INT: (
        r"^(?:[-+]?0b[01_]+|[-+]?0x[0-9a-fA-F_]+|[-+]?(?:0|[1-9][0-9_]*))$",
        "-+0123456789",
    ),
}
for _tag, (_pattern, _first) in _YAML12_SCALARS.items():
    _Loader.add_implicit_resolver(_tag, re.compile(_pattern, re.X), list(_first))

# YAML 1.1 reads these as numbers, YAML 1.2 as text: refused, as ambiguous.
_AMBIGUOUS = {
    re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$"): (
        "YAML 1.1 reads a base-60 number, YAML 1.2 text); write the number in "
        "seconds or plain decimal"
    ),
    re.compile(r"^[-+]?0[0-9_]+$"): (
        "YAML 1.1 reads an octal number); write it without the leading zero"
    ),
}


def _check_nodes(root: yaml.Node | None, source: str) -> None:
    """Refuse duplicate keys and ambiguous plain scalars (each node once: an
    alias repeats a node, and would otherwise be walked again and again)."""
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, str]] = [] if root is None else [(root, "")]
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            stack.extend(_mapping_children(node, path, source))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(node.value))
        elif node.tag == _STR and not node.style:  # plain: None, or '' (libyaml)
            _check_plain_scalar(str(node.value), node, path, source)


def _mapping_children(
    node: yaml.MappingNode, path: str, source: str
) -> list[tuple[yaml.Node, str]]:
    """A mapping's keys and values with their paths, refusing a key given twice
    (YAML would keep the last one silently)."""
    out: list[tuple[yaml.Node, str]] = []
    first: dict[str, int] = {}
    for key, value in node.value:
        if key.tag == _MERGE:  # `<<: *base` may override keys, by design
            out.append((value, path))
            continue
        scalar = isinstance(key, yaml.ScalarNode)
        name = str(key.value) if scalar else f"<{key.id}>"
        sub = f"{path}.{name}" if path else name
        line = key.start_mark.line + 1
        if name in first:
            raise ScenarioError(
                f"{source}: line {line}: duplicate key {sub} (first given "
                f"at line {first[name]}); YAML would silently keep only "
                "the last one"
            )
        first[name] = line
        out.extend([(key, sub), (value, sub)])
    return out


def _check_plain_scalar(text: str, node: yaml.Node, path: str, source: str) -> None:
    """Refuse a plain scalar that YAML 1.1 and 1.2 read differently."""
    for pattern, why in _AMBIGUOUS.items():
        if pattern.match(text):
            raise ScenarioError(
                f"{source}: line {node.start_mark.line + 1}: "
                f"{path or '(top level)'}: {text} is ambiguous ({why}, or "
                f"quote '{text}' if it is text"
            )


def read_yaml(text: str, source: str) -> Any:
    """Parse YAML text as scenario files are (for ``fedsim compare`` and
    ``stress --sweep`` values too).

    Raises:
        ScenarioError: naming ``source`` (and the line, where YAML tells).
    """
    if len(text.encode("utf-8", "replace")) > MAX_FILE_BYTES:
        raise ScenarioError(
            f"{source}: file is larger than {MAX_FILE_BYTES // 1024 // 1024} MiB; "
            "a scenario is a short YAML file"
        )
    try:
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            _check_nodes(node, source)
            return None if node is None else loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScenarioError(
            f"{source}: malformed YAML{where}: {problem}. "
            "Scenario files are plain YAML mappings (no tags such as !!python/...)."
        ) from None
    except ScenarioError:
        raise
    except RecursionError:
        raise ScenarioError(f"{source}: YAML nested too deeply") from None
    except (ValueError, OverflowError, LookupError, AttributeError, TypeError) as exc:
        # PyYAML's constructors raise these on `!!int abc`, `!!bool maybe`,
        # `!!int ''`, `!!timestamp x`, a 4300-digit int, 1:2:...:59.5
        raise ScenarioError(
            f"{source}: malformed YAML: cannot read a value "
            f"({type(exc).__name__}: {exc})"
        ) from None


_SEGMENT = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _split_path(path: str) -> list[str | int]:
    """The keys and indices of ``fleet.groups[1].speed.sigma`` (or
    ``fleet.groups.1.speed.sigma``), in order.

    Raises:
        ScenarioError: an empty segment, a stray character or a dot at an end.
    """
    parts: list[str | int] = []
    pos = 0
    for m in _SEGMENT.finditer(path):
        if path[pos : m.start()] not in ("", "."):
            raise ScenarioError(f"--set: bad field path {path!r}")
        pos = m.end()
        text = m.group(1) or m.group(2)
        numeric = m.group(2) is not None or (text.isascii() and text.isdigit())
        parts.append(int(text) if numeric else text)
    if not path or path[0] == "." or path[-1] == "." or pos != len(path):
        raise ScenarioError(f"--set: bad field path {path!r}")
    return parts


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """A copy of ``raw`` with ``path=value`` overrides (values read as YAML).

    A missing mapping or list on the way is created (``eval.every_rounds=2``
    on a scenario without ``eval``); an index must exist, since a list cannot
    have a gap.

    Args:
        raw: The scenario as read, before validation.
        overrides: ``--set`` items, applied in order (a later one wins).

    Raises:
        ScenarioError: naming the override: no ``=``, a bad path, a missing
            index, a parent that is not a mapping, or an unreadable value.

    >>> apply_overrides({"a": {"b": 1}}, ["a.b=2", "c=[1, 2]"])
    {'a': {'b': 2}, 'c': [1, 2]}
    """
    out = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise ScenarioError(f"--set {item!r}: expected path.to.key=value")
        path, text = item.split("=", 1)
        keys = _split_path(path.strip())
        value = read_yaml(text, f"--set {path}")
        node: Any = out
        for i, key in enumerate(keys):
            if isinstance(key, int):
                if not isinstance(node, list) or key >= len(node):
                    raise ScenarioError(
                        f"--set {path}: index [{key}] does not exist in the scenario"
                    )
            elif not isinstance(node, dict):
                raise ScenarioError(
                    f"--set {path}: cannot set {key!r}: its parent is not a mapping"
                )
            if i == len(keys) - 1:
                node[key] = value
            else:
                if isinstance(key, str) and node.get(key) is None:
                    node[key] = [] if isinstance(keys[i + 1], int) else {}
                node = node[key]
    return out


def parse_scenario(
    text: str,
    source: str = "<scenario>",
    overrides: list[str] | None = None,
    base_dir: str | Path | None = None,
) -> Scenario:
    """Parse and validate scenario YAML text (the module docstring's steps 2-7).

    Args:
        text: The YAML.
        source: What the messages name (the file, or ``<scenario>``).
        overrides: ``--set`` items applied before validation.
        base_dir: Where relative paths (traces, data files) are looked for
            first.

    Raises:
        ScenarioError: one message naming ``source``; validation errors list
            every problem found, one line each.
    """
    raw = read_yaml(text, source)
    if not isinstance(raw, dict):
        raise ScenarioError(
            f"{source}: expected a YAML mapping at the top level "
            f"(name:, rounds:, ...), got {type(raw).__name__}"
        )
    # before overrides: walking and copying an alias bomb is what must not run
    _check_shape(raw, source)
    if overrides:
        raw = apply_overrides(raw, overrides)
        _check_shape(raw, source)  # an override may nest deeper than the file
    # before pydantic: a NaN or a 10**5000 would pass as a float or be slow,
    # and its message would not name the path
    _check_plain(raw, source)
    # a plug-in that cannot be imported would surface as one confusing union
    # error per section; refused alone, in one line
    _check_plugins(raw, source)
    try:
        sc = Scenario.model_validate(raw, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise ScenarioError(_format_validation(exc, source, raw)) from None
    except RecursionError:
        raise ScenarioError(f"{source}: nested too deeply") from None
    # after validation: only the validated values tell a number from a switch
    if problems := list(_bool_number_mixups(raw, sc, ())):
        raise ScenarioError(_problems(source, problems))
    return sc


def _check_plugins(raw: dict[str, object], source: str) -> None:
    """Refuse, in one line, a section naming a class that cannot be found or is
    of the wrong kind (file, field, the name given and what was expected)."""
    for kind, field, name in section_names(raw):
        try:
            resolve(kind, name)
        except PluginError as exc:
            raise ScenarioError(f"{source}: {field}: {exc}") from None


def _bool_number_mixups(
    raw: object, value: object, loc: tuple[object, ...]
) -> Iterator[str]:
    """A true/false given for a number, or a number for a switch (lax mode)."""
    if isinstance(raw, bool):
        if isinstance(value, int | float) and not isinstance(value, bool):
            yield f"  {_format_loc(loc)}: expected a number, not {str(raw).lower()}"
    elif isinstance(value, bool):
        # `yes`, `no`, `on`, `off` are text here (YAML 1.2), not switches
        hint = "; write true or false" if isinstance(raw, str) else ""
        yield f"  {_format_loc(loc)}: expected true or false (got {raw!r}){hint}"
    elif isinstance(raw, dict):
        get = value.get if isinstance(value, dict) else partial(getattr, value)
        for key, sub in raw.items():
            if (target := get(str(key), _ABSENT)) is not _ABSENT:
                yield from _bool_number_mixups(sub, target, (*loc, key))
    elif isinstance(raw, list) and isinstance(value, list | tuple):
        if len(raw) == len(value):
            for i, (sub, target) in enumerate(zip(raw, value, strict=True)):
                yield from _bool_number_mixups(sub, target, (*loc, i))


_ABSENT = object()


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    """Read, parse and validate a scenario file.

    Args:
        path: The YAML file; relative paths inside it are looked for next to
            it first.
        overrides: ``--set`` items, as ``fleet.groups[0].count=10``.

    Raises:
        ScenarioError: naming the file: missing, not a regular file (a FIFO
            would block), too large, not UTF-8, or invalid (:func:`parse_scenario`).
    """
    p = Path(path)
    try:
        if p.is_dir():
            raise ScenarioError(f"{p}: is a directory, expected a YAML file")
        if not stat.S_ISREG(p.stat().st_mode):
            # /dev/zero never ends; a FIFO blocks until someone writes to it
            raise ScenarioError(f"{p}: not a regular file")
        with p.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise ScenarioError(
                f"{p}: file is larger than {MAX_FILE_BYTES} bytes; "
                "a scenario is a short YAML file"
            )
        text = data.decode("utf-8")
    except ScenarioError:
        raise
    except FileNotFoundError:
        raise ScenarioError(f"{p}: no such scenario file") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{p}: not UTF-8 text") from None
    except OSError as exc:
        raise ScenarioError(f"{p}: cannot read ({exc.strerror})") from None
    except ValueError:  # e.g. a NUL byte in the path
        raise ScenarioError(f"{p}: not a valid file name") from None
    return parse_scenario(text, str(p), overrides, base_dir=p.parent)


class _Dumper(yaml.SafeDumper):
    """Quotes strings YAML 1.1 or :class:`_Loader` would read otherwise ('yes')."""


for _first, _entries in _Loader.yaml_implicit_resolvers.items():
    for _tag, _rx in _entries:
        _Dumper.add_implicit_resolver(_tag, _rx, [_first])


def dump_scenario(sc: Scenario) -> str:
    """The fully resolved scenario (every default filled in) as YAML; a string
    YAML 1.1 or the scenario loader would read as something else is quoted."""
    return yaml.dump(
        sc.model_dump(mode="json"),
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=None,
    )
