# Tenure: every target does its own set-up on a fresh machine (Python 3.11, Java 17, Maven).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: help install kafka run test test-unit test-integration lint bench bench-leases clean

help:
	@echo "make run    - install, fetch Kafka, start the whole system (tenure up)"
	@echo "make test   - install, fetch Kafka, run every test against a real broker"
	@echo "make lint   - ruff + mypy (strict on services/)"
	@echo "make bench  - foundation benchmark; make bench-leases - lease renewals (docs/benchmarks.md)"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

kafka: $(STAMP)
	$(BIN)/python -m services.common.broker fetch

run: kafka
	$(BIN)/tenure up

test: kafka
	$(BIN)/pytest $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(BIN)/pytest tests/unit tests/contract $(PYTEST_ARGS)

test-integration: kafka
	$(BIN)/pytest tests/integration tests/e2e $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check services tests bench
	$(BIN)/mypy services

bench: kafka
	$(BIN)/python -m bench.foundation

bench-leases: kafka
	$(BIN)/python -m bench.leases

clean:
	rm -rf $(VENV) .tenure .pytest_cache .mypy_cache .ruff_cache .hypothesis
