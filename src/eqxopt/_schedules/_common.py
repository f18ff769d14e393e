"""What the schedules share: their field declarations (a schedule's own values are
numbers, its lengths step counts), the checks of lists of steps and of values that
depend on each other, and the pieces of curves several schedules draw."""

import dataclasses
import operator
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from .._core._checks import hyperparameter, is_concrete, step_count
from .._core._fields import hyper
from .._core._tree import INT32_MAX, default_float

# What a schedule's float value and step-count fields take (a number or a scalar
# array) and hold (a float scalar array; an int32 one for a count, float32 when the
# count is beyond int32).
Value: TypeAlias = Float[ArrayLike, ""]
Count: TypeAlias = Int[ArrayLike, ""]
# What a list of steps (boundaries, milestones) takes; held as a 1-D count array.
Steps: TypeAlias = Sequence[int] | Int[ArrayLike, " n"]

REQUIRED: Any = dataclasses.MISSING

# A schedule's own values are numbers (`schedule=False`): the schedule is the
# function of the step, and a schedule given as one of its values would be called
# nowhere.


def value_field(default: Any = REQUIRED) -> Any:
    """A finite value `>= 0` (a rate, a peak, a floor)."""
    return hyper(default, low=0.0, high_open=True, schedule=False)


def factor_field(default: Any = REQUIRED) -> Any:
    """A finite value `> 0` (a factor, a power, a divisor)."""
    return hyper(default, low=0.0, low_open=True, high_open=True, schedule=False)


def check_value(name: str, value: Any) -> Float[Array, ""]:
    """A value as `value_field` checks it, for values inside other arguments."""
    return hyperparameter(name, value, low=0.0, high_open=True)


def check_factor(name: str, value: Any) -> Float[Array, ""]:
    """A factor as `factor_field` checks it, for values inside other arguments."""
    return hyperparameter(name, value, low=0.0, low_open=True, high_open=True)


def optional_value(
    name: str, value: float | ArrayLike | None
) -> Float[Array, ""] | None:
    """`None`, or a value as `value_field` checks it (for `checked_field`)."""
    return None if value is None else check_value(name, value)


_RELATIONS: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def check_order(
    first: str,
    a: Any,
    relation: str,
    second: str,
    b: Any,
    *,
    counts: bool = False,
    where: str = "",
) -> None:
    """A `ValueError` naming both arguments unless `a relation b` (`"<="`, ...);
    nothing when either is traced (its number is not known until run time).
    `counts` prints them as integers; `where` (say `"cycles[1]"`) prefixes the
    names as dict keys."""
    if not (is_concrete(a) and is_concrete(b)):
        return
    kind = int if counts else float
    x, y = kind(np.asarray(a)), kind(np.asarray(b))
    if not _RELATIONS[relation](x, y):
        label = (lambda n: f"{where}[{n!r}]") if where else (lambda n: n)
        raise ValueError(
            f"{label(first)} must be {relation} {label(second)}, got {first}={x!r} "
            f"and {second}={y!r}"
        )


def boundary_steps(
    name: str,
    boundaries: Sequence[int] | ArrayLike,
    *,
    strictly_increasing: bool = False,
) -> Int[Array, " n"]:
    """A sorted sequence of integer steps `>= 0` as an int32 array (float32 if one
    is beyond int32); for `checked_field`."""
    if isinstance(boundaries, (str, bytes)) or not isinstance(
        boundaries, (list, tuple, np.ndarray, jax.Array)
    ):
        raise TypeError(
            f"{name} must be a sequence of integer steps, got "
            f"{type(boundaries).__name__}"
        )
    if isinstance(boundaries, (np.ndarray, jax.Array)) and jnp.ndim(boundaries) != 1:
        raise ValueError(
            f"{name} must be one-dimensional, got shape {boundaries.shape}"
        )
    counts = [step_count(f"{name}[{i}]", b) for i, b in enumerate(boundaries)]
    if not counts:
        return jnp.zeros((0,), jnp.int32)
    if all(is_concrete(c) for c in counts):
        values = [int(c) for c in counts]
        for i in range(1, len(values)):
            bad = (
                values[i] <= values[i - 1]
                if strictly_increasing
                else (values[i] < values[i - 1])
            )
            if bad:
                order = "strictly increasing" if strictly_increasing else "sorted"
                raise ValueError(f"{name} must be {order}, got {values}")
    return jnp.stack(joined(*counts))


