# The two commands a newcomer needs: `make demo` and `make test`. Each creates .venv when missing,
# installs what it needs, and runs. Nothing else has to be installed or started by hand.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: demo test lint bench clean venv infra-tools

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

# The infrastructure checks (tests/test_infra.py, tests/test_installer.py) run checkov and
# pycep-parser, which pin many packages: they get their own virtual environment, never .venv. Its
# own .gitignore keeps it out of git.
INFRA_VENV ?= .venv-infra

$(INFRA_VENV)/.installed: infra/requirements.txt
	$(PYTHON) -m venv $(INFRA_VENV)
	$(INFRA_VENV)/bin/python -m pip --disable-pip-version-check -q install -r infra/requirements.txt
	@echo '*' > $(INFRA_VENV)/.gitignore
	@touch $@

infra-tools: $(INFRA_VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/se-bridge demo

lint: $(VENV)/.installed-test
	$(BIN)/ruff check bridge tests bench
	$(BIN)/ruff format --check bridge tests bench

# SE_BRIDGE_INFRA_VENV tells the tests where the tools are and that they must not skip without them.
test: $(VENV)/.installed-test $(INFRA_VENV)/.installed lint
	SE_BRIDGE_INFRA_VENV=$(abspath $(INFRA_VENV)) $(BIN)/python -m pytest

bench: $(VENV)/.installed
	$(BIN)/python bench/poll_bench.py

clean:
	rm -rf $(VENV) $(INFRA_VENV) build dist .pytest_cache .ruff_cache .hypothesis demo-output
