"""Plug-ins at fedsim's edges (issue 37's defects 1, 2, 4 and 5, and issue
39's misbehaving plug-ins caught before training): the package Ray's workers
import, a plug-in module that fails at import, state that is not a tensor,
compare's and stress's import-path arms, and the refusals that name the
plug-in, the hook and what was expected.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .conftest import ROOT, fedsim_here

EXAMPLE = ROOT / "examples" / "fedsim_example"
SCENARIO = EXAMPLE / "scenario.yaml"


@pytest.fixture(autouse=True)
def example_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))


# ------------------------------------------- defect 1: the package on Ray workers
def test_workers_get_the_package_folder_only_when_the_path_lacks_it(monkeypatch):
    import fedsim
    from fedsim.ray_session import worker_code_paths

    # Prepare: the folder holding this process's fedsim
    home = str(Path(fedsim.__file__).resolve().parent.parent)
    # Execute / Assert: on sys.path (site-packages, a checkout run from its
    # root) nothing is added; found only by an import hook (an editable
    # install), the folder is given to the workers
    monkeypatch.setattr(sys, "path", [home, *sys.path])
    assert worker_code_paths() == []
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in (home, "")])
    monkeypatch.chdir("/")
    assert worker_code_paths() == [home]


@pytest.mark.ray
def test_an_error_in_a_ray_worker_is_one_plain_line(tmp_path, ray_session):
    # Prepare: a plug-in module this process imports (its folder on sys.path
    # here) that the Ray workers cannot (their path lacks it)
    (tmp_path / "driver_only_algo.py").write_text(
        "from fedsim_example.fastest import FastestK as DriverOnly\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        # Execute
        p = fedsim_here(
            "compare",
            str(SCENARIO),
            "-a",
            "fedavg",
            "--set",
            "selector.name=driver_only_algo:DriverOnly",
            "--seeds",
            "1",
            "--workers",
            "1",
            "--out",
            str(tmp_path / "cmp"),
            "--quiet",
        )
    finally:
        sys.path.remove(str(tmp_path))
    # Assert: one line, no terminal codes, the cause and the worker named
    lines = p.stderr.strip().splitlines()
    assert p.returncode in (1, 2) and len(lines) == 1, p.stderr[-3000:]
    assert "\x1b" not in p.stderr
    assert "driver_only_algo" in lines[0] and "in Ray worker pid" in lines[0]
