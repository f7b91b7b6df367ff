# kraftlog developer entry points. Every target creates .venv and installs what it needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Dependencies by need: serving installs only what a node runs; tests, benchmarks and the
# Spark pipeline add the `test` and `spark` extras (pyproject.toml).
BASE   := $(VENV)/.installed-base
SERVE  := $(VENV)/.installed-serve
STAMP  := $(VENV)/.installed-all
# OS tools the tests use: kcat (Debian's package; tests/integration/test_kafka_clients.py)
KCAT   := $(VENV)/.installed-kcat
# and chromium (Debian's browser, driven by Playwright without a browser download; tests/browser/)
CHROMIUM := $(VENV)/.installed-chromium

.PHONY: run test test-fast bench pipeline chaos clean venv

venv: $(STAMP)

$(BASE):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip "setuptools>=77" wheel
	touch $(BASE)

$(SERVE): pyproject.toml $(BASE)
	$(PY) -m pip install --quiet -e .
	touch $(SERVE)

$(STAMP): pyproject.toml $(BASE)
	$(PY) -m pip install --quiet -e '.[test,spark]'
	touch $(SERVE) $(STAMP)

$(KCAT): $(BASE)
	@command -v kcat >/dev/null 2>&1 || apt-get install -y -qq kcat >/dev/null 2>&1 || \
		{ apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq kcat >/dev/null 2>&1; } || \
		echo "warning: kcat is not installed and apt-get could not install it (run as root: apt-get install kcat); the kcat test will fail"
	@if command -v kcat >/dev/null 2>&1; then touch $(KCAT); fi

$(CHROMIUM): $(BASE)
	@command -v chromium >/dev/null 2>&1 || apt-get install -y -qq chromium >/dev/null 2>&1 || \
		{ apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1; } || \
		echo "warning: chromium is not installed and apt-get could not install it (run as root: apt-get install chromium); the web console browser tests will fail"
	@if command -v chromium >/dev/null 2>&1; then touch $(CHROMIUM); fi

## run: start a single-node cluster (controller + broker) in the foreground, data in ./data
run: $(SERVE)
	$(VENV)/bin/kraftlog serve --data-dir ./data

## test: the whole suite (unit, functional, integration, spark) in two phases: the tests not
##       marked serial two at a time (pytest-xdist), then the serial ones alone (tests/conftest.py
##       SERIAL_PATHS: timing under faults or load, netns). Both phases run; either failing fails.
TEST_WORKERS ?= 2
test: $(STAMP) $(KCAT) $(CHROMIUM)
	@rc=0; \
	$(PY) -m pytest -q -p no:cacheprovider --durations=15 -n $(TEST_WORKERS) --dist loadfile -m "not serial" tests || rc=1; \
	$(PY) -m pytest -q -p no:cacheprovider --durations=15 -m serial tests || rc=1; \
	exit $$rc

## test-fast: pure cores and in-process tests only
test-fast: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests/unit tests/functional

## bench: benchmarks (figures printed, not asserted)
bench: $(STAMP)
	$(PY) -m bench

## pipeline: the example Spark streaming pipeline end to end against a local cluster
pipeline: $(STAMP)
	$(PY) -m pipelines.clickstream

## chaos: a long fault schedule against a real 3-node cluster; report in chaos-report/
##        (CHAOS_MINUTES=30 by default; CHAOS_PER_KIND=100 instead runs 100 faults of every kind)
CHAOS_MINUTES ?= 30
CHAOS_PER_KIND ?=
CHAOS_LENGTH = $(if $(CHAOS_PER_KIND),--per-kind $(CHAOS_PER_KIND) $(CHAOS_FAST),--minutes $(CHAOS_MINUTES))
CHAOS_FAST = --hold 1.5,2.5 --quiet 0.8,1.5
chaos: $(STAMP)
	$(PY) -m tests.chaos.run $(CHAOS_LENGTH) --report chaos-report

clean:
	rm -rf $(VENV) data .pytest_cache
