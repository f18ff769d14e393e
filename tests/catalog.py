"""The registry the shared property suite (`test_catalog.py`) runs over.

Each family of optimizers lists its cases in a `cases_<family>.py` module of its own,
as `CASES: list[CatalogCase]`; `all_cases()` collects every such module.
"""

import importlib
import pathlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

import eqxopt


@dataclass(frozen=True)
class CatalogCase:
    """One optimizer configuration for the shared properties.

    - `name`: the test id.
    - `make`: `make(**overrides)` builds the optimizer; with no overrides it must be
      valid and reduce a small regression loss when stepped.
    - `vary`: `(argument, value)`: another valid value of a float hyperparameter;
      building with it must reuse the compiled step.
    - `invalid`: `(argument, value)` pairs, each of which must raise a `ValueError`
      naming the argument.
    - `tags`: labels such as `"smoke"` (in `make test` for the costly sweeps, see
      `swept`) or `"quantized"`.
    - `extra`: builds the keyword arguments `update`/`step` need beyond grads
      (such as `value=`), from `(loss_fn, params)`.
    """

    name: str
    make: Callable[..., eqxopt.AbstractTransform]
    vary: tuple[str, Any]
    invalid: tuple[tuple[str, Any], ...] = ()
    extra: Callable[[Callable, Any], dict] | None = None
    tags: frozenset[str] = field(default_factory=frozenset)


def all_cases() -> list[CatalogCase]:
    cases = []
    for path in sorted(pathlib.Path(__file__).parent.glob("cases_*.py")):
        cases.extend(importlib.import_module(path.stem).CASES)
    return cases


def _family_modules() -> list[list[CatalogCase]]:
    return [
        importlib.import_module(path.stem).CASES
        for path in sorted(pathlib.Path(__file__).parent.glob("cases_*.py"))
    ]


def swept(cases: list[CatalogCase]) -> list:
    """`cases` as `pytest.param`s for the costly whole-catalog sweeps (native against
    XLA, special values, whole models, complex leaves, traced hyperparameters, None
    gradients, export, ...): the first configuration
    of each family module, and every case tagged `"smoke"`, run in `make test`; the
    others are marked slow, so `make test` stays short while `make test-slow` sweeps
    every case."""
    fast = {family[0].name for family in _family_modules() if family}
    fast |= {case.name for case in cases if "smoke" in case.tags}
    slow = pytest.mark.slow
    return [
        pytest.param(case, id=case.name, marks=() if case.name in fast else slow)
        for case in cases
    ]
