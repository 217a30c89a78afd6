"""Hostile scenarios: fedsim accepts them or says what is wrong, and nothing else.

The property, for any text: ``parse_scenario(text, "fuzz.yaml")`` returns a
Scenario or raises :class:`ScenarioError` whose message starts with
``fuzz.yaml`` -- never another exception, never a hang, never code run from
the file. An accepted scenario is consistent and survives a round trip
through ``dump_scenario``.

Hypothesis generates well over 1,000 inputs per run (see ``EXAMPLES``):

- structural mutations of scenarios/quickstart.yaml (keys dropped, unknown
  keys inserted, leaves and subtrees replaced by values of random types:
  negative, zero, huge and NaN numbers, empty fleets, more clients per round
  than devices, choices swapped), dumped in several YAML styles;
- text mutations of the same file (YAML tags that construct objects such as
  ``!!python/object/apply:os.system``, aliases, huge and odd numbers, broken
  syntax, control characters, truncation);
- whole hostile documents (nesting thousands deep, oversized files, odd line
  endings and directives, random text and bytes);
- ``--set`` overrides;
- YAML alias bombs and self-references, each parsed in a forked child with a
  memory cap and a time limit, so that a bug cannot take the machine (shared
  with other people's work) down with it.

Then a file just under the size limit (bounded parse time), a few explicit
files for ``load_scenario`` (/dev/zero, a FIFO, a 10 GiB sparse file, ...), and
the ``fedsim`` command itself on bad files: exit code 2, a message, no
traceback. ``pytest --hypothesis-show-statistics`` shows what was generated
and how each input was answered.

Derandomized: the same inputs on every run (the ``ci`` Hypothesis profile of
tests/conftest.py, a fixed seed); ``FEDSIM_FUZZ_RANDOM=1`` draws new ones.
"""

from __future__ import annotations

import json
import math
import os
import re
import resource
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, event, given, note, settings
from hypothesis import strategies as st

from fedsim import scenario as scenario_module
from fedsim.scenario import (
    Scenario,
    ScenarioError,
    dump_scenario,
    load_scenario,
    parse_scenario,
)

from .conftest import ROOT, SCENARIOS, WAIT_S, time_limit

SOURCE = "fuzz.yaml"
QUICK_TEXT = (SCENARIOS / "quickstart.yaml").read_text()
QUICK: dict[str, Any] = yaml.safe_load(QUICK_TEXT)
FEDSIM = Path(sys.executable).parent / "fedsim"  # the console script

# Examples per property test; their sum is the fuzz count (>= 1,000).
EXAMPLES = {
    "structure": 500,
    "text": 330,
    "overrides": 110,
    "documents": 150,
    "aliases": 10,
}
HANG_S = 20  # a single parse taking this long is a hang
# If a payload ever runs, it leaves this file behind.
PWNED = Path(tempfile.gettempdir()) / f"fedsim-fuzz-pwned-{os.getpid()}"

FAST = settings(
    deadline=timedelta(seconds=10),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    report_multiple_bugs=False,
)


# ------------------------------------------------------------ the property


def kind_of(message: str) -> str:
    """A short label of a rejection, for Hypothesis' statistics."""
    head = message.split("\n", 1)[0].removeprefix(f"{SOURCE}: ")
    for label in (
        "malformed YAML",
        "invalid scenario",
        "expected a YAML mapping",
        "nested",
        "larger than",
        "expands to more than",
        "expected a finite number",
        "keys must be strings",
        "expected a plain value",
        "number too large",
    ):
        if label in head:
            return label
    return re.sub(r"'[^']*'|\"[^\"]*\"|\d+", "_", head)[:40]


def check_message(message: str, prefixes: tuple[str, ...] = (SOURCE,)) -> None:
    assert message.startswith(prefixes), message[:500]
    assert "Traceback" not in message, message[:500]
    assert " object at 0x" not in message, message[:500]
    assert not PWNED.exists(), "a YAML payload ran"


