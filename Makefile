# Every target sets itself up: a .venv with the project installed (editable) and its dev tools.
PYTHON ?= python3.12
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml hatch_build.py $(wildcard src/rlx_egraph/*/*.pyx)
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (Python 3.12+) on PATH"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/python -m rlx_egraph.cli.main demo

test: $(STAMP)
	$(VENV)/bin/python -m ruff check .
	$(VENV)/bin/python -m pytest

bench: $(STAMP)
	$(VENV)/bin/python -m rlx_egraph.bench

clean:
	rm -rf $(VENV) build dist .pytest_cache .ruff_cache
