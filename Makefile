# Every target bootstraps .venv itself, so each works on a fresh clone.
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: venv demo test bench lint docs format clean

venv:
	@./scripts/ensure-venv.sh

demo: venv
	$(VENV)/bin/foldstream demo

test: venv
	$(PY) -m pytest

bench: venv
	$(PY) -m bench $(BENCH_ARGS)

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