def check_accepted(sc: Scenario) -> None:
    assert isinstance(sc, Scenario)
    assert 1 <= sc.selector.clients_per_round <= sc.num_clients
    assert parse_scenario(dump_scenario(sc), SOURCE) == sc


def check(text: str) -> None:
    """The property, in this process (for inputs of bounded size)."""
    note(f"input ({len(text)} chars): {text[:2000]!r}")
    try:
        with time_limit(HANG_S):
            sc = parse_scenario(text, SOURCE)
    except ScenarioError as exc:
        check_message(str(exc))
        event(f"rejected: {kind_of(str(exc))}")
        return
    event("accepted")
    check_accepted(sc)


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def isolated(
    call: Callable[..., Any], *args: Any, seconds: float = HANG_S, memory: int = 1 << 30
) -> tuple[str, str]:
    """Run ``call(*args)`` in a forked child with ``memory`` bytes of address
    space more than it starts with and ``seconds`` of time.

    Returns ("accepted", "") or ("ScenarioError", message), or ("crash", what)
    for any other exception, or ("hang", how) when the child had to be killed.
    A runaway input costs a bounded amount of memory and time, whatever it does.
    """
    if not hasattr(os, "fork") or not os.path.exists("/proc/self/status"):
        pytest.skip("needs fork and /proc")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        try:
            os.close(r)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
            cap = _vm_size() + memory
            _, hard = resource.getrlimit(resource.RLIMIT_AS)
            if hard == resource.RLIM_INFINITY or hard > cap:
                resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
            signal.alarm(math.ceil(seconds))  # default action: terminate
            try:
                result = call(*args)
                out = ["accepted", ""]
                if isinstance(result, Scenario):
                    check_accepted(result)
            except ScenarioError as exc:
                out = ["ScenarioError", str(exc)]
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                out = ["crash", f"{type(exc).__name__}: {str(exc)[:2000]}"]
            data = json.dumps([out[0], out[1][:20000]]).encode()
            while data:
                data = data[os.write(w, data) :]
        finally:
            os._exit(0)
    os.close(w)
    chunks, deadline = [], time.monotonic() + seconds + 15
    try:
        while True:
            ready, _, _ = select.select(
                [r], [], [], max(0.0, deadline - time.monotonic())
            )
            if not ready:
                os.kill(pid, signal.SIGKILL)
                break
            chunk = os.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    if chunks:
        outcome, message = json.loads(b"".join(chunks))
        return outcome, message
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status)).name
        if sig in ("SIGALRM", "SIGKILL"):
            return "hang", f"killed after {seconds} s"
        return "crash", f"died of {sig} (abort: out of memory?)"
    return "crash", f"exited with {os.WEXITSTATUS(status)} and said nothing"


def check_isolated(call: Callable[..., Any], *args: Any, **limits: Any) -> str:
    outcome, message = isolated(call, *args, **limits)
    assert outcome in ("accepted", "ScenarioError"), f"{outcome}: {message[:2000]}"
    if outcome == "ScenarioError":
        check_message(message)
        return kind_of(message)
    return "accepted"


# ------------------------------------------------------------ the values


def _schema_words() -> tuple[list[str], list[str]]:
    """Field names and choice values that appear anywhere in the schema, so
    mutations sometimes hit a real field or switch to a real choice."""
    keys: set[str] = set()
    words: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("properties"), dict):
                keys.update(node["properties"])
            for tag in ("enum", "const"):
                values = node.get(tag)
                values = values if isinstance(values, list) else [values]
                words.update(v for v in values if isinstance(v, str))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    try:
        walk(Scenario.model_json_schema())
    except Exception:  # noqa: BLE001 - the schema is a convenience here
        pass

    def collect(node: Any) -> None:
        if isinstance(node, dict):
            keys.update(k for k in node if isinstance(k, str))
            for v in node.values():
                collect(v)
        elif isinstance(node, list):
            for v in node:
                collect(v)
        elif isinstance(node, str):
            words.add(node)

    collect(QUICK)
    return sorted(keys), sorted(words)


