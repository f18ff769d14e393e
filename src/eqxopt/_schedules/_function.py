"""Schedules from a user's function of the step (torch's `LambdaLR`), and the
product of several schedules (torch's `ChainedScheduler`)."""

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from beartype import beartype
from jaxtyping import Array, ArrayLike, Float, Int, jaxtyped

from .._core._fields import checked_field
from .._core._jax_api import holds_tracer
from .._core._schedule import AbstractSchedule, range_at
from .._core._tree import INT32_MAX
from ._common import Value, as_float, steps, value_field
from ._piecewise import _schedule_tuple

# The most steps `Product.value_range` evaluates one by one.
_DENSE_STEPS = 2**16


def _function(
    name: str, value: Callable[[Int[Array, ""]], ArrayLike]
) -> Callable[[Any], Any]:
    """A callable that is not a schedule module (for `checked_field`)."""
    if isinstance(value, AbstractSchedule) or not callable(value):
        got = type(value).__name__
        raise TypeError(
            f"{name} must be a function of the step (JAX operations on an int "
            f"array), got {got}"
        )
    return value


class Lambda(AbstractSchedule):
    r"""`init_value` times a function of the step:

    $$
    f(s) = \mathrm{init\_value} \cdot \mathrm{lr\_lambda}(s)
    $$

    torch's `LambdaLR(optimizer, lr_lambda)` with `init_value` the optimizer's
    learning rate. `lr_lambda` is called on the int32 step array (shape `()` or
    `(K,)`, traced inside a compiled step), so it must be written with JAX
    operations (`jnp.where`, not a Python `if` on the step); it may return a
    number, which is broadcast.

    The function is a static field: it is part of the compiled program, so
    another function (a new `lambda` too, even with the same body) compiles the
    step again, while every new step, and a new `init_value`, reuses it. Keep
    the numbers it depends on in `init_value` or in a schedule of your own (an
    `AbstractSchedule` subclass with array fields) where they should change
    without recompiling.

    **Arguments:**

    - `init_value`: the value `lr_lambda` scales, `>= 0`.
    - `lr_lambda`: a function of the step array returning the factor (static).

    Its range is not known at construction (`value_range` is `None`), so an
    optimizer's field does not check its bounds against it, as it does for the
    other schedules: keep a `momentum` or `b1` of your own below 1.
    """

    init_value: Value = value_field()
    lr_lambda: Callable[[Any], Any] = checked_field(_function, static=True)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float[Array, "*k"]:
        s = jnp.asarray(step)
        factor = jnp.broadcast_to(as_float(self.lr_lambda(s)), s.shape)
        return as_float(self.init_value) * factor


class Product(AbstractSchedule):
    r"""`init_value` times the product of several schedules' values (their
    factors):

    $$
    f(s) = \mathrm{init\_value} \prod_i \mathrm{factors}_i(s)
    $$

    torch's `ChainedScheduler(schedulers)`, which steps each scheduler in turn on
    the same learning rate, for schedulers that multiply it by a factor of the
    step (`StepLR`, `MultiStepLR`, `ExponentialLR`, `ConstantLR`, `LinearLR`,
    `PolynomialLR`, `CosineAnnealingLR` with `eta_min=0`): build each factor as
    that scheduler's eqxopt schedule with initial value 1 (`StepDecay(1.0, ...)`,
    `PiecewiseConstant(factor, {total_iters: 1 / factor})` for `ConstantLR`,
    ...). The number of factors is structure; their values are array fields.

    **Arguments:**

    - `init_value`: the value the factors scale, `>= 0`.
    - `factors`: a non-empty sequence of eqxopt schedule modules.
    """

    init_value: Value = value_field()
    factors: Sequence[AbstractSchedule] = checked_field(_schedule_tuple)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float[Array, "*k"]:
        s = jnp.asarray(step)
        value = jnp.broadcast_to(as_float(self.init_value), s.shape)
        for factor in self.factors:
            value = value * factor(s)
        return value

    def value_range(self) -> tuple[float, float] | None:
        # A product of monotone pieces need not be monotone: every step up to the
        # factors' last breakpoint is evaluated (`None` beyond _DENSE_STEPS), and
        # from there on the product of non-negative factors that all rise, or all
        # fall, is monotone.
        if holds_tracer(self):
            return None
        points = []
        for factor in self.factors:
            own = factor.breakpoints()
            known = factor.value_range()
            if own is None or known is None or known[0] < 0:
                return None
            points += [np.ravel(steps(p)) for p in own]
        finite = np.concatenate([np.zeros(1), *points])
        last = int(np.max(finite[finite < INT32_MAX]))
        if last > _DENSE_STEPS:
            return None
        ends = jnp.asarray([last, INT32_MAX], jnp.int32)
        with jax.ensure_compile_time_eval():
            moves = {
                float(np.sign(np.diff(np.asarray(f(ends))))[0]) for f in self.factors
            }
        if len(moves - {0.0}) > 1:
            return None
        return range_at(self, [np.arange(last + 1), INT32_MAX])
