"""What FedDC bills per client: without the correction it is FedDyn and sends
one model vector each way (it billed two), with it two (x and c down, delta
and dc up), plus the drift under the paper's aggregation."""

from __future__ import annotations

import pytest

from fedsim.runtime import run_scenario
from fedsim.scenario import load_scenario

from .conftest import SCENARIOS

QUICK = SCENARIOS / "quickstart.yaml"


@pytest.mark.parametrize(
    ("section", "down", "up"),
    [
        ("{name: feddc, alpha: 0.01, correction: false}", 1, 1),
        ("{name: feddc, alpha: 0.01}", 2, 2),
        ("{name: feddc, alpha: 0.01, aggregation: paper}", 2, 3),
        ("{name: feddyn, alpha: 0.01}", 1, 1),
    ],
)
def test_bytes_per_client_count_the_vectors_sent(section, down, up):
    # Prepare: quickstart's logreg on Synthetic's 60 features and 10 classes,
    # d = 60 * 10 + 10 = 610 float32 parameters (4 bytes each)
    sc = load_scenario(QUICK, [f"algorithm={section}", "rounds=1"])
    d = 610
    # Execute
    sim = run_scenario(sc, workers=0)
    # Assert: every client row bills down d and up d 4-byte floats per vector
    assert sc.algorithm.bytes_per_client(sc.facts, d) == (4 * down * d, 4 * up * d)
    rows = [c for c in sim.clients if not c["dropped"]]
    assert rows and all(c["bytes_down"] == 4 * down * d for c in rows)
    assert all(c["bytes_up"] == 4 * up * d for c in rows)
