"""Schedules in pieces: piecewise constant and piecewise interpolated values, and
schedules joined one after another."""

from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

import jax.numpy as jnp
import numpy as np
from beartype import beartype
from jaxtyping import Array, ArrayLike, Float, Int, jaxtyped

from .._core._fields import checked_field, choice_field
from .._core._schedule import AbstractSchedule
from .._core._tree import INT32_MAX
from ._common import (
    REQUIRED,
    Steps,
    Value,
    as_float,
    boundary_steps,
    check_value,
    cumulative_values,
    int_steps,
    interpolate,
    joined,
    steps,
    value_field,
)

BoundariesAndScales: TypeAlias = Mapping[int, Value] | None


def _boundaries_and_scales(
    boundaries_and_scales: Any,
) -> tuple[Int[Array, " n"], Float[Array, " n"]]:
    name = "boundaries_and_scales"
    if boundaries_and_scales is None:
        return jnp.zeros((0,), jnp.int32), jnp.zeros((0,), float)
    if not isinstance(boundaries_and_scales, Mapping):
        raise TypeError(
            f"{name} must be a dict from integer steps to scale factors, got "
            f"{type(boundaries_and_scales).__name__}"
        )
    for key in boundaries_and_scales:
        if isinstance(key, bool) or not isinstance(key, (int, np.integer)):
            raise TypeError(f"{name} keys must be integer steps, got {key!r}")
    items = sorted(boundaries_and_scales.items())
    bounds = boundary_steps(name, [b for b, _ in items])
    scales = [check_value(f"{name}[{b}]", s) for b, s in items]
    return bounds, (jnp.stack(scales) if scales else jnp.zeros((0,), float))


class PiecewiseConstant(AbstractSchedule):
    r"""A value multiplied by a factor at each boundary step.

    $$
    f(s) = \mathrm{init\_value} \prod_{i \,:\, \mathrm{boundary}_i \le s}
        \mathrm{scale}_i
    $$

    Equal to `optax.piecewise_constant_schedule`, except that scales must be finite:
    optax computes `v * 0 + inf * v` and returns NaN at every step for an infinite
    scale. The number of boundaries is
    structure (it sets the array shapes); the boundary steps and the scales are array
    fields, so other steps or scales with the same count do not recompile.

    **Arguments:**

    - `init_value`: the value before the first boundary, `>= 0`.
    - `boundaries_and_scales`: a dict `{step: scale}` with integer steps `>= 0` and
      finite scales `>= 0`, or `None` for a constant.
    """

    boundaries: Int[Array, " n"]
    scales: Float[Array, " n"]
    init_value: Value = value_field()

    def __init__(
        self, init_value: Value, boundaries_and_scales: BoundariesAndScales = None
    ):
        self.init_value = init_value
        self.boundaries, self.scales = _boundaries_and_scales(boundaries_and_scales)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float[Array, "*k"]:
        s = jnp.asarray(step)
        value = jnp.broadcast_to(as_float(self.init_value), s.shape)
        for i in range(self.boundaries.shape[0]):
            step, boundary = joined(s, self.boundaries[i])
            value = jnp.where(step >= boundary, value * as_float(self.scales[i]), value)
        return value

    def breakpoints(self) -> list[Any]:
        return [self.boundaries]


