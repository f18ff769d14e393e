# `make demo` and `make test` are the whole set-up: each creates (or reuses) .venv
# and installs eqxopt from pyproject.toml with the extras it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.installed-docs

.PHONY: demo test test-slow bench lint docs docs-serve clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e ".[test,examples,dev]"
	touch $(STAMP)

# The docs extra, on top of the same .venv.
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[docs]"
	touch $(DOCS_STAMP)

demo: $(STAMP)
	$(PY) examples/train_digits.py

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not slow"

# The whole-catalog sweeps marked slow (CI runs them after make test).
test-slow: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist load -m slow

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pyright

# The documentation site, built into site/ (a broken link or reference fails it).
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis site
