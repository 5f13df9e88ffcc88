# The two commands a newcomer needs: `make demo` and `make test`. Each creates .venv when missing,
# installs what it needs, and runs. Nothing else has to be installed or started by hand.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: demo test test-fast lint bench clean venv infra-tools azurite kusto strace chromium tools

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

# The infrastructure checks (tests/integration/test_infra.py, tests/integration/test_installer.py) run checkov and
# pycep-parser, which pin many packages: they get their own virtual environment, never .venv. Its
# own .gitignore keeps it out of git.
INFRA_VENV ?= .venv-infra

$(INFRA_VENV)/.installed: infra/requirements.txt
	$(PYTHON) -m venv $(INFRA_VENV)
	$(INFRA_VENV)/bin/python -m pip --disable-pip-version-check -q install -r infra/requirements.txt
	$(INFRA_VENV)/bin/python infra/tools/bicep_lint.py infra/modules/arm-acknowledge.bicep > /dev/null  # pycep's parser tables, once
	@echo '*' > $(INFRA_VENV)/.gitignore
	@touch $@

infra-tools: $(INFRA_VENV)/.installed

# Azurite (Microsoft's Azure Storage emulator, from npm) is the Blob service of the Event Hubs decision
# source's checkpoint tests (tests/azurite.py). Pinned, installed into a project-local folder (ignored
# by git); the stamp names the version, so changing AZURITE_VERSION installs again. 3.35 is the newest
# that runs on Node.js 20 (3.36 wants 21, 3.37 wants 22).
TOOLS           ?= .tools
AZURITE_VERSION ?= 3.35.0

$(TOOLS)/.installed-azurite-$(AZURITE_VERSION):
	mkdir -p $(TOOLS)
	npm install --prefix $(TOOLS) azurite@$(AZURITE_VERSION) --no-audit --no-fund
	@touch $@

azurite: $(TOOLS)/.installed-azurite-$(AZURITE_VERSION)

# Microsoft's Kusto language service (Kusto.Language compiled to JavaScript, npm), which checks every KQL
# text the project ships (tests/integration/test_kql.py, infra/tools/kql_check.js). Pinned, same folder.
KUSTO_VERSION ?= 12.4.1

# After Azurite's install (same folder: two npm installs at once would race on its package.json).
$(TOOLS)/.installed-kusto-$(KUSTO_VERSION): | $(TOOLS)/.installed-azurite-$(AZURITE_VERSION)
	mkdir -p $(TOOLS)
	npm install --prefix $(TOOLS) @kusto/language-service-next@$(KUSTO_VERSION) --no-audit --no-fund
	@touch $@

kusto: $(TOOLS)/.installed-kusto-$(KUSTO_VERSION)

# The demo installs the console's extra too (two small packages): `se-bridge demo --console` keeps a
# fleet and the ops console running for a person to click.
$(VENV)/.installed-demo: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[console]'
	@touch $@ $(VENV)/.installed

demo: $(VENV)/.installed-demo
	$(BIN)/se-bridge demo

lint: $(VENV)/.installed-test
	$(BIN)/ruff check bridge tests bench infra/signer infra/tools deploy/vmapp deploy/enable_vm_application.py
	$(BIN)/ruff format --check bridge tests bench infra/signer infra/tools deploy/vmapp deploy/enable_vm_application.py
	$(BIN)/lint-imports
	$(BIN)/mypy

# The crash-consistency test reads the agent's syscalls with strace (Debian package; installed here
# when missing, as root in CI). The storage-fault tests mount tmpfs and lower fd limits: root too.
strace:
	@command -v strace >/dev/null 2>&1 || { \
	  echo "installing strace (Debian package) for the crash-consistency test"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq strace >/dev/null 2>&1 || \
	  { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq strace >/dev/null; }; }

# The console's pages are tested in a real browser: Playwright (a test dependency) drives Debian's
# chromium, installed here when missing (Playwright's own browser download is not used).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing chromium (Debian package) for the console's browser tests"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 || \
	  { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }; }

# Parallel test workers (pytest-xdist): one more than the cores by default, because the suite mostly
# waits (on its services, brokers and sockets): two workers on two cores kept about one core busy.
# TEST_WORKERS=0 runs in one process. Work stealing (--dist worksteal): a worker that is done takes
# half of another's queue, so one minute-long test met late does not leave the others idle (one
# local run each: 475 s against 513 and 549 s with xdist's default "load").
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
TEST_DIST = $(if $(filter 0,$(TEST_WORKERS)),,--dist worksteal)

# SE_BRIDGE_INFRA_VENV and SE_BRIDGE_AZURITE tell the tests where the tools are, and with
# SE_BRIDGE_FAULT_TESTS=required the storage-fault tests fail (not skip) when tmpfs cannot be mounted;
# SE_BRIDGE_BROWSER_TESTS=required, the console's browser tests when chromium is missing.
# The tools are installed side by side (three independent downloads and installs: about half of a
# fresh checkout's `make test` was spent installing them one after the other).
TOOL_STAMPS := $(VENV)/.installed-test $(INFRA_VENV)/.installed $(TOOLS)/.installed-azurite-$(AZURITE_VERSION) \
	$(TOOLS)/.installed-kusto-$(KUSTO_VERSION) strace chromium

tools:
	$(MAKE) --no-print-directory -j4 $(TOOL_STAMPS)

test: tools
	$(MAKE) --no-print-directory lint
	SE_BRIDGE_INFRA_VENV=$(abspath $(INFRA_VENV)) SE_BRIDGE_AZURITE=$(abspath $(TOOLS)) SE_BRIDGE_KUSTO=$(abspath $(TOOLS)) \
	SE_BRIDGE_FAULT_TESTS=required SE_BRIDGE_BROWSER_TESTS=required $(BIN)/python -m pytest -n $(TEST_WORKERS) $(TEST_DIST)

# Unit and property tests only (no service process, broker or peer): the quick loop while editing.
test-fast: $(VENV)/.installed-test lint
	$(BIN)/python -m pytest -m "not slow" -q

bench: $(VENV)/.installed
	$(BIN)/python bench/poll_bench.py

clean:
	rm -rf $(VENV) $(INFRA_VENV) $(TOOLS) build dist .pytest_cache .ruff_cache .hypothesis demo-output
