"""How optimizers, transforms and schedules print: with their values.

`print(eqxopt.AdamW(1e-3))` shows `AdamW(learning_rate=0.001, b1=0.9, ...)`, where
Equinox's own `repr` shows every array field as its shape (`b1=f32[]`). A value
that cannot be read, or that is not one object's, keeps Equinox's summary: a
tracer (an optimizer built inside `jax.jit`), an array spread over processes, a
large array, and every value of a `population` (recognised by an array with more
axes than its field declares: one value per member). A `Constant` schedule held
by another module prints as its value, as it was most likely given.
"""

import contextlib
import contextvars
import dataclasses
import functools
import types
import typing
from collections.abc import Iterator
from typing import Any

import equinox as eqx
import jax
import numpy as np

from ._jax_api import is_tracer

# Arrays of more elements than this keep Equinox's shape summary.
MAX_ELEMENTS = 16

# Set while the display copy is formatted: its own `__repr__` is then Equinox's.
_formatting = contextvars.ContextVar("eqxopt_formatting", default=False)


class _Shown:
    """A value as text, for the pretty-printer."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _readable(x: Any) -> bool:
    if not isinstance(x, (jax.Array, np.ndarray)) or is_tracer(x):
        return False
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return False
    return x.size <= MAX_ELEMENTS


def _number(x: Any) -> str:
    """A float as Python writes it, with the fewest digits its dtype needs
    (float32's 0.001 is `0.001`, not `0.0010000000474974513`)."""
    if isinstance(x, np.floating):
        return repr(float(np.format_float_positional(x, unique=True, trim="0")))
    return repr(x.item())


def _text(x: Any) -> _Shown:
    value = np.asarray(x)
    if value.ndim == 0:
        return _Shown(_number(value[()]))
    return _Shown(np.array2string(value, separator=", ", formatter={"all": _number}))


def _declared_ndim(annotation: Any) -> int | None:
    """How many axes a field's annotation gives its array (`Float[Array, "n"]`: 1, a
    float hyperparameter: 0), or `None` where it does not say."""
    members = (
        typing.get_args(annotation)
        if typing.get_origin(annotation)
        in (
            typing.Union,
            types.UnionType,
        )
        else (annotation,)
    )
    counts = set()
    for member in members:
        dims = getattr(member, "dim_str", None)
        if isinstance(dims, str):
            if "*" in dims or "..." in dims:
                return None
            counts.add(len(dims.split()))
        elif member in (float, int):
            counts.add(0)
    return max(counts) if counts else None


@functools.cache
def _declared(cls: type) -> dict[str, int]:
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # an annotation that does not resolve says nothing
        return {}
    found = {name: _declared_ndim(hint) for name, hint in hints.items()}
    return {name: n for name, n in found.items() if n is not None}


def _batched(module: Any) -> bool:
    """Whether an array of `module` or of a module it holds has more axes than its
    field declares: values stacked by `population`, one per member."""
    if not dataclasses.is_dataclass(module) or isinstance(module, type):
        if isinstance(module, (list, tuple)):
            return any(_batched(item) for item in module)
        if isinstance(module, dict):
            return any(_batched(item) for item in module.values())
        return False
    declared = _declared(type(module))
    for field in dataclasses.fields(module):
        value: Any = getattr(module, field.name, None)
        ndim = declared.get(field.name)
        if ndim is not None and eqx.is_array(value) and value.ndim > ndim:
            return True
        if _batched(value):
            return True
    return False


def _value_field(x: Any) -> str | None:
    """The field a module prints as when another module holds it (`Constant`'s
    `value`), declared by its class as `_shown_as`."""
    field = getattr(type(x), "_shown_as", None)
    return field if isinstance(field, str) and dataclasses.is_dataclass(x) else None


def display(module: Any) -> Any:
    """A copy of `module` whose readable array fields are their values as text, and
    whose modules declaring `_shown_as` (other than `module` itself) are that
    field's value."""
    if _batched(module):
        return module

    def held(x: Any) -> bool:
        return x is not module and _value_field(x) is not None

    def show(x: Any) -> Any:
        if held(x):
            value = getattr(x, _value_field(x) or "")
            return _text(value) if _readable(value) else x
        return _text(x) if _readable(x) else x

    return jax.tree.map(show, module, is_leaf=held)


@contextlib.contextmanager
def _formatting_display() -> Iterator[None]:
    token = _formatting.set(True)
    try:
        yield
    finally:
        _formatting.reset(token)


def pformat(module: Any) -> str:
    """`module` as `print` shows it (see the module's docstring)."""
    if _formatting.get():
        return eqx.tree_pformat(module)
    with _formatting_display():
        return eqx.tree_pformat(display(module))


def pdoc(module: Any, **kwargs: Any) -> Any:
    """The same, for a module held by another module (Equinox's printer, from
    wadler_lindig, asks each object's `__pdoc__`); `None` for the default."""
    if _formatting.get():
        return None
    import wadler_lindig  # the printer that calls this, so installed

    with _formatting_display():
        return wadler_lindig.pdoc(display(module), **kwargs)