KNOWN_KEYS, CHOICES = _schema_words()
ODD_STRINGS = [
    "",
    " ",
    "auto",
    "AUTO",
    "none",
    "NaN",
    "1e5",
    "0x10",
    "-1",
    "yes",
    "../../etc/passwd",
    "/dev/zero",
    "${HOME}",
    "$(id)",
    "`id`",
    "{{7*7}}",
    "%s%s%n",
    "a" * 300,
    "💥",
    "名前",
    "\u202e",
]
EDGE_NUMBERS = [
    0,
    -1,
    1,
    2,
    -(10**6),
    10**6,
    2**31 - 1,
    2**31,
    2**53 + 1,
    2**63 - 1,
    2**63,
    -(2**63) - 1,
    2**64,
    10**100,
    0.0,
    -0.0,
    5e-324,
    1e-300,
    0.5,
    1e308,
    -1e308,
    math.nan,
    math.inf,
    -math.inf,
]

keys = st.one_of(
    st.sampled_from(KNOWN_KEYS),
    st.sampled_from(KNOWN_KEYS),
    st.text(max_size=12),
    st.text(max_size=12),
    st.sampled_from([0, -1, None, True, 1.5]),  # YAML keys need not be strings
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from(EDGE_NUMBERS),
    # built lazily so that Hypothesis' statistics stay readable
    st.just(4000).map(lambda n: 10**n),  # about the longest int Python prints
    st.just(5000).map(lambda n: "x" * n),
    st.floats(),
    st.text(max_size=20),
    st.sampled_from(CHOICES + KNOWN_KEYS + ODD_STRINGS),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4)
    ),
    max_leaves=12,
)


# ------------------------------------------------ structural mutations


def nodes(doc: Any, path: tuple = ()) -> list[tuple]:
    """Paths of every node below the root."""
    out = []
    items = (
        doc.items()
        if isinstance(doc, dict)
        else enumerate(doc)
        if isinstance(doc, list)
        else ()
    )
    for k, v in items:
        out.append((*path, k))
        out += nodes(v, (*path, k))
    return out


def parent(doc: Any, path: tuple) -> Any:
    for k in path[:-1]:
        doc = doc[k]
    return doc


def fleet_size(doc: dict) -> int:
    try:
        return sum(int(g.get("count", 0)) for g in doc["fleet"]["groups"])
    except Exception:  # noqa: BLE001 - a mutated fleet may be anything
        return 30


@st.composite
def mutated_documents(draw) -> Any:
    doc = json.loads(json.dumps(QUICK))  # a deep copy of plain data
    for _ in range(draw(st.integers(1, 4))):
        op = draw(
            st.sampled_from(
                [
                    "drop",
                    "drop",
                    "insert",
                    "replace",
                    "replace",
                    "edge-number",
                    "retype",
                    "choice",
                    "empty-fleet",
                    "too-many-clients",
                ]
            )
        )
        paths = nodes(doc) if isinstance(doc, dict | list) else []
        if op == "empty-fleet" and isinstance(doc, dict):
            doc["fleet"] = draw(
                st.sampled_from(
                    [{"groups": []}, {}, None, [], {"groups": [{}]}, {"groups": None}]
                )
            )
        elif op == "too-many-clients" and isinstance(doc, dict):
            selector = doc.get("selector")
            if not isinstance(selector, dict):
                selector = doc["selector"] = {"name": "uniform"}
            selector["clients_per_round"] = fleet_size(doc) + draw(
                st.integers(1, 10**9)
            )
        elif not paths:
            doc = draw(values)
        elif op == "drop":
            path = draw(st.sampled_from(paths))
            del parent(doc, path)[path[-1]]
        elif op == "insert":
            mappings = [doc] + [parent(doc, p)[p[-1]] for p in paths]
            mappings = [m for m in mappings if isinstance(m, dict)]
            if mappings:
                draw(st.sampled_from(mappings))[draw(keys)] = draw(values)
        elif op == "replace":
            path = draw(st.sampled_from(paths))
            parent(doc, path)[path[-1]] = draw(values)
        elif op == "edge-number":
            numeric = [
                p
                for p in paths
                if isinstance(parent(doc, p)[p[-1]], int | float)
                and not isinstance(parent(doc, p)[p[-1]], bool)
            ] or paths
            path = draw(st.sampled_from(numeric))
            parent(doc, path)[path[-1]] = draw(st.sampled_from(EDGE_NUMBERS))
        elif op == "retype":
            path = draw(st.sampled_from(paths))
            old = parent(doc, path)[path[-1]]
            parent(doc, path)[path[-1]] = draw(
                st.sampled_from([[old], {"value": old}, str(old), None, True])
            )
        elif op == "choice":
            tagged = [
                p
                for p in paths
                if p[-1] in ("name", "dataset", "dist", "kind", "policy", "solver")
            ] or paths
            path = draw(st.sampled_from(tagged))
            parent(doc, path)[path[-1]] = draw(st.sampled_from(CHOICES))
    return doc


