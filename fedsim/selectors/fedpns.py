"""FedPNS probabilistic node selection.

Node Selection Toward Faster Convergence for Federated Learning on Non-IID
Data. Hongda Wu, Ping Wang. IEEE Transactions on Network Science and
Engineering, 2022. arXiv:2105.07066.

ALGORITHMS.md section 11.3; the probability update is the reference code's
(``models/func.py``, ``probabilistic_selection``). The server half (Optimal
Aggregation, which labels and removes adverse updates) is the ``fedpns``
algorithm (:mod:`fedsim.algorithms.fedpns`); this selector reads its
``labeled`` flags from each round's result:

- state: a probability P_i per node (initially 1/K) and, per node, how many
  times it was selected, labeled and removed (cumulative);
- after each round, every node i labeled this round loses
  delta_i = P_i min((x_i + beta)^alpha, 1), x_i = labeled_i / selected_i;
  the total W = sum delta_i is shared equally by the K - #labeled other
  nodes, selected or not (so sum P = 1 and P >= 0 always; a node with
  x_i >= 1 - beta drops to P_i = 0 when labeled);
- selection: ``clients_per_round`` distinct online nodes, drawn with
  probabilities P (NumPy ``choice`` without replacement, i.e. draws with
  renormalisation), renormalised over the online nodes.

"Selected" counts every selection, as the reference code does (a dropped
update, never examined, still counts). When fewer online nodes than
``clients_per_round`` have P > 0 (the reference code would fail), all of
them are taken and the rest is filled uniformly from the online nodes with
P = 0.

Artifact: after each round, one row per node (``client_id``, ``probability``,
``selected``, ``labeled``, ``removed``) for ``selector.parquet``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from pydantic import Field

from fedsim.selectors.base import (
    Draw,
    Selector,
    SelectorContext,
    SelectorState,
    weighted_pick,
)

if TYPE_CHECKING:
    from fedsim.server import RoundResult

__all__ = ["FedPNS", "update_probabilities"]


def update_probabilities(
    p: Sequence[float],
    selected: Sequence[int],
    labeled_total: Sequence[int],
    labeled_now: Sequence[int],
    alpha: float = 2.0,
    beta: float = 0.7,
) -> np.ndarray:
    """One FedPNS probability update (ALGORITHMS.md 11.3).

    Args:
        p: current probabilities P_i of all K nodes.
        selected: cumulative times each node was selected.
        labeled_total: cumulative times each node was labeled, this round's
            labels included.
        labeled_now: ids of the nodes labeled this round.
        alpha, beta: the decrement's exponent and offset.

    Returns:
        The new probabilities (float64, sum 1).

    Example (the worked example of 11.3):
        >>> update_probabilities([0.2] * 5, [10, 1, 1, 1, 1], [1, 0, 0, 0, 0], [0])
        array([0.072, 0.232, 0.232, 0.232, 0.232])
    """
    q = np.array(p, dtype=np.float64)
    lab = sorted({int(i) for i in labeled_now})
    if not lab:
        return q
    sel = np.asarray(selected, dtype=np.float64)
    tot = np.asarray(labeled_total, dtype=np.float64)
    x = tot[lab] / np.maximum(sel[lab], 1.0)
    delta = q[lab] * np.minimum((x + beta) ** alpha, 1.0)
    q[lab] -= delta
    rest = np.ones(q.size, dtype=bool)
    rest[lab] = False
    if rest.any():
        q[rest] += delta.sum() / rest.sum()
    else:  # every node labeled: nowhere to move the mass, keep it
        q[lab] += delta
    return np.maximum(q, 0.0)


@dataclass(frozen=True)
class FedPNS(Selector):
    """Probabilistic node selection driven by Optimal Aggregation's labels.

    Example:
        >>> import numpy as np
        >>> from fedsim.selectors.base import Draw, SelectorContext
        >>> ctx = SelectorContext.uniform(4)
        >>> sel = FedPNS(clients_per_round=2)
        >>> st = sel.init(ctx)
        >>> draw = Draw(0, np.arange(4), np.random.default_rng(0), ctx)
        >>> ids, st = sel.select(st, draw)
        >>> st["selected"] == [1 if i in ids else 0 for i in range(4)]
        True
    """

    name: Literal["fedpns"] = "fedpns"
    alpha: Annotated[float, Field(gt=0, le=100)] = 2.0
    beta: Annotated[float, Field(ge=0, le=1)] = 0.7

    def init(self, ctx: SelectorContext) -> SelectorState:
        m = ctx.num_clients
        return {
            "p": [1.0 / m] * m,
            "selected": [0] * m,
            "labeled": [0] * m,
            "removed": [0] * m,
        }

    def select(
        self, state: SelectorState, draw: Draw
    ) -> tuple[np.ndarray, SelectorState]:
        cand = draw.candidates
        p = np.asarray(state["p"], dtype=np.float64)[cand]
        ids = np.sort(weighted_pick(cand, p, self.k(draw), draw.rng)).astype(np.int64)
        selected = list(state["selected"])
        for i in ids.tolist():
            selected[i] += 1
        return ids, {**state, "selected": selected}

    def observe(
        self, state: SelectorState, t: int, result: RoundResult, ctx: SelectorContext
    ) -> SelectorState:
        flags = result.info.flags or {}
        labeled_now = sorted(int(c) for c, f in flags.items() if f.get("labeled"))
        removed_now = sorted(int(c) for c, f in flags.items() if f.get("removed"))
        labeled = list(state["labeled"])
        removed = list(state["removed"])
        for i in labeled_now:
            labeled[i] += 1
        for i in removed_now:
            removed[i] += 1
        p = update_probabilities(
            state["p"], state["selected"], labeled, labeled_now, self.alpha, self.beta
        )
        return {**state, "p": p.tolist(), "labeled": labeled, "removed": removed}

    def artifact(self, state: SelectorState, round_: int) -> list[dict[str, Any]]:
        return [
            {
                "client_id": i,
                "probability": float(state["p"][i]),
                "selected": int(state["selected"][i]),
                "labeled": int(state["labeled"][i]),
                "removed": int(state["removed"][i]),
            }
            for i in range(len(state["p"]))
        ]
