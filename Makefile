# The same steps .ci/run performs, one target each.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install lint typecheck test bench demo ci

install:
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -e '.[dev]'

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck:
	$(VENV)/bin/mypy --strict agent_flow

test:
	$(PY) -m pytest

bench:
	$(PY) benchmarks/bench_context.py

demo:
	$(VENV)/bin/agent-flow demo

ci:
	.ci/run