@st.composite
def dumped(draw) -> str:
    doc = draw(mutated_documents())
    return yaml.safe_dump(
        doc,
        default_flow_style=draw(st.sampled_from([None, True, False])),
        sort_keys=draw(st.booleans()),
        allow_unicode=draw(st.booleans()),
        width=draw(st.sampled_from([80, 20, 10**6])),
    )


@settings(FAST, max_examples=EXAMPLES["structure"])
@given(dumped())
def test_structural_mutations_are_accepted_or_explained(text):
    check(text)


# ------------------------------------------------------- text mutations

HOSTILE_SNIPPETS = [
    f"!!python/object/apply:os.system ['touch {PWNED}']",
    f"!!python/object/apply:subprocess.check_call [['touch', '{PWNED}']]",
    f"!!python/object/new:os.system ['touch {PWNED}']",
    "!!python/name:os.system",
    "!!python/module:os",
    "!!python/object:collections.OrderedDict {}",
    "!!python/tuple [1, 2]",
    "!!python/bytes aGk=",
    "!!binary aGVsbG8=",
    "!!timestamp 2001-12-14t21:59:43.10-05:00",
    "2001-12-14",
    "!!set {a, b}",
    "!!omap [a: 1, b: 2]",
    "!!pairs [a: 1, a: 2]",
    "!!int '0x1F'",
    "!!int abc",
    "!!int ''",
    "!!int '-'",
    "!!int 0x",
    "!!float abc",
    "!!float ''",
    "!!bool maybe",
    "!!bool ''",
    "!!timestamp x",
    "!!timestamp 2001-13-45",
    "!!str",
    "!!null x",
    "!custom {a: 1}",
    "!<tag:example.com,2000:app/foo> bar",
    "&anchor 5",
    "*undefined_alias",
    ".nan",
    ".NaN",
    ".inf",
    "-.inf",
    "1e400",
    "1.0e400",
    "-1.0e400",
    "1.0e-400",
    "0x" + "F" * 5000,
    "9" * 5000,
    "-" + "9" * 5000,
    "0b" + "1" * 20000,
    "0" + "7" * 5000,
    ":".join(["59"] * 3000),
    ":".join(["59"] * 300) + ".5",
    "1_000_000_000_000_000_000_000",
    "0." + "1" * 5000,
    "~",
    "null",
    "",
    "''",
    '""',
    "[]",
    "{}",
    "[",
    "]",
    "{",
    "}",
    "'unterminated",
    '"unterminated',
    '"\\x00\\ud800"',
    "? complex\n: key",
    "<<: {a: 1}",
    "<<: *x",
    "- - - -",
    "|\n  literal",
    ">\n  folded",
    "%YAML 1.2",
    "---",
    "...",
    "a" * 70000,
    "\x00",
    "\ufeff",
    "\u2028",
    "\x85",
    "\t",
    "\r",
    "{" * 200 + "}" * 200,
    "[" * 2000 + "]" * 2000,
]
snippets = st.one_of(
    st.sampled_from(HOSTILE_SNIPPETS),
    st.sampled_from(HOSTILE_SNIPPETS),
    st.sampled_from(HOSTILE_SNIPPETS),
    st.text(max_size=30),
    st.text(st.characters(exclude_categories=()), max_size=10),  # surrogates too
    scalars.map(lambda v: yaml.safe_dump(v, default_flow_style=True).strip()),
)


