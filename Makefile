# Every target creates (once) and reuses the virtual environment in .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.DEFAULT_GOAL := help

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[all,dev]'
	touch $(STAMP)

.PHONY: install
install: $(STAMP) ## Create .venv and install the project with every extra

.PHONY: demo
demo: $(STAMP) ## Run the support-ticket demo on the embedded default (SQLite, no services)
	$(BIN)/python -m workers.demo

.PHONY: serve
serve: $(STAMP) ## Serve the HTTP API with the demo agents on http://127.0.0.1:8000 (SQLite, embedded worker)
	$(BIN)/agent-runner serve --agents workers.demo:build_agent $(SERVE_ARGS)

.PHONY: services
services: ## Start local PostgreSQL and Redis if they are down (no-op when they run)
	@bash deploy/local-services.sh

.PHONY: browser-deps
browser-deps: ## Install Debian's chromium and chromium-driver for the browser tests (once; quiet when present)
	@command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || { \
		echo "installing chromium and chromium-driver (Debian packages)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }

.PHONY: test
test: $(STAMP) services browser-deps ## Run every test: unit, contract over all backends, integration with real services
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

.PHONY: test-unit
test-unit: $(STAMP) ## Fast tests that need no services
	$(BIN)/python -m pytest -q -m "not integration" tests/unit tests/test_architecture.py tests/test_layout.py $(PYTEST_ARGS)

.PHONY: chaos
chaos: $(STAMP) services ## Long soak and chaos runs
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)

.PHONY: lint
lint: $(STAMP) ## ruff format check and lint
	$(BIN)/ruff format --check agent_runner store workers tests bench
	$(BIN)/ruff check agent_runner store workers tests bench

.PHONY: format
format: $(STAMP) ## Format and autofix
	$(BIN)/ruff format agent_runner store workers tests bench
	$(BIN)/ruff check --fix agent_runner store workers tests bench

.PHONY: typecheck
typecheck: $(STAMP) ## Strict mypy over agent_runner, store, workers and tests (the packages in pyproject.toml)
	$(BIN)/mypy

.PHONY: bench
BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[all,dev,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) services ## Run every benchmark; writes docs/benchmarks.md and docs/bench_*.png (BENCH_ARGS=--quick for a smoke run)
	$(BIN)/python bench/run.py $(BENCH_ARGS)

.PHONY: all
all: lint typecheck test ## Lint, typecheck and test

.PHONY: clean
clean: ## Remove the virtual environment and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis .agent-runner

.PHONY: help
help: ## Show this help
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-12s %s\n", $$1, $$2}'