class PiecewiseInterpolate(AbstractSchedule):
    """Linear or cosine interpolation between values set by cumulative scale factors.

    With boundaries `b_1 < ... < b_n` and `v_0 = init_value`, `v_i = v_{i-1} *
    scale_i`, the value goes from `v_{i-1}` at `b_{i-1}` to `v_i` at `b_i` (`b_0 = 0`)
    and holds `v_n` from `b_n` on. Linear: `v_{i-1} + (v_i - v_{i-1}) * pct`; cosine:
    `v_i + (v_{i-1} - v_i) / 2 * (1 + cos(pi * pct))`.

    Equal to `optax.piecewise_interpolate_schedule`. The number of boundaries and the
    interpolation type are structure; steps and scales are array fields.

    **Arguments:**

    - `interpolate_type`: `"linear"` or `"cosine"` (static).
    - `init_value`: the value at step 0, `>= 0`.
    - `boundaries_and_scales`: a dict `{step: scale}` (steps `>= 0`, finite scales
      `>= 0`), or `None` for a constant.
    """

    boundaries: Int[Array, " n"]
    scales: Float[Array, " n"]
    interpolate_type: str = choice_field(REQUIRED, ("linear", "cosine"), kw_only=False)
    init_value: Value = value_field()

    def __init__(
        self,
        interpolate_type: str,
        init_value: Value,
        boundaries_and_scales: BoundariesAndScales = None,
    ):
        self.interpolate_type, self.init_value = interpolate_type, init_value
        self.boundaries, self.scales = _boundaries_and_scales(boundaries_and_scales)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float[Array, "*k"]:
        bounds = jnp.concatenate(joined(jnp.zeros((1,), jnp.int32), self.boundaries))
        values = cumulative_values(
            self.init_value, [self.scales[i] for i in range(self.scales.shape[0])]
        )
        return interpolate(
            as_float(step), bounds, values, self.interpolate_type == "cosine"
        )

    def breakpoints(self) -> list[Any]:
        return [self.boundaries]


def _schedule_tuple(
    name: str, schedules: Sequence[AbstractSchedule]
) -> tuple[AbstractSchedule, ...]:
    """A non-empty list of schedules, as a tuple (for `checked_field`)."""
    if not isinstance(schedules, (list, tuple)):
        raise TypeError(
            f"{name} must be a list of schedules, got {type(schedules).__name__}"
        )
    if not schedules:
        raise ValueError(f"{name} must hold at least one schedule, got none")
    for i, sched in enumerate(schedules):
        if not isinstance(sched, AbstractSchedule):
            raise TypeError(
                f"{name}[{i}] must be an eqxopt schedule module, got "
                f"{type(sched).__name__}"
            )
    return tuple(schedules)


class Join(AbstractSchedule):
    r"""Schedules run one after another: from `boundaries[i - 1]` on, `schedules[i]`
    is called on the step minus that boundary.

    $$
    f(s) = \begin{cases}
    \mathrm{schedules}_0(s) & s < b_0 \\
    \mathrm{schedules}_i(s - b_{i-1}) & b_{i-1} \le s < b_i
    \end{cases}
    $$

    with $b$ = `boundaries`.

    Equal to `optax.join_schedules`; torch's `SequentialLR`. The number of schedules
    is structure; the boundaries are an int32 array field.

    **Arguments:**

    - `schedules`: a non-empty sequence of eqxopt schedule modules.
    - `boundaries`: `len(schedules) - 1` sorted integer steps `>= 0`.
    """

    schedules: Sequence[AbstractSchedule] = checked_field(_schedule_tuple)
    boundaries: Steps = checked_field(boundary_steps)

    def __check_init__(self) -> None:
        count = jnp.asarray(self.boundaries).shape[0]
        if count != len(self.schedules) - 1:
            raise ValueError(
                f"boundaries must have len(schedules) - 1 = {len(self.schedules) - 1} "
                f"entries, got {count}"
            )

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float[Array, "*k"]:
        s = jnp.asarray(step)
        out = self.schedules[0](s)
        for i, sched in enumerate(self.schedules[1:]):
            b = jnp.asarray(self.boundaries)[i]
            step_joined, boundary = joined(s, b)
            out = jnp.where(step_joined < boundary, out, sched(s - int_steps(b)))
        return out

    def breakpoints(self) -> list[Any] | None:
        # Each schedule's breakpoints, from where it starts, within the steps it
        # serves; and the boundaries.
        bounds = [0.0, *np.ravel(steps(self.boundaries)), float(INT32_MAX)]
        points: list[Any] = list(bounds[1:-1])
        for sched, start, stop in zip(self.schedules, bounds[:-1], bounds[1:]):
            own = sched.breakpoints()
            if own is None:
                return None
            for point in [0.0, float(INT32_MAX), *own]:
                local = start + np.ravel(np.asarray(point, np.float64))
                points.append(local[(local >= start) & (local <= stop)])
        return points