@st.composite
def text_mutations(draw) -> str:
    base = draw(st.sampled_from([QUICK_TEXT, yaml.safe_dump(QUICK)]))
    lines = base.split("\n")
    for _ in range(draw(st.integers(1, 3))):
        op = draw(
            st.sampled_from(
                ["value"] * 4 + ["line"] * 2 + ["delete", "indent", "char", "cut"]
            )
        )
        i = draw(st.integers(0, len(lines) - 1))
        if op == "value":
            keyed = [
                j for j, line in enumerate(lines) if re.match(r"\s*-?\s*\w+:", line)
            ]
            j = draw(st.sampled_from(keyed)) if keyed else i
            key, sep, _ = lines[j].partition(":")
            lines[j] = f"{key}{sep or ':'} {draw(snippets)}"
        elif op == "line":
            indent = " " * draw(st.integers(0, 8))
            lines.insert(
                i, f"{indent}{draw(st.sampled_from(KNOWN_KEYS))}: {draw(snippets)}"
            )
        elif op == "delete":
            del lines[i : i + draw(st.integers(1, 5))]
            lines = lines or [""]
        elif op == "indent":
            lines[i] = draw(st.sampled_from(["\t", " ", "   "])) + lines[i]
        elif op == "char":
            pos = draw(st.integers(0, len(lines[i])))
            char = draw(st.characters(exclude_categories=()))
            lines[i] = lines[i][:pos] + char + lines[i][pos:]
        elif op == "cut":
            text = "\n".join(lines)
            lines = text[: draw(st.integers(0, len(text)))].split("\n")
    return "\n".join(lines)


@settings(FAST, max_examples=EXAMPLES["text"])
@given(text_mutations())
def test_text_mutations_are_accepted_or_explained(text):
    check(text)


# Inputs that broke the loader once: each must stay a clean ScenarioError.
FOUND = {
    "int-4301-digits": QUICK_TEXT.replace("rounds: 40", "rounds: " + "9" * 4301),
    "hex-int-4000-digits": QUICK_TEXT.replace("rounds: 40", "rounds: 0x" + "F" * 4000),
    "hex-int-as-name": QUICK_TEXT.replace("name: quickstart", "name: 0x" + "F" * 4000),
    "sexagesimal-int": QUICK_TEXT.replace(
        "seed: 0", "seed: " + ":".join(["59"] * 3000)
    ),
    "sexagesimal-float": QUICK_TEXT.replace(
        "lr: 0.05", "lr: " + ":".join(["59"] * 300) + ".5"
    ),
    "int-tag-abc": QUICK_TEXT.replace("rounds: 40", "rounds: !!int abc"),
    "int-tag-empty": QUICK_TEXT.replace("rounds: 40", "rounds: !!int ''"),
    "bool-tag-maybe": QUICK_TEXT.replace("seed: 0", "seed: !!bool maybe"),
    "timestamp-tag-x": QUICK_TEXT.replace("seed: 0", "seed: !!timestamp x"),
    "timestamp-month-13": QUICK_TEXT.replace("seed: 0", "seed: !!timestamp 2001-13-45"),
}


