# hoformer: `make demo` runs the main job, `make test` runs the default test suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
export HOFORMER_DATA ?= $(abspath ../shared/data)

.PHONY: install test test-slow demo bench gpu-checks docs clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[all]"
	touch $@

install: $(VENV)/.installed

# one pytest-xdist worker per core; a test that needs a process of its own runs in its worker's process
test: install
	$(PY) -m pytest -q -n auto

test-slow: install
	$(PY) -m pytest -q -m "slow"

demo: install
	$(VENV)/bin/hoformer demo

bench: install
	$(PY) benchmarks/attention.py

gpu-checks: install
	PY=$(PY) bash benchmarks/gpu_checks.sh

# the documentation site (mkdocs.yml) into build/site; --strict: a broken link, anchor or API reference fails
# (not --quiet: it hides the warnings from --strict)
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/site

clean:
	rm -rf $(VENV) build dist *.egg-info src/*.egg-info .pytest_cache
