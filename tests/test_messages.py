"""What the user reads is true and valid: summary.json is JSON (no NaN),
plug-in references say what they hold, refusals name their field once and
offer the closest known name, and nothing says "interrupted" twice."""

from __future__ import annotations

import json
import math

import numpy as np

from fedsim.results import write_summary


def _strict(text: str) -> object:
    """json.loads refusing NaN and infinities, as any other JSON reader does."""

    def refuse(name: str) -> object:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_summary_json_writes_null_for_a_mean_that_has_no_value(tmp_path):
    # Prepare: a device group never selected has no mean (NaN), at depth
    summary = {
        "final_accuracy": 0.5,
        "groups": {"phones": {"mean_tau": math.nan}, "laptops": {"mean_tau": 3.0}},
        "curve": [1.0, np.float64("nan"), math.inf],
    }

    # Execute
    write_summary(tmp_path / "summary.json", summary)

    # Assert: valid JSON, every other value as it was
    read = _strict((tmp_path / "summary.json").read_text())
    assert read == {
        "final_accuracy": 0.5,
        "groups": {"phones": {"mean_tau": None}, "laptops": {"mean_tau": 3.0}},
        "curve": [1.0, None, None],
    }