@pytest.mark.parametrize("name", FOUND)
def test_inputs_found_by_fuzzing_are_refused_cleanly(name):
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(FOUND[name], SOURCE)
    check_message(str(exc.value))


@pytest.mark.parametrize("value", ["!!int abc", "9" * 4301, "!!bool maybe"])
def test_overrides_found_by_fuzzing_are_refused_cleanly(value):
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(QUICK_TEXT, SOURCE, overrides=[f"rounds={value}"])
    check_message(str(exc.value), (SOURCE, "--set"))


def test_a_billion_laughs_is_refused_in_bounded_time_and_memory():
    outcome, message = isolated(parse_scenario, alias_bomb(9, 9), SOURCE)
    assert outcome == "ScenarioError", f"{outcome}: {message[:1000]}"


# ----------------------------------------------------------- overrides

override_paths = st.one_of(
    st.sampled_from(
        [
            "rounds",
            "seed",
            "name",
            "fleet.groups[0].count",
            "fleet.groups.1.speed.sigma",
            "fleet.groups[99].count",
            "fleet.groups[0].count.deeper",
            "selector.clients_per_round",
            "algorithm",
            "algorithm.name",
            "data",
            "client.lr",
            "resources.workers",
            "a..b",
            ".rounds",
            "rounds.",
            "[0]",
            "fleet.groups[-1].count",
            "fleet.groups[999999999999999999999999].count",
            "",
        ]
    ),
    st.text(max_size=20),
)


@settings(FAST, max_examples=EXAMPLES["overrides"])
@given(
    st.one_of(
        st.builds(lambda p, v: f"{p}={v}", override_paths, snippets),
        st.text(max_size=40),
    )
)
def test_overrides_are_accepted_or_explained(item):
    note(f"--set {item!r}")
    try:
        with time_limit(HANG_S):
            sc = parse_scenario(QUICK_TEXT, SOURCE, overrides=[item])
    except ScenarioError as exc:
        check_message(str(exc), (SOURCE, "--set"))
        event(f"rejected: {kind_of(str(exc))}")
        return
    event("accepted")
    check_accepted(sc)


# ------------------------------------------------ whole hostile documents


def nested(depth: int, style: str) -> str:
    if style == "flow-list":
        return "[" * depth + "]" * depth
    if style == "flow-map":
        return "{a: " * depth + "1" + "}" * depth
    if style == "block-map":
        return "".join("  " * i + "a:\n" for i in range(depth)) + "  " * depth + "1\n"
    return "".join("  " * i + "-\n" for i in range(depth)) + "  " * depth + "1\n"


def alias_bomb(levels: int, breadth: int) -> str:
    lines = ["b0: &b0 [x]"]
    for i in range(1, levels + 1):
        refs = ", ".join([f"*b{i - 1}"] * breadth)
        lines.append(f"b{i}: &b{i} [{refs}]")
    return "\n".join(lines) + "\n"


documents = st.one_of(
    # deep nesting, alone or under a real key
    st.builds(
        lambda d, s, under: (
            (QUICK_TEXT + "\nmodel: " if under else "x: ")
            + ("\n" if s.startswith("block") else "")
            + nested(d, s)
        ),
        st.integers(1, 3000),
        st.sampled_from(["flow-list", "flow-map", "block-map", "block-list"]),
        st.booleans(),
    ),
    # too large, and just under the limit
    st.builds(
        lambda extra, fill: f"name: {fill * (scenario_module.MAX_FILE_BYTES + extra)}",
        st.integers(1, 1000),
        st.sampled_from(["x", "é", "💥"]),
    ),
    st.builds(lambda n: QUICK_TEXT + "\n# " + "x" * n + "\n", st.integers(0, 200_000)),
    # line endings, BOMs, several documents
    st.sampled_from(
        [
            "\ufeff" + QUICK_TEXT,
            QUICK_TEXT.replace("\n", "\r\n"),
            QUICK_TEXT.replace("\n", "\r"),
            QUICK_TEXT.replace("  ", "\t"),
            QUICK_TEXT + "\n---\n" + QUICK_TEXT,
            "--- !!map\n" + QUICK_TEXT,
            "%YAML 1.1\n---\n" + QUICK_TEXT,
            "%YAML 9.9\n---\n" + QUICK_TEXT,
            "%TAG ! tag:yaml.org,2002:python/object/apply:\n---\n!os.system ['true']",
        ]
    ),
    # anything at all
    st.text(st.characters(exclude_categories=()), max_size=400),
    st.binary(max_size=400).map(lambda b: b.decode("latin-1")),
    st.builds(lambda v: yaml.safe_dump(v), values),
)


