# `make run` and `make test` are all a fresh clone needs.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

# Keep every Ray this project starts on loopback and offline.
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER := 0
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: run test test-quick venv lint clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch and torchvision first, pinned to the wheels this platform ships.
	$(BIN)/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/fedsim run scenarios/quickstart.yaml

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-quick: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not ray and not cluster"

lint: $(STAMP)
	$(BIN)/ruff check fedsim tests benchmarks
	$(BIN)/ruff format --check fedsim tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache
