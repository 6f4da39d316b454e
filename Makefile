# The two commands (README): `make run` sets everything up and runs the CPU default pipeline;
# `make test` runs the fast test suite (`make test-all` adds the slow model tests).
# Sharing (docs/sharing.md): `make setup` also gives DVC a default remote if it has none: a directory
# on this machine, outside the repo, set in .dvc/config.local (git-ignored, so nothing
# machine-specific is committed). `make run` ends by pushing outputs + run-cache there (PUSH=0 skips).
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
PARITY_REMOTE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/parity/dvc-remote
PUSH ?= 1

.PHONY: setup remote plots kernel push run test test-all bench clean

setup: $(VENV)/.installed remote plots kernel

# the compare's C loop (parity/ckernel.py), built once per machine into ~/.cache/parity; without a C
# compiler the compare runs on numpy with the same results
kernel: $(VENV)/.installed
	@$(BIN)/python -m parity.ckernel

# offline `dvc plots show/diff`: a page template with Vega inlined (parity/plots.py), set in the
# git-ignored .dvc/config.local like the remote (DVC's own page loads Vega from a CDN)
plots: .dvc/parity-plots.html
	@$(BIN)/dvc config --local plots.html_template parity-plots.html
.dvc/parity-plots.html: $(VENV)/.installed parity/plots.py
	$(BIN)/python -m parity.plots --out $@

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

# idempotent: keeps any default remote already configured (repo, global or local config)
remote: $(VENV)/.installed
	@if $(BIN)/dvc remote default >/dev/null 2>&1; then \
	  echo "parity: DVC default remote: $$($(BIN)/dvc remote default)"; \
	else \
	  mkdir -p "$(PARITY_REMOTE)" && \
	  $(BIN)/dvc remote add --local -f -d local "$(PARITY_REMOTE)" && \
	  echo "parity: DVC default remote 'local' -> $(PARITY_REMOTE) (in .dvc/config.local)"; \
	fi

# outputs of the workspace + the run-cache to the default remote (`dvc push -A --run-cache` for
# every commit's outputs)
push: setup
	$(BIN)/dvc push --run-cache

run: setup
	$(BIN)/parity check
	$(BIN)/dvc repro
ifeq ($(PUSH),1)
	$(BIN)/dvc push --run-cache
endif
	@echo "parity: report at artifacts/report/report.html (Markdown: artifacts/report/report.md)"

# pytest runs as on a user's machine: Python writes bytecode next to the code and output is buffered
# (our CI shells set both variables; tests/test_deps.py checks bytecode makes no stage stale)
PYTEST := env -u PYTHONDONTWRITEBYTECODE -u PYTHONUNBUFFERED $(BIN)/pytest

# tests run in parallel worker processes (pytest-xdist), one per core up to 4 (PYTEST_WORKERS=1: one
# process): most of a test's time is one subprocess at a time (a stage, dvc, git), so a single pytest
# leaves the other cores idle. --dist loadfile: a test file's tests run on one worker, so a
# module-scoped fixture (a pipeline several tests read) is built once, and the Ray cluster tests
# (tests/test_cluster.py) never start two clusters at once.
PYTEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)
XDIST = $(if $(filter 1,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)

test: setup
	$(BIN)/parity deps --check
	$(PYTEST) -q -m "not slow" $(XDIST)

test-all: setup
	$(BIN)/parity deps --check
	$(PYTEST) -q $(XDIST)

bench: setup
	$(BIN)/python benchmarks/bench.py

clean:
	rm -rf artifacts .dvc/tmp
