"""FedExP: server step sizes from extrapolation.

FedExP: Speeding Up Federated Averaging via Extrapolation. Divyansh
Jhunjhunwala, Shiqiang Wang, Gauri Joshi. ICLR 2023. arXiv:2301.09604.

The server moves along the average update Delta = sum_i p_i Delta_i by an
adaptive step (the paper's Algorithm 1, with the clients' data weights p_i in
place of its uniform 1/M, which they equal on balanced data):

    eta_g = max(1, sum_i p_i ||Delta_i||^2 / (2 (||Delta||^2 + epsilon)))
    x^{t+1} = x^t + eta_g Delta

When the clients' updates disagree, ||Delta||^2 is small beside their mean
square and the server extrapolates; when they agree, eta_g = 1 (FedAvg).
Not done here: the paper evaluates the average of the last two iterates.

Each round's eta_g is reported as a plug-in metric (``AggregateInfo.metrics``),
so rounds.parquet has it as the column ``alg_eta_g``. With federated
evaluation on (``eval.federated_every``, ``fedeval.yaml``), its rule
(``aggregate_evaluation``) reports the clients' sample-weighted loss and
accuracy and, as a fairness figure, the worst client's accuracy: columns
``fed_loss``, ``fed_accuracy`` and ``fed_worst_accuracy``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from fedsim.api import (
    PLAIN_ROUND,
    AggregateInfo,
    Algorithm,
    ClientEvaluation,
    RoundContext,
    ServerState,
    Updates,
    data_weights,
    meter_average,
    skip_empty_rounds,
    weighted_evaluation,
)
from fedsim.lazy import torch


@dataclass(frozen=True)
class FedExP(Algorithm):
    """FedAvg with the extrapolated server step eta_g (module docstring).

    ``epsilon`` keeps eta_g finite when the average update vanishes (the
    paper uses 1e-3 on most tasks). Hand-computed case: updates [2, 0] and
    [-1, 1] with equal weights average to [0.5, 0.5]; their mean square norm
    is 3 and ||Delta||^2 = 0.5, so eta_g = 3 / (2 * 0.5) = 3:

    >>> from fedsim.api import ClientUpdate
    >>> ups = [ClientUpdate(0, torch.tensor([2.0, 0.0]), 1, 1, 1.0, 0.0),
    ...        ClientUpdate(1, torch.tensor([-1.0, 1.0]), 1, 1, 1.0, 0.0)]
    >>> state, info = FedExP(epsilon=0.0).aggregate({"x": torch.zeros(2)}, ups)
    >>> state["x"], info.metrics
    (tensor([1.5000, 1.5000]), {'eta_g': 3.0})
    """

    epsilon: Annotated[float, Field(ge=0)] = 1e-3

    @skip_empty_rounds
    def aggregate(
        self, state: ServerState, updates: Updates, ctx: RoundContext = PLAIN_ROUND
    ) -> tuple[ServerState, AggregateInfo]:
        p = data_weights(updates)
        # float64 sums in update order, as fedsim's built-ins do (deterministic)
        deltas = torch.stack([u.delta.double() for u in updates])
        weights = torch.tensor(p, dtype=torch.float64)
        mean = weights @ deltas
        spread = float(weights @ (deltas**2).sum(dim=1))
        eta = max(1.0, spread / (2.0 * (float(mean @ mean) + self.epsilon)))
        x = state["x"] + (self.server_lr * eta * mean).to(state["x"].dtype)
        # the meter by fedsim's convention for a step along the p-weighted
        # average (w_i = p_i ||a_i||_1, as for FedAvg), and the step size as
        # the plug-in's own column of rounds.parquet (alg_eta_g)
        info = meter_average(updates, p, metrics={"eta_g": eta})
        return {**state, "x": x}, info

    def aggregate_evaluation(
        self, results: Sequence[ClientEvaluation], round: int
    ) -> dict[str, float]:
        """Federated evaluation: fedsim's sample-weighted mean of the clients'
        loss and accuracy, and the worst client's accuracy (how far the
        extrapolated steps leave the least served client behind).

        >>> rule = FedExP().aggregate_evaluation
        >>> rule([ClientEvaluation(0, 1, 2.0, 0.0),
        ...       ClientEvaluation(1, 3, 1.0, 1.0)], 0)
        {'loss': 1.25, 'accuracy': 0.75, 'worst_accuracy': 0.0}
        """
        out = weighted_evaluation(results)
        accuracies = [r.accuracy for r in results]
        if "accuracy" in out:  # class labels: the worst client is defined
            out["worst_accuracy"] = min(accuracies)
        return out
