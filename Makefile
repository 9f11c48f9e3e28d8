# muster — `make demo` runs the bundled example, `make test` runs every check.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint typecheck unit quick bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,examples]'
	touch $(STAMP)

demo: install
	bash examples/demo.sh

lint: install
	$(BIN)/ruff check src tests benchmarks examples

typecheck: install
	$(BIN)/mypy

unit: install
	$(BIN)/pytest -q --durations=25

quick: install  # the inner loop: every test that starts no server and no process
	$(BIN)/pytest -q -m "not lifecycle"

test: lint typecheck unit

bench: install
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) .muster-demo .pytest_cache .mypy_cache .ruff_cache