@settings(FAST, max_examples=EXAMPLES["documents"])
@given(documents)
def test_hostile_documents_are_accepted_or_explained(text):
    check(text)


aliases = st.one_of(
    # "billion laughs": a few hundred bytes that expand to up to 12^12 values
    st.builds(
        lambda lv, br, where: (
            alias_bomb(lv, br)
            + {
                "top": "",
                "model": f"model: *b{lv}\n",
                "key": f"fleet: {{groups: *b{lv}}}\n",
            }[where]
        ),
        st.integers(1, 12),
        st.integers(2, 12),
        st.sampled_from(["top", "model", "key"]),
    ),
    st.sampled_from(
        [
            "&a [*a]",
            "&a {x: *a}",
            "a: &a {b: *a}\nname: x\n",
            "base: &b {x: 1}\nother:\n  <<: *b\n  <<: *b\n",
            "&a [*a, *a, *a]",
        ]
    ),
)


@settings(
    max_examples=EXAMPLES["aliases"],
    deadline=None,  # `isolated` enforces the time limit
    phases=(Phase.explicit, Phase.reuse, Phase.generate),  # no slow shrinking
    suppress_health_check=list(HealthCheck),
    report_multiple_bugs=False,
)
@given(aliases)
def test_alias_bombs_are_refused_safely(text):
    # In a child process: an alias bomb that gets through can eat all memory.
    note(f"input ({len(text)} chars): {text[:2000]!r}")
    event(check_isolated(parse_scenario, text, SOURCE))


def test_anchors_for_shared_settings_still_work():
    text = QUICK_TEXT.replace(
        "network: {down_mbps: 10, up_mbps: 2, latency_s: 0.2}",
        "network: &slow-net {down_mbps: 10, up_mbps: 2, latency_s: 0.2}",
    ).replace(
        "network: {down_mbps: 30, up_mbps: 10, latency_s: 0.1}", "network: *slow-net"
    )
    sc = parse_scenario(text, SOURCE)
    assert sc.fleet.groups[0].network == sc.fleet.groups[1].network


def test_a_file_just_under_the_size_limit_parses_in_bounded_time():
    # The slowest kind of content per byte for the YAML loader.
    n = scenario_module.MAX_FILE_BYTES // 2 - 16
    text = "a: [1" + ",1" * (n - 1) + "]"
    assert len(text.encode()) <= scenario_module.MAX_FILE_BYTES
    t0 = time.monotonic()
    outcome, message = isolated(parse_scenario, text, SOURCE, seconds=30)
    assert outcome == "ScenarioError", f"{outcome} ({time.monotonic() - t0:.0f} s)"
    check_message(message)


# ------------------------------------------------------- files and the CLI


def _load(path: str) -> None:
    load_scenario(path)


HOSTILE_FILES = [
    "dev-zero",
    "fifo",
    "sparse-10GiB",
    "directory",
    "missing",
    "symlink-loop",
    "name-too-long",
    "nul-in-path",
    "not-utf8",
]


