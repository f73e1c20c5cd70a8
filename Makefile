# The same steps .ci/run performs, one target each.
VENV ?= .venv

.PHONY: install install-real-llm lint typecheck test bench demo ci

install:
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -e '.[dev]'

# The real_llm tier's model server: builds llama-cpp-python once (portable CPU kernels).
install-real-llm:
	CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" \
		$(VENV)/bin/pip install -e '.[real-llm]'

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck:
	$(VENV)/bin/mypy --strict agent_flow

test:
	$(VENV)/bin/python -m pytest

bench:
	$(VENV)/bin/python benchmarks/bench_context.py
	$(VENV)/bin/python benchmarks/bench_loop.py
	$(VENV)/bin/python benchmarks/bench_memory.py
	$(VENV)/bin/python benchmarks/bench_import.py

demo:
	$(VENV)/bin/agent-flow demo

ci:
	.ci/run
