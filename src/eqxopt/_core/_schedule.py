"""Schedules as hyperparameters: the abstract schedule every optimizer field may
hold, the constant one a number becomes, and how a field's value is read at a step."""

import abc
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
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
from ._jax_api import holds_tracer
from ._tree import INT32_MAX, default_float


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

    def value_range(self) -> tuple[float, float] | None:
        """The least and the greatest value the schedule takes at the steps an
        optimizer reaches (`0` to `2**31 - 1`, where its step count saturates), in
        the dtype it returns; `None` where they are not known now (a value is
        traced, or the curve is a function of your own, as in `Lambda`).

        An optimizer's field checks them against its bounds at construction, as it
        checks a number (`SGD(momentum=Cyclic(0.8, 1.2, 5))` is refused, naming
        `momentum`). Every schedule eqxopt ships knows its range; one of your own
        says it by overriding `breakpoints` (or this method), and is otherwise not
        checked, as a traced value is not. By default: the least and the greatest
        value at step 0, the last step, each breakpoint and the step before it."""
        if holds_tracer(self):
            return None
        breakpoints = self.breakpoints()
        if breakpoints is None:
            return None
        return range_at(self, [0, INT32_MAX, *breakpoints])

    def breakpoints(self) -> list[Any] | None:
        """The steps at which the curve changes piece (numbers or arrays of them;
        called on a schedule whose values are all known, so NumPy may read them):
        between two of them, and from the last on, its values only rise or only
        fall (or hold), so that its least and greatest values lie at step 0, the
        last step, a breakpoint or the step before one (`value_range`). `None`
        (the default): not known."""
        return None


def range_at(
    schedule: AbstractSchedule, steps: list[Any]
) -> tuple[float, float] | None:
    """The least and the greatest value of `schedule` at `steps` and at the step
    before each (numbers or arrays of them, clipped to the steps an optimizer
    reaches), or `None` where the schedule or a step is traced. Computed now,
    also inside a trace (`jax.ensure_compile_time_eval`)."""
    if holds_tracer((schedule, steps)):
        return None
    flat = np.concatenate(
        [np.ravel(np.asarray(s, np.float64)) for s in steps] or [np.zeros(1)]
    )
    every = np.unique(np.clip(np.floor(np.concatenate([flat, flat - 1])), 0, INT32_MAX))
    # Padded (with step 0) to a power of two, so that schedules of a kind share
    # the compiled evaluation.
    size = max(8, 1 << (len(every) - 1).bit_length())
    padded = np.zeros(size, np.int32)
    padded[: len(every)] = every
    with jax.ensure_compile_time_eval():
        values = np.asarray(_evaluate(schedule, jnp.asarray(padded)), np.float64)
    return float(np.min(values)), float(np.max(values))


@eqx.filter_jit
def _evaluate(schedule: AbstractSchedule, steps: Array) -> Array:
    return schedule(steps)


def check_range(
    name: str,
    schedule: AbstractSchedule,
    *,
    low: float = -math.inf,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
    allow_inf: bool = False,
) -> None:
    """A `ValueError` naming `name` where `schedule`'s values (`value_range`) leave
    `[low, high]` (each end open if asked) or are NaN; nothing where its range is
    not known. (An infinity within the bounds is taken: a growing schedule's
    values overflow at some step whatever the field.)"""
    del allow_inf
    known = schedule.value_range()
    if known is None:
        return
    least, greatest = known
    too_low = least <= low if low_open else least < low
    too_high = greatest >= high if high_open else greatest > high
    if not (math.isnan(least) or math.isnan(greatest) or too_low or too_high):
        return
    left, right = "(" if low_open else "[", ")" if high_open else "]"
    raise ValueError(
        f"{name} must be in {left}{_fmt(low)}, {_fmt(high)}{right} at every step; "
        f"the {type(schedule).__name__} schedule given goes from {least:.6g} to "
        f"{greatest:.6g}"
    )


def _fmt(x: float) -> str:
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(x)


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

    def breakpoints(self) -> list[Any]:
        return []


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


def checked_schedule(name: str, value: Any) -> AbstractSchedule:
    """`as_schedule`, with a schedule's values checked to be `>= 0` too."""
    schedule = as_schedule(name, value)
    if schedule is value:
        check_range(name, schedule, low=0.0)
    return schedule


def value_at(value: Any, step: Int[Array, ""]) -> Any:
    """A hyperparameter field's value at `step`: a schedule is called on it, an array
    (or anything else) is returned as it is."""
    return value(step) if isinstance(value, AbstractSchedule) else value


def known_range(value: Any) -> tuple[float, float] | None:
    """The least and the greatest value a hyperparameter field takes over the
    steps where they are known now (a number: itself twice; a schedule: its
    `value_range`), for checks across fields at construction; else `None`."""
    if isinstance(value, AbstractSchedule):
        return value.value_range()
    number = known_number(value)
    return None if number is None else (number, number)


def known_number(value: Any) -> float | None:
    """The number a hyperparameter field holds if it is known now (not a schedule,
    not traced), for checks across fields at construction; else `None`."""
    if isinstance(value, AbstractSchedule) or not is_concrete(value):
        return None
    return float(jnp.asarray(value))
