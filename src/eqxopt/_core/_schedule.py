"""Schedules as hyperparameters: the abstract schedule every optimizer field may
hold, the constant one a number becomes, and how a field's value is read at a step."""

import abc
from collections.abc import Mapping
from typing import Any, ClassVar

import equinox as eqx
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import Array, ArrayLike, Float, Int, jaxtyped

from . import _repr
from ._checks import (
    Renamed,
    hyperparameter,
    is_concrete,
    name_converters,
    refuse_renamed,
    renames,
)
from ._tree import default_float


class AbstractSchedule(eqx.Module):
    """A learning-rate (or other hyperparameter) schedule.

    Called on an integer step of shape `()` or `(K,)`, it returns values of the same
    shape in JAX's default float dtype: float32, or float64 under `jax_enable_x64`
    (the dtype every float hyperparameter is stored in). It must work on a traced
    step: no Python `if` on the step. Every float value it holds is an array field,
    so building a schedule with other values reuses the compiled training step.

    Step counts (lengths, boundaries) may be any non-negative integer, as in optax.
    They are int32 fields when they fit, exact; a count beyond int32 is a float32
    field (optax computes with such counts as floats), never rounded down onto an
    int32 step, so every int32 step compares with it exactly. A list of
    boundaries holding one, and the two lengths of a `Cyclic` cycle or the cycles
    of an `SGDR` before the last whose sum is beyond int32, are float32 throughout
    (their entries above 2**24 then round as float32 does).

    A schedule is a function of the step like optax's: `jax.jit(schedule)(step)`
    works. It hashes by identity (as a plain function does; its array fields have
    no hash), so `jax.jit` compiles each schedule object once, with its values as
    constants; pass a schedule into `eqx.filter_jit` as an argument instead to
    share one compiled program between schedules of other values.
    """

    # optax's spelling of an argument -> eqxopt's (`_checks.refuse_renamed`).
    renamed_arguments: ClassVar[Mapping[str, Renamed]] = renames()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name_converters(cls)

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        refuse_renamed(cls, kwargs)
        return super().__new__(cls)

    # Printed with the values, not Equinox's `f32[]` (`_repr`).
    def __repr__(self) -> str:
        return _repr.pformat(self)

    def __pdoc__(self, **kwargs: Any) -> Any:
        return _repr.pdoc(self, **kwargs)

    def __hash__(self) -> int:
        return object.__hash__(self)

    @abc.abstractmethod
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float[Array, "*k"]:
        """The value at each entry of `step`, in the default float dtype."""


class Constant(AbstractSchedule):
    """The same value at every step: `f(s) = value`.

    **Arguments:**

    - `value`: the value (a float or a scalar array; may be traced).
    """

    # Held by another module, it prints as its value: `learning_rate=0.001` (`_repr`).
    _shown_as: ClassVar[str] = "value"

    value: Float[Array, ""]

    def __init__(self, value: float | ArrayLike):
        self.value = hyperparameter("value", value)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float[Array, "*k"]:
        value = jnp.broadcast_to(self.value, jnp.shape(step))
        return value.astype(default_float())


def as_schedule(name: str, value: Any) -> AbstractSchedule:
    """A schedule as given, or a `Constant` (checked to be `>= 0`) for a number."""
    if isinstance(value, AbstractSchedule):
        return value
    if callable(value):
        raise TypeError(
            f"{name} must be a float, a scalar array or an eqxopt schedule module; "
            f"got the callable {value!r}. Wrap plain functions of the step in "
            "eqxopt.Lambda(1.0, fn) (the function is static: a new one recompiles), "
            "or in an eqxopt.AbstractSchedule subclass whose values are array fields"
        )
    return Constant(hyperparameter(name, value, low=0.0))


def value_at(value: Any, step: Int[Array, ""]) -> Any:
    """A hyperparameter field's value at `step`: a schedule is called on it, an array
    (or anything else) is returned as it is."""
    return value(step) if isinstance(value, AbstractSchedule) else value


def known_number(value: Any) -> float | None:
    """The number a hyperparameter field holds if it is known now (not a schedule,
    not traced), for checks across fields at construction; else `None`."""
    if isinstance(value, AbstractSchedule) or not is_concrete(value):
        return None
    return float(jnp.asarray(value))