def hostile_file(kind: str, d: Path) -> str:
    """A path that is not a readable scenario file, of the given kind."""
    if kind == "dev-zero":
        return "/dev/zero"  # endless, and its size says 0
    if kind == "fifo":
        os.mkfifo(d / "fifo")  # open() blocks until someone writes
        return str(d / "fifo")
    if kind == "sparse-10GiB":
        (d / "big.yaml").touch()
        os.truncate(d / "big.yaml", 10 << 30)
        return str(d / "big.yaml")
    if kind == "directory":
        return str(d)
    if kind == "missing":
        return str(d / "missing.yaml")
    if kind == "symlink-loop":
        os.symlink("loop", d / "loop")
        return str(d / "loop")
    if kind == "name-too-long":
        return str(d / ("x" * 5000))
    if kind == "nul-in-path":
        return str(d / "nul\x00byte.yaml")
    assert kind == "not-utf8"
    (d / "latin1.yaml").write_bytes(b"name: caf\xe9\n")
    return str(d / "latin1.yaml")


@pytest.mark.parametrize("kind", HOSTILE_FILES)
def test_hostile_files_are_refused_safely(tmp_path, kind):
    path = hostile_file(kind, tmp_path)
    outcome, message = isolated(_load, path, seconds=10, memory=512 << 20)
    assert outcome == "ScenarioError", f"{outcome}: {message[:1000]}"
    assert message.startswith(path[:100]), message[:500]


CLI_CASES = {
    "unknown-key": QUICK_TEXT.replace("rounds: 40", "rounds: 40\nroundz: 4"),
    "wrong-type": QUICK_TEXT.replace("rounds: 40", "rounds: [40]"),
    "negative-count": QUICK_TEXT.replace("count: 12", "count: -12"),
    "missing-field": QUICK_TEXT.replace("rounds: 40", ""),
    "malformed-yaml": QUICK_TEXT.replace(
        "model: {name: logreg}", "model: {name: [logreg"
    ),
    "python-object": f"!!python/object/apply:os.system ['touch {PWNED}']\n",
    "missing-file": None,
    "directory": None,
}


CLI_TEST = "test_the_fedsim_command_exits_2_without_a_traceback"


@pytest.fixture(scope="module", autouse=True)
def cli_runs(request, tmp_path_factory):
    """Start the `fedsim` subprocesses of the CLI test as soon as this module
    starts, so that they run while the in-process tests above do (each one
    spends seconds importing torch). Nothing starts if that test is not
    selected."""
    if not any(item.name == CLI_TEST for item in request.session.items):
        yield None
        return
    d = tmp_path_factory.mktemp("cli")
    paths = {}
    for name, text in CLI_CASES.items():
        paths[name] = p = d / f"{name}.yaml"
        if name == "directory":
            p.mkdir()
        elif text is not None:
            p.write_text(text)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "COLUMNS": "200"}
    env.pop("RAY_ADDRESS", None)
    out = d / "out"
    # `validate` on every case; `run` (it shares the loader) on a few, to keep
    # this file fast: tests/test_cli.py runs both commands on the others.
    runs = [(name, ["validate", str(paths[name])]) for name in CLI_CASES]
    runs += [
        (name, ["run", str(paths[name]), "--workers", "0", "--out", str(out)])
        for name in ("python-object", "directory")
    ]

    def fedsim(cmd: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(FEDSIM), *cmd],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=WAIT_S,
        )

    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = [(name, cmd, pool.submit(fedsim, cmd)) for name, cmd in runs]
        yield {"paths": paths, "out": out, "runs": futures}


def test_the_fedsim_command_exits_2_without_a_traceback(cli_runs):
    for name, cmd, future in cli_runs["runs"]:
        r = future.result()
        where = f"fedsim {cmd[0]} ({name}): exit {r.returncode}\n{r.stderr[-3000:]}"
        assert r.returncode == 2, where
        assert "Traceback" not in r.stderr, where
        assert r.stderr.startswith("error:"), where
        assert str(cli_runs["paths"][name]) in r.stderr, where
    assert not cli_runs["out"].exists(), "a bad scenario created a run directory"
    assert not PWNED.exists(), "a YAML payload ran"
