# `make run` and `make test` bootstrap .venv from pinned requirements on a fresh machine.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# The compiled core is built from these: any change rebuilds it, or tests would run
# the stale extension instead of the edited source.
SOURCES := $(shell find src/tickwheel -name '*.py' -o -name '*.c')

.PHONY: run test lint typecheck unit bench clean

$(STAMP): pyproject.toml setup.py requirements-dev.txt $(SOURCES)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip==26.3
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	rm -rf build
	$(BIN)/python -m pip install --quiet --no-build-isolation -e .
	$(BIN)/python -m tickwheel.pipeline.class_archive
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m tickwheel.demo

test: lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check src tests examples

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/python -m tickwheel.bench timers

clean:
	rm -rf $(VENV) build src/*.egg-info
	find src -name '*.so' -delete
