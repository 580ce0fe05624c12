# `make run` and `make test` bootstrap .venv from pinned requirements on a fresh machine.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEPS := $(VENV)/.deps-stamp
# The compiled core is built from these: any change rebuilds it, or tests would run
# the stale extension instead of the edited source.
SOURCES := $(shell find src/tickwheel -name '*.py' -o -name '*.c')

.PHONY: run test check lint typecheck unit core-built bench clean browser

$(DEPS): requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip==26.3
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	touch $(DEPS)

$(STAMP): $(DEPS) pyproject.toml setup.py $(SOURCES)
	rm -rf build
	$(BIN)/python -m pip install --quiet --no-build-isolation -e .
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m tickwheel.demo

test: lint typecheck unit core-built

# The fast loop: lint, types, and the tests that need neither Spark nor a slow run, on
# the pure-Python sources copied as they are now (nothing compiled, nothing rebuilt).
# Four test processes whatever the cores: these tests wait on child processes and the
# real clock for about a quarter of their time, which two more processes fill.
PURE := .check-src
check: $(DEPS)
	$(BIN)/ruff check src tests examples benchmarks
	$(BIN)/mypy
	rm -rf $(PURE)
	$(BIN)/python -c "import shutil; shutil.copytree('src/tickwheel', '$(PURE)/tickwheel', \
		ignore=shutil.ignore_patterns('*.so', '__pycache__'))"
	PYTHONPATH=$(abspath $(PURE)) $(BIN)/pytest -q -p no:cacheprovider -n 4 \
		-m "not spark and not slow" \
		--ignore=tests/test_build.py

lint: $(STAMP)
	$(BIN)/ruff check src tests examples benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

# Two test processes or more (one per core, at most four): most of the slow tests wait on
# a JVM or a child process, and each process starts its own Spark session.
# The tests' JVMs live seconds to minutes, too short for the JIT's optimising tier to pay
# back its compiling: the first tier only and the serial collector take about a fifth off
# the Spark tests (docs/benchmarks.md). Every JVM a test starts inherits this.
TEST_JVM := -XX:TieredStopAtLevel=1 -XX:+UseSerialGC
unit: $(STAMP) browser
	JAVA_TOOL_OPTIONS="$(TEST_JVM)" $(BIN)/pytest -q -n auto --maxprocesses 4 --durations=40

# The console's tests drive Debian's Chromium through Playwright (whose own browser
# download is not used): installed here where apt can, skipped with a note where not.
browser:
	@command -v chromium >/dev/null || test -x /usr/bin/chromium || { \
		echo "browser: installing Debian's chromium for the console's tests"; \
		apt-get install -y -qq chromium >/dev/null 2>&1 || \
		{ apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1; } || \
		echo "browser: no chromium (apt-get install chromium): the console's browser tests are skipped"; }

# The core (timers, purgatory, dispatcher, asyncio loop) as a user builds it: a plain
# isolated `pip install .` (its build requirements fetched from the registry, no extras)
# compiles it, then its tests and CPython's own asyncio tests run against the installed
# package. On Python 3.13 where one is found (on PATH, or under pyenv's root), so that
# the core is tested on a second interpreter too; on the default Python otherwise.
CORE_TESTS := tests/timers tests/purgatory tests/broker tests/dispatch tests/aio \
	tests/test_clock.py tests/test_mutex.py
VCORE := .venv-core
STAMPCORE := $(VCORE)/.installed-stamp

$(STAMPCORE): pyproject.toml setup.py $(SOURCES)
	@py=$(PYTHON); for c in python3.13 $$(ls -d "$${PYENV_ROOT:-$$HOME/.pyenv}"/versions/3.13*/bin/python3.13 2>/dev/null); do \
		if $$c -c 'import sys; assert sys.version_info[:2] == (3, 13)' 2>/dev/null; then py=$$c; break; fi; \
	done; \
	echo "core-built: building the core as a user does, on $$($$py --version)"; \
	rm -rf $(VCORE) && $$py -m venv $(VCORE) && \
	$(VCORE)/bin/python -m pip install --quiet pip==26.3 pytest==9.2.0 hypothesis==6.170.15 \
		pytest-xdist==3.8.0 execnet==2.1.2 && \
	$(VCORE)/bin/python -m pip install --quiet --no-deps . && \
	$(VCORE)/bin/python tests/built_core.py
	touch $(STAMPCORE)

core-built: $(STAMPCORE)
	$(VCORE)/bin/python -m pytest -q -p no:cacheprovider -n auto --maxprocesses 4 $(CORE_TESTS)

bench: $(STAMP)
	$(BIN)/python -m benchmarks timers

clean:
	rm -rf $(VENV) $(VCORE) $(PURE) build src/*.egg-info
	find src -name '*.so' -delete
