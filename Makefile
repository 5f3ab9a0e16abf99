# Tenure: every target does its own set-up on a fresh machine (Python 3.11, Java 17, Maven).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=
# Two pytest workers (pytest-xdist), each test module kept whole on one worker (its module-scoped
# system starts once) and each worker with a broker of its own (the session fixtures are per
# worker). The process tests mostly wait on Kafka and on start-up: serially they keep about a
# third of the two cores busy. The modules marked `serial` (latency bounds, rebalances and
# SIGKILLs on tight deadlines) failed now and then beside another worker's load, so they run
# afterwards, one at a time, with nothing else on the machine. Both phases always run; the
# target fails if either failed (pytest's 5, "nothing collected", is not a failure here).
PYTEST_WORKERS ?= 2
PYTEST_PHASES = \
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile -m "not serial" $(1) $(PYTEST_ARGS); a=$$?; \
	$(BIN)/pytest -m serial $(1) $(PYTEST_ARGS); b=$$?; \
	for rc in $$a $$b; do if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then exit $$rc; fi; done

.PHONY: help install kafka run test test-unit test-integration lint bench bench-leases bench-saga bench-faults bench-broker-restart bench-steps bench-step-floor bench-owner clean

help:
	@echo "make run    - install, fetch Kafka, start the whole system (tenure up)"
	@echo "make test   - install, fetch Kafka, run every test against a real broker"
	@echo "make lint   - ruff + mypy (strict on services/)"
	@echo "make bench  - foundation benchmark; make bench-leases - lease renewals (docs/benchmarks.md)"
	@echo "make bench-saga - unwind overhead (DUR-2); make bench-faults - fault-injection scoreboard (DUR-3)"
	@echo "make bench-broker-restart - time from kill -9 of the bundled broker until it answers again"
	@echo "make bench-steps - durable steps beside DBOS / Restate (issue 11; STEPS_ARGS=--quick for a smoke run)"
	@echo "make bench-step-floor - the broker's CPU per transaction and the HTTP stack's per request (issue 11)"
	@echo "make bench-owner - the owner-per-partition design's core (group commit, no command topics) against DBOS (issue 11)"
	@echo "make bench-breakers - retry herd, fail-fast latency, breaker propagation (issue 13, BRK-2/BRK-3)"
	@echo "make bench-schedules - 10,000 every-minute schedules: firing lag and CPU (issue 15, EXE-14)"
	@echo "make bench-runner-host - managed runner host: trigger -> frozen, trigger -> severed (issue 14, QUA-3)"
	@echo "make browser-deps - Debian's chromium + chromium-driver for the console's browser tests (make test runs it)"
	@echo "make console-screenshots - the web console's main pages into docs/console/*.png (issue 17)"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

kafka: $(STAMP)
	$(BIN)/python -m services.common.broker fetch

# The Confluent wire format's schema registry: Apicurio (in memory) from Maven Central, like Kafka.
.PHONY: schema-registry
schema-registry: $(STAMP)
	$(BIN)/python -m services.common.schema_registry fetch

run: kafka
	$(BIN)/tenure up

test: kafka browser-deps
	$(call PYTEST_PHASES,)

test-unit: $(STAMP)
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile tests/unit tests/contract $(PYTEST_ARGS)

test-integration: kafka
	$(call PYTEST_PHASES,tests/integration tests/e2e)

lint: $(STAMP)
	$(BIN)/ruff check services tests bench
	$(BIN)/mypy services
	$(BIN)/lint-imports

bench: kafka
	$(BIN)/python -m bench.foundation

bench-leases: kafka
	$(BIN)/python -m bench.leases

bench-saga: kafka
	$(BIN)/python -m bench.saga_unwind

bench-broker-restart: kafka
	$(BIN)/python -m bench.broker_restart

# The peers' workload (N=2000 after 200, 8 clients, every recovery scenario): ~25 min on 2 cores.
STEPS_ARGS ?= --out /tmp/tenure-bench-steps.md
bench-steps: kafka
	$(BIN)/python -m bench.durable_steps $(STEPS_ARGS)

bench-step-floor: kafka
	$(BIN)/python -m bench.step_floor

