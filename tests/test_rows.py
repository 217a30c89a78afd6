"""fedsim/rows.py: the checked readers of table cells (issue 38)."""

from __future__ import annotations

import math

import pytest

from fedsim.rows import nullable, number, text, whole


def test_number_keeps_ints_floats_and_non_finite_values():
    # Prepare / Execute / Assert: as float(...) would read them
    assert number(3) == 3.0 and isinstance(number(3), float)
    assert number(0.25) == 0.25
    assert math.isinf(number(float("inf"))) and math.isnan(number(float("nan")))


@pytest.mark.parametrize("cell", [None, "0.5", True, [1.0]])
def test_number_refuses_what_is_not_a_number_naming_the_key(cell):
    with pytest.raises(TypeError, match=r"test_accuracy: expected a number"):
        number(cell, "test_accuracy")


def test_whole_takes_ints_and_integral_floats_only():
    assert whole(7) == 7 and whole(7.0) == 7
    for cell in (7.5, float("nan"), None, False, "7"):
        with pytest.raises(TypeError, match=r"round: expected a whole number"):
            whole(cell, "round")


def test_text_and_nullable():
    assert text("fedavg") == "fedavg"
    with pytest.raises(TypeError, match=r"algorithm: expected a string, got 3"):
        text(3, "algorithm")
    assert math.isnan(nullable(None)) and nullable(2) == 2.0
    with pytest.raises(TypeError, match="final_test_loss"):
        nullable("x", "final_test_loss")
