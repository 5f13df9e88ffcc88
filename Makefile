# The two commands a newcomer needs: `make demo` and `make test`. Each creates .venv when missing,
# installs what it needs, and runs. Nothing else has to be installed or started by hand.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: demo test lint bench clean venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Stamp files make re-runs cheap; they are rebuilt when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(PIP) install -e .
	@touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[test]'
	@touch $@ $(VENV)/.installed

venv: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/se-bridge demo

lint: $(VENV)/.installed-test
	$(BIN)/ruff check bridge tests bench
	$(BIN)/ruff format --check bridge tests bench

test: $(VENV)/.installed-test lint
	$(BIN)/python -m pytest

bench: $(VENV)/.installed
	$(BIN)/python bench/poll_bench.py

clean:
	rm -rf $(VENV) build dist .pytest_cache .ruff_cache .hypothesis demo-output
