# The two commands of the README are `make demo` and `make test`; both bootstrap themselves.
# `make help` lists every target.
VENV ?= $(or $(CODECLOG_VENV),$(HOME)/.cache/codeclog/venv)
PY := $(VENV)/bin/python
export CODECLOG_VENV := $(VENV)

.PHONY: help setup setup-demo demo test quick lint typecheck unit bench fixture clean

help:  ## this list
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 14

setup:  ## install what the tests need (once per machine; each step says what and how long)
	@bash scripts/bootstrap.sh test >/dev/null

setup-demo:  ## install what the demo needs, nothing more
	@bash scripts/bootstrap.sh demo >/dev/null

demo: setup-demo  ## the end-to-end demo on a local Kafka broker it fetches and starts itself
	$(VENV)/bin/codeclog demo $(DEMO_ARGS)

lint: setup  ## ruff, the format check and the import layers
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

typecheck: setup  ## mypy
	$(PY) -m mypy

test: setup  ## lint, types and every test, the real-broker ones included (what CI runs)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m mypy
	$(PY) -m pytest -q --durations=25

quick: setup  ## every test but the long tier (a minute or more each)
	CODECLOG_QUICK=1 $(PY) -m pytest -q --durations=25

unit: setup  ## the tests that need no broker
	$(PY) -m pytest -q -m "not kafka"

bench: setup  ## every benchmark once (python -m bench.run_all)
	$(PY) -m bench.run_all

fixture: setup  ## rewrite the tiny vocoder fixture
	$(PY) -m codeclog.vocoder.fixture --write

clean:  ## caches and build outputs
	rm -rf .mypy_cache .ruff_cache .pytest_cache build *.egg-info
