# Every target sets itself up: a .venv with the project installed (editable) and its dev tools.
# The newest supported interpreter that runs here (the fallback engine is about 15% faster on 3.13 than on 3.12,
# with the same results; see docs/benchmarks.md); PYTHON=... picks another.
ifndef PYTHON
PYTHON := $(firstword $(foreach p,python3.13 python3.12,$(shell $(p) -c "" >/dev/null 2>&1 && echo $(p))))
endif
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml hatch_build.py $(wildcard src/rlx_egraph/*/*.pyx src/rlx_egraph/*/*.pxd)
	@test -n "$(PYTHON)" && command -v $(PYTHON) >/dev/null 2>&1 || { echo "need python3.13 or python3.12 on PATH"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/python -m rlx_egraph.cli.main demo

test: $(STAMP)
	$(VENV)/bin/python -m ruff check .
	$(VENV)/bin/python -m pytest -n auto

bench: $(STAMP)
	$(VENV)/bin/python -m rlx_egraph.bench

clean:
	rm -rf $(VENV) build dist .pytest_cache .ruff_cache