bench-owner: kafka
	$(BIN)/python -m bench.owner_path

# The full scoreboard: 1,000 trajectories per configuration (FAULTS_ARGS to change it).
FAULTS_ARGS ?= --trajectories 1000 --seed 7 --workers 6 --out docs/benchmarks.md --plot docs/fault-scoreboard.png
bench-faults: kafka
	$(BIN)/python -m bench.faults $(FAULTS_ARGS)

# The semantic watchdog's cost per observation, in-process (issue 12; WATCHDOG_ARGS to change it).
WATCHDOG_ARGS ?= --observations 100000 --runs 1000
.PHONY: bench-watchdog
bench-watchdog: $(STAMP)
	$(BIN)/python -m bench.watchdog_detectors $(WATCHDOG_ARGS)

# Observation -> intervention visible to the runner, through the real system (issue 12, WD-5).
WATCHDOG_LATENCY_ARGS ?= --samples 200
.PHONY: bench-watchdog-latency
bench-watchdog-latency: kafka
	$(BIN)/python -m bench.watchdog_latency $(WATCHDOG_LATENCY_ARGS)

# Tool protection through the real gateway (issue 13, BRK-2/BRK-3): the retry herd, fail-fast
# latency when open, breaker propagation between two gateways (BREAKERS_ARGS to change it).
BREAKERS_ARGS ?= --clients 128 --retries 6 --samples 2000 --propagation 30
.PHONY: bench-breakers
bench-breakers: kafka
	$(BIN)/python -m bench.breakers_herd $(BREAKERS_ARGS)

# Issue 14 (QUA-1/QUA-3): trigger -> child frozen / network severed on the managed runner host
# (needs root: cgroups and ip netns); the e2e rows need services/command_api/routes_quarantine.py.
RUNNER_HOST_ARGS ?= --trials 50 --e2e-trials 30 --out /tmp/tenure-bench-runner-host.md
.PHONY: bench-runner-host
bench-runner-host: kafka
	$(BIN)/python -m bench.runner_host $(RUNNER_HOST_ARGS)

# Issue 14 (QUA-3): trigger -> gateway refusing, trigger -> peer read refused, on real processes.
QUARANTINE_ARGS ?= --trials 30
.PHONY: bench-quarantine
bench-quarantine: kafka
	$(BIN)/python -m bench.quarantine $(QUARANTINE_ARGS)

clean:
	rm -rf $(VENV) .tenure .pytest_cache .mypy_cache .ruff_cache .hypothesis

# Schedules (issue 15, EXE-14): N schedules firing every minute through the real processor:
# firing lag (scheduledAt -> run submitted) p50/p99 and the scheduler's CPU (SCHEDULES_ARGS).
SCHEDULES_ARGS ?= --schedules 10000 --minutes 3
.PHONY: bench-schedules
bench-schedules: kafka
	$(BIN)/python -m bench.schedules $(SCHEDULES_ARGS)

# The web console's browser tests (issue 17) drive Debian's headless Chromium through selenium:
# apt installs chromium and chromium-driver once (skipped when both are already on PATH; the
# tests point selenium at /usr/bin/chromium and /usr/bin/chromedriver, never a download).
.PHONY: browser-deps
browser-deps:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then \
		echo "browser-deps: chromium and chromedriver are installed"; \
	else \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver; \
	fi

# The console's screenshots in docs/console/ (issue 17): the browser tests' scene, as an operator.
.PHONY: console-screenshots
console-screenshots: $(STAMP) browser-deps
	$(BIN)/python -m tests.browser.screenshots --out docs/console

# Restore and rebuild (issue 16): ~1M Run events on runs.events, then raw consume, consume +
# Avro decode, processor restore and projection rebuild in one run, each against raw consume.
RESTORE_ARGS ?= --events 1000000
.PHONY: bench-restore
bench-restore: kafka
	$(BIN)/python -m bench.restore $(RESTORE_ARGS)

# The runner SDK as its own wheel (issue 17): tenure-sdk, import name tenure_sdk, httpx + xxhash only.
.PHONY: sdk-wheel
sdk-wheel: $(STAMP)
	$(BIN)/pip wheel --no-deps -w dist ./sdk
