# Every target sets itself up in .venv: `make demo` installs the package alone, `make test` adds the dev tools.
# The newest supported interpreter that runs here (the fallback engine is about 15% faster on 3.13 than on 3.12,
# with the same results; see docs/benchmarks.md); PYTHON=... picks another.
ifndef PYTHON
PYTHON := $(firstword $(foreach p,python3.13 python3.12,$(shell $(p) -c "" >/dev/null 2>&1 && echo $(p))))
endif
VENV := .venv
PIP := $(VENV)/bin/python -m pip --quiet --disable-pip-version-check
# What the install compiles (hatch_build.py): a change to any of them reinstalls.
BUILD_INPUTS := pyproject.toml hatch_build.py src/rlx_egraph/_accelerators.py \
	$(wildcard src/rlx_egraph/engines/egglog/_*.py src/rlx_egraph/engines/egglog/_*.pxd)

.PHONY: demo test lint bench clean

$(VENV)/bin/python:
	@test -n "$(PYTHON)" && command -v $(PYTHON) >/dev/null 2>&1 || { echo "need python3.13 or python3.12 on PATH"; exit 1; }
	@echo "[set-up] creating $(VENV) with $(PYTHON)"
	@$(PYTHON) -m venv $(VENV)

# Whether the install compiled the accelerators.
ACCELERATED := $(VENV)/bin/python -c "import rlx_egraph as r; print('[set-up] accelerators:', 'compiled' if \
	r.accelerated() else 'none (no working C compiler: the pure-Python path runs, with the same results, more slowly)')"

# The package and its run-time dependencies, editable; its accelerators compiled when a C compiler works.
$(VENV)/.package: $(VENV)/bin/python $(BUILD_INPUTS)
	@echo "[set-up] installing rlx-egraph and its dependencies into $(VENV) (the accelerators compile if a C compiler works)"
	@$(PIP) install -e .
	@$(ACCELERATED)
	@touch $@

# The package with the dev tools (tests, linters, notebooks, the build requirements for tests/test_packaging.py),
# in one install: the package is built (and its accelerators compiled) once, whether or not `make demo` ran first.
# PIP_COMPILE=0: Python writes the byte code of the modules the suite imports when it first imports them, rather
# than pip compiling every file of every dev tool (most never imported); set in the environment, it also reaches
# the pip that installs the build requirements into the isolated build environment, whose byte code nothing reads.
$(VENV)/.dev: $(VENV)/bin/python $(BUILD_INPUTS)
	@echo "[set-up] installing rlx-egraph, its dependencies and the dev tools (the dev extra) into $(VENV)"
	@PIP_COMPILE=0 $(PIP) install -e '.[dev]'
	@$(ACCELERATED)
	@touch $(VENV)/.package $@

demo: $(VENV)/.package
	@echo "[demo] rlx-egraph demo"
	@$(VENV)/bin/python -m rlx_egraph.cli.main demo

test: $(VENV)/.dev
	$(VENV)/bin/python -m ruff check .
	$(VENV)/bin/python -m pytest -n auto --dist worksteal  # a worker out of tests takes half of another's queue

bench: $(VENV)/.package
	$(VENV)/bin/python -m benchmarks.bench

clean:
	rm -rf $(VENV) build dist .pytest_cache .ruff_cache
