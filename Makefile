# Every target bootstraps .venv itself, so each works on a fresh clone.
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: venv demo test bench nemesis lint docs format clean

venv:
	@./scripts/ensure-venv.sh

demo: venv
	$(VENV)/bin/foldstream demo

# Test modules mostly wait (for brokers, instances, timeouts): two workers, each with its own
# broker. A module runs whole on one worker (its tests share its instances), and each worker
# takes the modules in their usual order (modules that share a worker's broker run in the order
# a plain `pytest` runs them).
TEST_WORKERS ?= 2

test: venv
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

bench: venv
	$(PY) -m bench $(BENCH_ARGS)

# Faults injected into 3 Kafka nodes and 3 instances under load, the history checked
# (docs/concepts/guarantees.md); as root, for the network partitions.
SEED ?= 1
DURATION ?= 600
nemesis: venv
	$(PY) -m tests.nemesis --seed $(SEED) --duration $(DURATION)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	./scripts/check-imports.sh

docs: venv
	./scripts/build-docs.sh

format: venv
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) .foldstream .pytest_cache *.egg-info site build
