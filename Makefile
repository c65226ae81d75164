# The two commands of the README are `make demo` and `make test`; both bootstrap themselves.
VENV ?= $(or $(CODECLOG_VENV),$(HOME)/.cache/codeclog/venv)
PY := $(VENV)/bin/python
export CODECLOG_VENV := $(VENV)

.PHONY: setup demo test quick lint typecheck unit bench fixture clean

setup:
	@bash scripts/bootstrap.sh >/dev/null

demo: setup
	$(VENV)/bin/codeclog demo $(DEMO_ARGS)

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

typecheck: setup
	$(PY) -m mypy

# everything: what CI (.ci/run) runs
test: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m mypy
	$(PY) -m pytest -q --durations=25

# a shorter local run: the long tier (a minute or more per test) left out
quick: setup
	CODECLOG_QUICK=1 $(PY) -m pytest -q --durations=25

unit: setup
	$(PY) -m pytest -q -m "not kafka"

bench: setup
	$(PY) -m bench.run_all

fixture: setup
	$(PY) -m codeclog.vocoder.fixture --write

clean:
	rm -rf .mypy_cache .ruff_cache .pytest_cache build *.egg-info
