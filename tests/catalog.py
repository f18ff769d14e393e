"""The registry the shared property suite (`test_catalog.py`) runs over.

Each family of optimizers lists its cases in a `cases_<family>.py` module of its own,
as `CASES: list[CatalogCase]`; `all_cases()` collects every such module.
"""

import importlib
import pathlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
