# The two commands (README): `make run` sets everything up and runs the CPU default pipeline;
# `make test` runs the fast test suite (`make test-all` adds the slow model tests).
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)

.PHONY: setup run test test-all bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

run: setup
	$(BIN)/parity check
	$(BIN)/dvc repro
	@echo "parity: report at artifacts/report/report.html (Markdown: artifacts/report/report.md)"

test: setup
	$(BIN)/pytest -q -m "not slow"

test-all: setup
	$(BIN)/pytest -q

bench: setup
	$(BIN)/python benchmarks/bench.py

clean:
	rm -rf artifacts .dvc/tmp
