# Two set-up commands for a fresh machine: `make demo` (the main job) and `make test` (the test suite);
# `make docs` builds the documentation site into site/ (mkdocs build --strict).
# Both create the virtual environment in .venv on first use and reuse it afterwards.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.modeconn-installed
MODECONN_DATA ?= $(abspath ../shared/data)
export MODECONN_DATA
# One OpenMP thread unless told otherwise: on small shared machines torch's default thread pool can be 20x
# slower when other processes compete for the cores (the tests' models are tiny anyway).
OMP_NUM_THREADS ?= 1
export OMP_NUM_THREADS

.PHONY: demo test test-fast lint docs bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/modeconn demo

test: $(STAMP)
	$(VENV)/bin/ruff check src tests
	$(PY) -m pytest -q

# Local work: the fast tier (no tests marked slow or experiment), a few minutes on 2 cores.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not experiment"

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests

docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(PY) -m pip install -q rebasin
	$(PY) -m pip install -q 'lapx>=0.5'
	cd benchmarks && ../$(PY) bench_weight_matching.py && ../$(PY) bench_train.py && ../$(PY) bench_lap.py && \
		../$(PY) bench_sparse_lap.py && ../$(PY) bench_wm_sparse_lap.py && \
		../$(PY) bench_evaluate_path.py && ../$(PY) bench_wm_scaling.py && ../$(PY) bench_dual_step.py

clean:
	rm -rf $(VENV) runs site .pytest_cache