def fraction_of(raw: Any, checked: Array, total: Array, rounding: Any) -> Array:
    """`rounding(raw * total)` as an int32 scalar, for a fraction of a step count.

    optax computes `int(pct * transition_steps)` in Python floats. When both numbers
    are known this does the same with the value as given (a Python float is a
    float64), so rounding `0.9` to float32 (0.8999999762) never moves a boundary by
    one step (`int(0.9 * 10) == 9`, `int(float32(0.9) * 10) == 8`). Traced values
    use the checked array.
    """
    if is_concrete(raw) and is_concrete(total):
        return step_count(
            "a fraction of a step count",
            int(rounding(float(np.asarray(raw, dtype=np.float64)) * int(total))),
        )
    fraction, count = joined(checked, total)
    exact = fraction * count
    rounded = jnp.floor(exact) if rounding is int else jnp.round(exact)
    if jnp.issubdtype(total.dtype, jnp.integer):
        return rounded.astype(jnp.int32)
    return rounded.astype(jnp.float32)  # a fraction of a count beyond int32


def int_steps(count: Array) -> Int[Array, "*n"]:
    """A count field as int32 steps to subtract from a step: itself, or for a
    count stored beyond int32 the largest int32 a float32 holds (only used where
    `step < count` has already chosen the other branch)."""
    if jnp.issubdtype(count.dtype, jnp.integer):
        return count
    return jnp.minimum(count, float(2**31 - 128)).astype(jnp.int32)


def steps(count: Any) -> np.ndarray:
    """A known step count (or array of them) as float64, for sums of counts that
    int32 would overflow (`breakpoints`)."""
    return np.asarray(count, np.float64)


def joined(*values: Any) -> list[Array]:
    """`values` (int32 steps and counts, float32 counts beyond int32, float values)
    cast to the dtype standard promotion joins them in, so that mixed arithmetic
    means the same under JAX's strict promotion (which refuses it)."""
    arrays = [jnp.asarray(v) for v in values]
    with jax.numpy_dtype_promotion("standard"):
        dtype = jnp.result_type(*arrays)
    return [a.astype(dtype) for a in arrays]


def sum_overflows(*counts: Array) -> bool:
    """Whether the sum of int32 `counts` (which a schedule forms in their dtype)
    is beyond int32; the caller then keeps them as float32 instead."""
    return (
        all(is_concrete(c) for c in counts)
        and all(jnp.issubdtype(c.dtype, jnp.integer) for c in counts)
        and sum(int(np.sum(np.asarray(c, np.int64))) for c in counts) > INT32_MAX
    )


# --------------------------------------------------------------------------------------
# Pieces of curves.
# --------------------------------------------------------------------------------------


def as_float(x: ArrayLike) -> Float[Array, "*k"]:
    """A field (or a step) in the dtype schedules compute and return in: the
    default float dtype (`default_float`), float64 under `jax_enable_x64`."""
    return jnp.asarray(x).astype(default_float())


def linear_warmup(s, init, peak, warmup):
    """optax's `linear_schedule(init, peak, warmup)` for `warmup >= 1`; `warmup` is
    clamped to 1 so the branch stays finite when a caller selects away from it."""
    w = jnp.maximum(warmup, 1.0)
    frac = 1.0 - jnp.clip(s, 0.0, w) / w
    return (init - peak) * frac + peak


def exponential(s, init, rate, transition_steps, begin, staircase, end_value):
    """optax's `exponential_decay` at the float steps `s`."""
    decreased = s - begin
    p = decreased / transition_steps
    if staircase:
        p = jnp.floor(p)
    # A zero init stays zero: init * rate**p is 0 * inf = NaN once a growing rate
    # overflows (optax returns NaN there).
    grown = jnp.where(init == 0, 0.0, init * jnp.power(rate, p))
    value = jnp.where(decreased <= 0, init, grown)
    if end_value is not None:
        end = as_float(end_value)
        value = jnp.where(rate < 1.0, jnp.maximum(value, end), jnp.minimum(value, end))
    return value


def interpolate(
    s: Float[Array, "*k"],
    bounds: Int[Array, " n"],
    values: Float[Array, " n"],
    cosine: bool,
) -> Float[Array, "*k"]:
    """optax's piecewise interpolation between `values[i]` at `bounds[i]`
    (`bounds[0] == 0`), holding `values[-1]` from `bounds[-1]` on and giving 0 before
    step 0."""
    b = as_float(bounds)
    v = as_float(values)
    x = s[..., None]
    lo, hi = b[:-1], b[1:]
    start, end = v[:-1], v[1:]
    inside = (lo <= x) & (x < hi)
    pct = (x - lo) / jnp.maximum(hi - lo, 1.0)
    if cosine:
        between = end + (start - end) / 2.0 * (jnp.cos(jnp.pi * pct) + 1.0)
    else:
        between = (end - start) * pct + start
    held = jnp.where(b[-1] <= s, v[-1], 0.0)
    return jnp.sum(jnp.where(inside, between, 0.0), axis=-1) + held


def cumulative_values(first: ArrayLike, factors: list[Any]) -> Float[Array, " n"]:
    """`first`, then each value the previous one times the next factor."""
    values = [as_float(first)]
    for f in factors:
        values.append(values[-1] * as_float(f))
    return jnp.stack(values)
