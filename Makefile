# `make demo` and `make test` are the whole set-up: each creates (or reuses) .venv
# and installs eqxopt from pyproject.toml with the extras it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow test-no-native test-oldest bench lint docs docs-serve clean

# KaTeX typesets the site's formulas when it is built (docs/hooks.py), from the npm
# registry at the version katex/package-lock.json pins; the site then carries its
# stylesheet and fonts and needs no network.
KATEX := katex/node_modules/katex/package.json
$(KATEX): katex/package.json katex/package-lock.json
	npm ci --prefix katex --no-audit --no-fund --loglevel=error
	touch $(KATEX)

# The docs extra too: tests/test_site.py builds the site (and KaTeX, below).
$(STAMP): pyproject.toml $(KATEX)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e ".[test,examples,dev,checkpoint,docs]"
	touch $(STAMP)

# The documentation site needs eqxopt (its docstrings are read by importing it) and
# the docs extra only, in a venv of its own: not the test tools (torch, ...).
DOCS_VENV := .venv-docs
DOCS_PY := $(DOCS_VENV)/bin/python
DOCS_STAMP := $(DOCS_VENV)/.installed
$(DOCS_STAMP): pyproject.toml $(KATEX)
	test -x $(DOCS_PY) || $(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_PY) -m pip install --quiet -e ".[docs]"
	touch $(DOCS_STAMP)

demo: $(STAMP)
	$(PY) examples/train_digits.py

# JAX's persistent compilation cache for the test runs: most of a run's time is XLA
# compiling, so a later run (test-no-native after test, or test again after a change)
# loads what an earlier one compiled. `make test TEST_CACHE=` runs without it.
# tests/run_pytest.py runs pytest, and reruns without the cache a test whose worker
# process died (it says which).
TEST_CACHE ?= $(CURDIR)/.jax-test-cache
TEST_ENV = EQXOPT_TEST_COMPILATION_CACHE=$(TEST_CACHE)
# make test has XLA:CPU compile with its least effort (tests/fast_compile.py); the
# runs given this keep XLA's default code generation.
XLA_DEFAULT_CODEGEN = EQXOPT_TEST_FAST_COMPILE=0

# Two workers that take tests from each other's queues as they finish, so that no
# large file leaves one worker idle at the end.
test: $(STAMP)
	$(TEST_ENV) $(PY) tests/run_pytest.py -q -n 2 --dist worksteal -m "not slow"

# The whole-catalog sweeps marked slow (run by hand before a release: on two cores
# they take longer than the rest of CI together).
test-slow: $(STAMP)
	$(TEST_ENV) $(PY) tests/run_pytest.py -q -n 2 --dist load -m slow

# The fast tier on a copy of the package without its native CPU backend
# (src/eqxopt/_native deleted): the core must import and pass every test that does
# not need the kernels (those marked needs_compiler skip). It compiles as XLA does
# by default (`make test` has XLA:CPU compile with its least effort: see
# tests/fast_compile.py), so XLA's own path, what other platforms run, is tested
# with the code users get. NO_NATIVE_TESTS picks the files (default: all, as CI
# runs it).
NO_NATIVE_TESTS ?=
NO_NATIVE := .no-native
test-no-native: $(STAMP)
	rm -rf $(NO_NATIVE) && mkdir -p $(NO_NATIVE) && cp -r src/eqxopt $(NO_NATIVE)/
	rm -rf $(NO_NATIVE)/eqxopt/_native
	$(TEST_ENV) PYTHONPATH=$(NO_NATIVE) EQXOPT_TEST_WITHOUT_NATIVE=1 EQXOPT_TEST_REQUIRE_NATIVE=0 \
		$(XLA_DEFAULT_CODEGEN) \
		$(PY) tests/run_pytest.py -q -n 2 --dist worksteal -m "not slow" -p no:cacheprovider \
		$(NO_NATIVE_TESTS)
	rm -rf $(NO_NATIVE)

# The oldest versions pyproject.toml allows: every runtime dependency pinned at its
# floor (`>=` read as `==` from [project] dependencies), the test tools at the newest
# that run there (pip resolves them: optax 0.2.5 is the last for JAX < 0.5.3), in a
# venv of its own, on a fast subset (catalog, references, schedules; not slow), and
# every configuration's traced hyperparameters and None gradients, which `make test`
# sweeps only in part and which lean most on the JAX version; with XLA's default
# code generation.
OLDEST_VENV := .venv-oldest
OLDEST_PY := $(OLDEST_VENV)/bin/python
OLDEST_STAMP := $(OLDEST_VENV)/.installed
OLDEST_PINS = $(shell $(PYTHON) -c 'import tomllib; d = tomllib.load(open("pyproject.toml", "rb")); print(" ".join(r.replace(">=", "==") for r in d["project"]["dependencies"]))')
# optax < 0.2.6 gives NaN for schedules whose values are all zero (a bug fixed in
# 0.2.6, which needs JAX 0.5.3); these two property tests draw such schedules.
OLDEST_DESELECT := \
	--deselect tests/test_schedules.py::test_random_piecewise_schedules_match_optax \
	--deselect tests/test_schedules.py::test_random_one_cycles_match_optax

$(OLDEST_STAMP): pyproject.toml
	test -x $(OLDEST_PY) || $(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_PY) -m pip install --quiet -e ".[test,plot]" $(OLDEST_PINS)
	touch $(OLDEST_STAMP)

test-oldest: $(OLDEST_STAMP)
	$(OLDEST_PY) -c 'import jax, equinox; print("oldest: jax", jax.__version__, "equinox", equinox.__version__)'
	$(XLA_DEFAULT_CODEGEN) $(OLDEST_PY) -m pytest -q -n 2 --dist load -m "not slow" $(OLDEST_DESELECT) \
		tests/test_catalog.py tests/test_references.py tests/test_schedules.py
	$(XLA_DEFAULT_CODEGEN) $(OLDEST_PY) -m pytest -q -n 2 --dist load -m slow \
		tests/test_catalog.py::test_hyperparameters_may_be_traced \
		tests/test_catalog.py::test_none_gradients_leave_leaf_and_its_state_alone

# README's and docs/performance.md's benchmark tables are written from the
# results.json it writes (tests/test_figures.py holds them to it).
bench: $(STAMP)
	$(PY) benchmarks/run_all.py
	$(PY) docs/make_figures.py

lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pyright

# The documentation site, built into site/ (a broken link or reference fails it).
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(DOCS_PY) -m mkdocs build --strict

docs-serve: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(DOCS_PY) -m mkdocs serve

clean:
	rm -rf $(VENV) $(OLDEST_VENV) $(DOCS_VENV) $(NO_NATIVE) $(TEST_CACHE) .pytest_cache .hypothesis site \
		katex/node_modules
