"""Shakespeare next-character prediction, one client per speaking role (LEAF).

LEAF: A Benchmark for Federated Settings (Caldas et al., 2018,
arXiv:1812.01097); the FedAvg paper's Shakespeare task (McMahan et al.,
AISTATS 2017, arXiv:1602.05629). The file layout, the train/test cut, which
roles become clients and the vocabularies: docs/datasets.md ("Shakespeare").

The input is one plain-text play file (Tiny Shakespeare's layout: a
``NAME:`` line, then the speech, blocks separated by blank lines). Each
role's text is cut once into a training head and a test tail, then into
overlapping windows of ``seq_len`` characters whose target is the next one.
Everything but the optional test subset is deterministic without a seed;
the seed only enters through the partition (``iid``) and that subset.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from pydantic import Field, model_validator

from fedsim.data.base import DataInfo, DatasetSpec, FederatedData, file_bytes
from fedsim.data.errors import DataError, data_root, find_dir
from fedsim.data.partition import NaturalPartition, PartitionSpec, layout, split

# LEAF's 80 characters (its ALL_LETTERS), in its order, so ids are LEAF's
LEAF_VOCAB = (
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
)
_TAG_TEST = 0x5EA4E  # the test subset's own stream of the scenario seed
_TINY = "Tiny Shakespeare's input.txt from karpathy/char-rnn, data/tinyshakespeare"
# a speaker line: a name ending in ":" alone on its line ("First Citizen:");
# a block whose first line is no such name (a stage direction) is skipped
_ROLE = re.compile(r"^[A-Za-z][A-Za-z0-9 ,.'&-]*:$")


class ShakespeareData(DatasetSpec):
    """LEAF-style Shakespeare: next character after ``seq_len`` characters.

    One client per role with at least ``min_samples`` training windows; with
    ``max_clients``, the roles with the most text. The number of clients
    kept must equal the fleet size: a role is a device.
    """

    dataset: Literal["shakespeare"]
    path: str | None = None
    root: str | None = None
    seq_len: Annotated[int, Field(ge=1, le=10_000)] = 80
    stride: Annotated[int, Field(ge=1, le=10_000)] = 1
    max_clients: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    min_samples: Annotated[int, Field(ge=1)] = 64
    test_fraction: Annotated[float, Field(ge=0, lt=1)] = 0.1
    test_samples: Annotated[int, Field(ge=1)] | None = None
    vocab: Literal["leaf", "file"] = "leaf"
    partition: PartitionSpec = NaturalPartition(kind="natural")

    @model_validator(mode="after")
    def _partition_kind(self) -> ShakespeareData:
        """Allow natural (a role per client) and iid only.

        Label-based partitions would split on the next character, which
        says nothing about a client's text.
        """
        if self.partition.kind not in ("natural", "iid"):
            raise ValueError("shakespeare supports partition kinds natural and iid")
        return self

    @property
    def clients(self) -> int | None:
        """``max_clients`` when given (it must equal the fleet size)."""
        return self.max_clients

    def info(self, num_clients: int) -> DataInfo:
        """Windows of ``seq_len`` character ids; about one window per
        ``stride`` bytes of the file (None while the file is not at hand).

        Args:
            num_clients: Unused: the roles fix the clients.
        """
        size = file_bytes(self.locate)
        samples = None if size is None else size // self.stride
        # LEAF's 80 printable characters; a file's own vocabulary is unknown
        # until it is read
        classes = 80 if self.vocab == "leaf" else None
        return DataInfo("sequence", (self.seq_len,), classes, samples)

    def locate(self) -> Path:
        """The play file: ``path`` when given, else input.txt under the root.

        Raises:
            DataMissingError: The file is not there (the message says where
                to get it).
        """
        if self.path is not None:
            p = Path(self.path).expanduser()
            folders, name = [p.parent], p.name
            how = f"give data.path the plain-text play file (e.g. {_TINY})"
        else:
            root, explicit = data_root(self.root)
            folders = [root / "shakespeare", root / "tinyshakespeare"]
            folders += [root] if explicit else []
            name, where = "input.txt", f"{root}/shakespeare/input.txt"
            how = f"place the play text ({_TINY}) at {where}, or set data.path"
        return find_dir("Shakespeare", folders, [name], how, gz=False) / name

    def build(self, num_clients: int, seed: int) -> FederatedData:
        """Parse the play, keep the roles, cut windows, partition.

        Args:
            num_clients: The fleet size; must equal the roles kept.
            seed: The scenario seed (partition and test subset only).

        Returns:
            float32 windows of character ids (``x``) and int64 next-character
            ids (``y``), one client per role under ``natural``; the test set
            is every role's tail.

        Raises:
            DataMissingError: The play file is not there.
            DataError: The roles kept do not match ``num_clients``.
        """
        roles = parse_roles(self.locate().read_text(encoding="utf-8", errors="replace"))
        # " " is always in: encode maps unknown characters to it
        chars = set("".join(roles.values())) | {" "}
        vocab = LEAF_VOCAB if self.vocab == "leaf" else "".join(sorted(chars))
        L, stride, train_share = self.seq_len, self.stride, 1.0 - self.test_fraction
        split_at = {r: int(round(len(t) * train_share)) for r, t in roles.items()}
        kept = self._keep_roles(roles, split_at, num_clients)
        train: list[tuple[np.ndarray, ...]] = []
        test: list[tuple[np.ndarray, ...]] = []
        for role in kept:
            ids, cut = encode(roles[role], vocab), split_at[role]
            train.append(_windows(ids[:cut], L, stride))
            # test windows start at the cut: no test target is a training input
            test.append(_windows(ids[max(0, cut - L) :], L, stride))
        x, y = (np.concatenate(a) for a in zip(*train, strict=True))
        # each window's role, in the sorted order of kept: client i is role i
        g = np.repeat(np.arange(len(kept), dtype=np.int64), [len(t[1]) for t in train])
        order, offsets = layout(split(self.partition, y, num_clients, seed, groups=g))
        test_x, test_y = (np.concatenate(a) for a in zip(*test, strict=True))
        test_x, test_y = self._test_subset(test_x, test_y, seed)
        return FederatedData(
            x=x[order],
            y=y[order],
            offsets=offsets,
            weights=np.diff(offsets).astype(np.float64),
            test_x=test_x,
            test_y=test_y,
            num_classes=len(vocab),
        )

    def _keep_roles(
        self, roles: dict[str, str], split_at: dict[str, int], num_clients: int
    ) -> list[str]:
        """The roles that become clients, sorted by name.

        Args:
            roles: Each role's text.
            split_at: Where each role's text is cut into train and test.
            num_clients: The fleet size.

        Returns:
            The roles with at least ``min_samples`` training windows (the
            ``max_clients`` with the most text, ties by name), sorted by name.

        Raises:
            DataError: Their number is not ``num_clients``.
        """
        L, stride = self.seq_len, self.stride
        # windows of L inputs + 1 target every stride characters: ceil((n-L)/stride)
        n_train = {r: max(0, (split_at[r] - L + stride - 1) // stride) for r in roles}
        eligible = [r for r in roles if n_train[r] >= self.min_samples]
        eligible.sort(key=lambda r: (-len(roles[r]), r))
        kept = sorted(eligible[: self.max_clients] if self.max_clients else eligible)
        if len(kept) != num_clients:
            cap = ""
            if self.max_clients:
                cap = f", capped by max_clients={self.max_clients}"
            raise DataError(
                f"shakespeare: {len(kept)} roles are kept ({len(eligible)} of "
                f"{len(roles)} have at least {self.min_samples} training sequences"
                f"{cap}) but the fleet has {num_clients} devices; each device is one "
                f"role, so set data.max_clients: {num_clients} (the roles with the "
                "most text are kept) or change the fleet size"
            )
        return kept

    def _test_subset(
        self, test_x: np.ndarray, test_y: np.ndarray, seed: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """A seeded random ``test_samples`` of the test windows, in order.

        The full test set of the whole play is large; evaluating on a subset
        keeps rounds cheap. Its own stream, so the subset's size changes no
        other draw.
        """
        if self.test_samples is not None and self.test_samples < len(test_y):
            rng = np.random.default_rng(np.random.SeedSequence([int(seed), _TAG_TEST]))
            keep = np.sort(rng.choice(len(test_y), self.test_samples, replace=False))
            test_x, test_y = test_x[keep], test_y[keep]
        return test_x, test_y


def parse_roles(text: str) -> dict[str, str]:
    """Each role's speeches, concatenated, newlines turned into spaces and
    runs of spaces collapsed (LEAF's preprocessing). Blocks whose first line
    is not ``NAME:`` are skipped.

    Args:
        text: The play file's text.

    Returns:
        Role name -> its whole text, in order of first appearance.
    """
    speeches: dict[str, list[str]] = {}
    for block in text.replace("\r\n", "\n").split("\n\n"):
        head, _, body = block.strip("\n").partition("\n")
        head = head.strip()
        if not body.strip() or not _ROLE.match(head):
            continue
        speeches.setdefault(head[:-1].strip(), []).append(body)
    return {
        role: re.sub(r" {2,}", " ", " ".join(parts).replace("\n", " ")).strip()
        for role, parts in speeches.items()
    }


def encode(text: str, vocab: str) -> np.ndarray:
    """Character ids in ``vocab``; characters outside it read as a space.

    Returns:
        int64 ids, one per character of ``text``.
    """
    # UTF-32 gives one code point per element: a dict lookup per distinct
    # character, not per character, keeps a whole play fast
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    uniq, inverse = np.unique(codes, return_inverse=True)
    index = {c: i for i, c in enumerate(vocab)}
    table = np.array([index.get(chr(u), index[" "]) for u in uniq], np.int64)
    return table[inverse.reshape(-1)]


def _windows(ids: np.ndarray, seq_len: int, stride: int) -> tuple[np.ndarray, ...]:
    """(inputs, next characters) of every ``stride``-th window of ``ids``.

    Returns:
        float32 [windows, seq_len] inputs (the CharLSTM casts them back to
        ids with ``x.long()``) and int64 targets.
    """
    if ids.size <= seq_len:
        return np.zeros((0, seq_len), np.float32), np.zeros(0, np.int64)
    w = sliding_window_view(ids, seq_len + 1)[::stride]
    return w[:, :-1].astype(np.float32), np.ascontiguousarray(w[:, -1])
