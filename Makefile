# `make demo` and `make test` are the whole set-up: each creates (or reuses) .venv
# and installs eqxopt from pyproject.toml with the extras it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench lint clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e ".[test,examples,dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/train_digits.py

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pyright

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
