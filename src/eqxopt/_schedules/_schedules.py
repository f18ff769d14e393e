"""Learning-rate schedules: modules called on an integer step array."""

import math
from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from beartype import beartype
from jaxtyping import Array, ArrayLike, Float, Float32, Int, jaxtyped

from .._core._checks import (
    hyperparameter,
    is_concrete,
    positive_count as _positive_count,
    step_count as _step_count,
)
from .._core._schedule import AbstractSchedule
from .._core._tree import INT32_MAX


class WarmupCosine(AbstractSchedule):
    """Linear warmup from 0 to `peak_lr`, then a half cosine down to `min_lr`.

    With `W = warmup_steps`, `S = total_steps`:

    ```
    f(s) = peak_lr * s / W                                           for s < W
    f(s) = min_lr + (peak_lr - min_lr) / 2 * (1 + cos(pi * p))       for s >= W
           where p = min((s - W) / (S - W), 1)
    ```

    Equal to `optax.warmup_cosine_decay_schedule(0.0, peak_lr, W, S, min_lr)`, but
    all four values are array fields: changing any of them does not recompile, and
    `peak_lr` may be traced (optax divides `min_lr / peak_lr` behind a Python
    `peak_lr == 0` test, which a traced peak cannot pass). The formula has no
    division by `peak_lr`, so `peak_lr == 0` gives zeros, never NaN.

    **Arguments:**

    - `peak_lr`: the value reached at the end of warmup, `>= 0`.
    - `min_lr`: the floor after `total_steps`, `0 <= min_lr <= peak_lr`.
    - `warmup_steps`: length of the linear ramp, `>= 0`.
    - `total_steps`: the step at which the floor is reached, `> warmup_steps`.
    """

    peak_lr: Float[Array, ""]
    min_lr: Float[Array, ""]
    warmup_steps: Int[Array, ""]
    total_steps: Int[Array, ""]

    def __init__(self, peak_lr: Any, min_lr: Any, warmup_steps: Any, total_steps: Any):
        self.peak_lr = hyperparameter("peak_lr", peak_lr, low=0.0)
        self.min_lr = hyperparameter("min_lr", min_lr, low=0.0)
        self.warmup_steps = _step_count("warmup_steps", warmup_steps)
        self.total_steps = _step_count("total_steps", total_steps)
        if is_concrete(self.peak_lr) and is_concrete(self.min_lr):
            if float(self.min_lr) > float(self.peak_lr):
                raise ValueError(
                    f"min_lr must be <= peak_lr, got min_lr={float(self.min_lr)!r} "
                    f"and peak_lr={float(self.peak_lr)!r}"
                )
        if is_concrete(self.warmup_steps) and is_concrete(self.total_steps):
            if int(self.warmup_steps) >= int(self.total_steps):
                raise ValueError(
                    "warmup_steps must be < total_steps, got "
                    f"warmup_steps={int(self.warmup_steps)} and "
                    f"total_steps={int(self.total_steps)}"
                )

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float32[Array, "*k"]:
        s = jnp.asarray(step).astype(jnp.float32)
        peak = self.peak_lr.astype(jnp.float32)
        floor = self.min_lr.astype(jnp.float32)
        warmup = self.warmup_steps.astype(jnp.float32)
        total = self.total_steps.astype(jnp.float32)
        # max(., 1) keeps the unselected branch finite when W == 0 or S == W.
        ramp = peak * s / jnp.maximum(warmup, 1.0)
        progress = jnp.clip((s - warmup) / jnp.maximum(total - warmup, 1.0), 0.0, 1.0)
        decay = floor + (peak - floor) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
        return jnp.where(s < warmup, ramp, decay)


def _int_steps(count: Array) -> Int[Array, "*n"]:
    """A count field as int32 steps to subtract from a step: itself, or for a
    count stored beyond int32 the largest int32 a float32 holds (only used where
    `step < count` has already chosen the other branch)."""
    if jnp.issubdtype(count.dtype, jnp.integer):
        return count
    return jnp.minimum(count, float(2**31 - 128)).astype(jnp.int32)


def _sum_overflows(*counts: Array) -> bool:
    """Whether the sum of int32 `counts` (which a schedule forms in their dtype)
    is beyond int32; the caller then keeps them as float32 instead."""
    return (
        all(is_concrete(c) for c in counts)
        and all(jnp.issubdtype(c.dtype, jnp.integer) for c in counts)
        and sum(int(np.sum(np.asarray(c, np.int64))) for c in counts) > INT32_MAX
    )


# --------------------------------------------------------------------------------------
# Helpers shared by the schedules below.
# --------------------------------------------------------------------------------------


def _value(name: str, value: Any) -> Float[Array, ""]:
    """A finite, non-negative float value of a schedule (a rate, a peak, a floor)."""
    return hyperparameter(name, value, low=0.0, high=math.inf, high_open=True)


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        options = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{name} must be one of {options}; got {value!r}")
    return value


def _steps(step: Any) -> Float32[Array, "*k"]:
    return jnp.asarray(step).astype(jnp.float32)


def _f32(x: Array) -> Array:
    return x.astype(jnp.float32)


def _boundary_array(
    name: str, boundaries: Any, *, strictly_increasing: bool = False
) -> Int[Array, " n"]:
    """Checks a sequence of integer steps and returns it as an int32 array."""
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
    counts = [_step_count(f"{name}[{i}]", b) for i, b in enumerate(boundaries)]
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
    return jnp.stack(counts)


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
    bounds = _boundary_array(name, [b for b, _ in items])
    scales = [
        hyperparameter(f"{name}[{b}]", s, low=0.0, high=math.inf, high_open=True)
        for b, s in items
    ]
    return bounds, (jnp.stack(scales) if scales else jnp.zeros((0,), float))


def _interpolate(
    s: Float32[Array, "*k"],
    bounds: Int[Array, " n"],
    values: Float[Array, " n"],
    cosine: bool,
) -> Float32[Array, "*k"]:
    """optax's piecewise interpolation between `values[i]` at `bounds[i]`
    (`bounds[0] == 0`), holding `values[-1]` from `bounds[-1]` on and giving 0 before
    step 0."""
    b = _f32(bounds)
    v = _f32(values)
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


def _cumulative_values(first: Array, factors: list[Array]) -> Float32[Array, " n"]:
    values = [_f32(first)]
    for f in factors:
        values.append(values[-1] * _f32(f))
    return jnp.stack(values)


def _linear_warmup(s, init, peak, warmup):
    """optax's `linear_schedule(init, peak, warmup)` for `warmup >= 1`; `warmup` is
    clamped to 1 so the branch stays finite when a caller selects away from it."""
    w = jnp.maximum(warmup, 1.0)
    frac = 1.0 - jnp.clip(s, 0.0, w) / w
    return (init - peak) * frac + peak


def _exponential(s, init, rate, transition_steps, begin, staircase, end_value):
    decreased = s - begin
    p = decreased / transition_steps
    if staircase:
        p = jnp.floor(p)
    # A zero init stays zero: init * rate**p is 0 * inf = NaN once a growing rate
    # overflows float32 (optax returns NaN there).
    grown = jnp.where(init == 0, 0.0, init * jnp.power(rate, p))
    value = jnp.where(decreased <= 0, init, grown)
    if end_value is not None:
        end = _f32(end_value)
        value = jnp.where(rate < 1.0, jnp.maximum(value, end), jnp.minimum(value, end))
    return value


# --------------------------------------------------------------------------------------
# optax's schedules.
# --------------------------------------------------------------------------------------


class Polynomial(AbstractSchedule):
    """Polynomial decay from `init_value` to `end_value` over `transition_steps`.

    ```
    c = clip(s - transition_begin, 0, transition_steps)
    f(s) = (init_value - end_value) * (1 - c / transition_steps) ** power + end_value
    ```

    Equal to `optax.polynomial_schedule`. optax silently turns `transition_steps <= 0`
    into a constant `init_value` and a negative `transition_begin` into 0; here both
    raise `ValueError`. A `power <= 0` (optax: `inf` at the end) is rejected too.

    **Arguments:**

    - `init_value`: the value up to `transition_begin`, `>= 0`.
    - `end_value`: the value from `transition_begin + transition_steps` on, `>= 0`.
    - `power`: the exponent, `> 0` (`1` is linear).
    - `transition_steps`: the length of the decay, `>= 1`.
    - `transition_begin`: the step at which the decay starts, `>= 0`.
    """

    init_value: Float[Array, ""]
    end_value: Float[Array, ""]
    power: Float[Array, ""]
    transition_steps: Int[Array, ""]
    transition_begin: Int[Array, ""]

    def __init__(
        self,
        init_value: Any,
        end_value: Any,
        power: Any,
        transition_steps: Any,
        transition_begin: Any = 0,
    ):
        self.init_value = _value("init_value", init_value)
        self.end_value = _value("end_value", end_value)
        self.power = hyperparameter(
            "power", power, low=0.0, high=math.inf, low_open=True, high_open=True
        )
        self.transition_steps = _positive_count("transition_steps", transition_steps)
        self.transition_begin = _step_count("transition_begin", transition_begin)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float32[Array, "*k"]:
        s = _steps(step)
        t = _f32(self.transition_steps)
        c = jnp.clip(s - _f32(self.transition_begin), 0.0, t)
        frac = 1.0 - c / t
        init, end = _f32(self.init_value), _f32(self.end_value)
        return (init - end) * jnp.power(frac, _f32(self.power)) + end


class Linear(AbstractSchedule):
    """Linear interpolation from `init_value` to `end_value` over `transition_steps`.

    ```
    c = clip(s - transition_begin, 0, transition_steps)
    f(s) = (init_value - end_value) * (1 - c / transition_steps) + end_value
    ```

    Equal to `optax.linear_schedule` (errors instead of optax's silent fallbacks, as
    for `Polynomial`). Also torch's `LinearLR` with `init_value = base_lr *
    start_factor`, `end_value = base_lr * end_factor`, `transition_steps =
    total_iters`.

    **Arguments:**

    - `init_value`: the value up to `transition_begin`, `>= 0`.
    - `end_value`: the value from `transition_begin + transition_steps` on, `>= 0`.
    - `transition_steps`: the length of the ramp, `>= 1`.
    - `transition_begin`: the step at which the ramp starts, `>= 0`.
    """

    init_value: Float[Array, ""]
    end_value: Float[Array, ""]
    transition_steps: Int[Array, ""]
    transition_begin: Int[Array, ""]

    def __init__(
        self,
        init_value: Any,
        end_value: Any,
        transition_steps: Any,
        transition_begin: Any = 0,
    ):
        self.init_value = _value("init_value", init_value)
        self.end_value = _value("end_value", end_value)
        self.transition_steps = _positive_count("transition_steps", transition_steps)
        self.transition_begin = _step_count("transition_begin", transition_begin)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float32[Array, "*k"]:
        s = _steps(step)
        t = _f32(self.transition_steps)
        c = jnp.clip(s - _f32(self.transition_begin), 0.0, t)
        frac = 1.0 - c / t
        init, end = _f32(self.init_value), _f32(self.end_value)
        return (init - end) * frac + end


class PiecewiseConstant(AbstractSchedule):
    """A value multiplied by a factor at each boundary step.

    ```
    f(s) = init_value * prod(scale_i for every boundary_i <= s)
    ```

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

    init_value: Float[Array, ""]
    boundaries: Int[Array, " n"]
    scales: Float[Array, " n"]

    def __init__(self, init_value: Any, boundaries_and_scales: Any = None):
        self.init_value = _value("init_value", init_value)
        self.boundaries, self.scales = _boundaries_and_scales(boundaries_and_scales)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float32[Array, "*k"]:
        s = jnp.asarray(step)
        value = jnp.broadcast_to(_f32(self.init_value), s.shape)
        for i in range(self.boundaries.shape[0]):
            value = jnp.where(
                s >= self.boundaries[i], value * _f32(self.scales[i]), value
            )
        return value


class ExponentialDecay(AbstractSchedule):
    """Exponential decay by `decay_rate` every `transition_steps`, optionally in stairs
    and bounded by `end_value`.

    ```
    d = s - transition_begin
    p = d / transition_steps            (floor(d / transition_steps) if staircase)
    f(s) = init_value                   for d <= 0
    f(s) = init_value * decay_rate ** p otherwise
    ```

    then clipped from below by `end_value` when `decay_rate < 1` (from above when
    `decay_rate > 1`). Equal to `optax.exponential_decay`, except that optax silently
    returns a constant for `transition_steps <= 0` or `decay_rate == 0`; here those
    raise (a negative or zero `decay_rate` would give NaN or a jump to 0).

    **Arguments:**

    - `init_value`: the starting value, `>= 0`.
    - `transition_steps`: steps per factor of `decay_rate`, `>= 1`.
    - `decay_rate`: the factor, `> 0` (`> 1` grows).
    - `transition_begin`: steps to hold `init_value` before decaying, `>= 0`.
    - `staircase`: decay in whole steps of `transition_steps` (static).
    - `end_value`: optional bound (`None` for none), `>= 0`.
    """

    init_value: Float[Array, ""]
    transition_steps: Int[Array, ""]
    decay_rate: Float[Array, ""]
    transition_begin: Int[Array, ""]
    end_value: Float[Array, ""] | None
    staircase: bool = eqx.field(static=True)

    def __init__(
        self,
        init_value: Any,
        transition_steps: Any,
        decay_rate: Any,
        transition_begin: Any = 0,
        staircase: bool = False,
        end_value: Any = None,
    ):
        self.init_value = _value("init_value", init_value)
        self.transition_steps = _positive_count("transition_steps", transition_steps)
        self.decay_rate = hyperparameter(
            "decay_rate",
            decay_rate,
            low=0.0,
            high=math.inf,
            low_open=True,
            high_open=True,
        )
        self.transition_begin = _step_count("transition_begin", transition_begin)
        self.staircase = _flag("staircase", staircase)
        self.end_value = None if end_value is None else _value("end_value", end_value)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float32[Array, "*k"]:
        return _exponential(
            _steps(step),
            _f32(self.init_value),
            _f32(self.decay_rate),
            _f32(self.transition_steps),
            _f32(self.transition_begin),
            self.staircase,
            self.end_value,
        )


class CosineDecay(AbstractSchedule):
    """Half-cosine decay from `init_value` to `alpha * init_value` over `decay_steps`.

    ```
    c = min(s, decay_steps)
    k = 0.5 * (1 + cos(pi * c / decay_steps))
    f(s) = init_value * ((1 - alpha) * k ** exponent + alpha)
    ```

    Equal to `optax.cosine_decay_schedule` (which returns `inf` at the end for an
    `exponent <= 0`; rejected here); torch's `CosineAnnealingLR` (without
    restarts) with `eta_min = alpha * init_value` and `T_max = decay_steps`, up to
    `T_max`.

    **Arguments:**

    - `init_value`: the starting value, `>= 0`.
    - `decay_steps`: the step at which the floor is reached, `>= 1`.
    - `alpha`: the floor as a fraction of `init_value`, `>= 0`.
    - `exponent`: power applied to the cosine factor, `> 0`.
    """

    init_value: Float[Array, ""]
    decay_steps: Int[Array, ""]
    alpha: Float[Array, ""]
    exponent: Float[Array, ""]

    def __init__(
        self, init_value: Any, decay_steps: Any, alpha: Any = 0.0, exponent: Any = 1.0
    ):
        self.init_value = _value("init_value", init_value)
        self.decay_steps = _positive_count("decay_steps", decay_steps)
        self.alpha = _value("alpha", alpha)
        self.exponent = hyperparameter(
            "exponent", exponent, low=0.0, high=math.inf, low_open=True, high_open=True
        )

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float32[Array, "*k"]:
        d = _f32(self.decay_steps)
        c = jnp.minimum(_steps(step), d)
        cosine = 0.5 * (1.0 + jnp.cos(jnp.pi * c / d))
        alpha = _f32(self.alpha)
        decayed = (1.0 - alpha) * jnp.power(cosine, _f32(self.exponent)) + alpha
        return _f32(self.init_value) * decayed


class WarmupConstant(AbstractSchedule):
    """Linear warmup from `init_value` to `peak_value`, then constant.

    ```
    f(s) = init_value + (peak_value - init_value) * s / W      for s < W = warmup_steps
    f(s) = peak_value                                          otherwise
    ```

    Equal to `optax.warmup_constant_schedule` for `warmup_steps >= 1`. With
    `warmup_steps == 0` this gives `peak_value` at every step, where optax gives
    `init_value` forever. torch's `LinearLR(start_factor, 1.0, total_iters)`.

    **Arguments:**

    - `init_value`: the value at step 0, `>= 0`.
    - `peak_value`: the value from `warmup_steps` on, `>= 0`.
    - `warmup_steps`: the length of the ramp, `>= 0`.
    """

    init_value: Float[Array, ""]
    peak_value: Float[Array, ""]
    warmup_steps: Int[Array, ""]

    def __init__(self, init_value: Any, peak_value: Any, warmup_steps: Any):
        self.init_value = _value("init_value", init_value)
        self.peak_value = _value("peak_value", peak_value)
        self.warmup_steps = _step_count("warmup_steps", warmup_steps)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float32[Array, "*k"]:
        s = _steps(step)
        w = _f32(self.warmup_steps)
        peak = _f32(self.peak_value)
        ramp = _linear_warmup(s, _f32(self.init_value), peak, w)
        return jnp.where(s < w, ramp, peak)


class WarmupExponentialDecay(AbstractSchedule):
    """Linear warmup from `init_value` to `peak_value` over `warmup_steps`, then
    `ExponentialDecay(peak_value, transition_steps, decay_rate, transition_begin,
    staircase, end_value)` counted from the end of warmup.

    Equal to `optax.warmup_exponential_decay_schedule` (with the argument checks of
    `ExponentialDecay`).

    **Arguments:**

    - `init_value`, `peak_value`, `warmup_steps`: as in `WarmupConstant`.
    - `transition_steps`, `decay_rate`, `transition_begin`, `staircase`,
      `end_value`: as in `ExponentialDecay`, with steps counted from the end of
      warmup.
    """

    init_value: Float[Array, ""]
    peak_value: Float[Array, ""]
    warmup_steps: Int[Array, ""]
    transition_steps: Int[Array, ""]
    decay_rate: Float[Array, ""]
    transition_begin: Int[Array, ""]
    end_value: Float[Array, ""] | None
    staircase: bool = eqx.field(static=True)

    def __init__(
        self,
        init_value: Any,
        peak_value: Any,
        warmup_steps: Any,
        transition_steps: Any,
        decay_rate: Any,
        transition_begin: Any = 0,
        staircase: bool = False,
        end_value: Any = None,
    ):
        self.init_value = _value("init_value", init_value)
        self.peak_value = _value("peak_value", peak_value)
        self.warmup_steps = _step_count("warmup_steps", warmup_steps)
        decay = ExponentialDecay(
            peak_value,
            transition_steps,
            decay_rate,
            transition_begin,
            staircase,
            end_value,
        )
        self.transition_steps = decay.transition_steps
        self.decay_rate = decay.decay_rate
        self.transition_begin = decay.transition_begin
        self.end_value = decay.end_value
        self.staircase = decay.staircase

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float32[Array, "*k"]:
        s = _steps(step)
        w = _f32(self.warmup_steps)
        peak = _f32(self.peak_value)
        ramp = _linear_warmup(s, _f32(self.init_value), peak, w)
        decay = _exponential(
            s - w,
            peak,
            _f32(self.decay_rate),
            _f32(self.transition_steps),
            _f32(self.transition_begin),
            self.staircase,
            self.end_value,
        )
        return jnp.where(s < w, ramp, decay)


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

    init_value: Float[Array, ""]
    boundaries: Int[Array, " n"]
    scales: Float[Array, " n"]
    interpolate_type: str = eqx.field(static=True)

    def __init__(
        self, interpolate_type: str, init_value: Any, boundaries_and_scales: Any = None
    ):
        self.interpolate_type = _choice(
            "interpolate_type", interpolate_type, ("linear", "cosine")
        )
        self.init_value = _value("init_value", init_value)
        self.boundaries, self.scales = _boundaries_and_scales(boundaries_and_scales)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float32[Array, "*k"]:
        bounds = jnp.concatenate([jnp.zeros((1,), jnp.int32), self.boundaries])
        values = _cumulative_values(
            self.init_value, [self.scales[i] for i in range(self.scales.shape[0])]
        )
        return _interpolate(
            _steps(step), bounds, values, self.interpolate_type == "cosine"
        )


def _fraction_of(raw: Any, checked: Array, total: Array, rounding: Any) -> Array:
    """`rounding(raw * total)` as an int32 scalar, for a fraction of a step count.

    optax computes `int(pct * transition_steps)` in Python floats. When both numbers
    are known this does the same with the value as given (a Python float is a
    float64), so rounding `0.9` to float32 (0.8999999762) never moves a boundary by
    one step (`int(0.9 * 10) == 9`, `int(float32(0.9) * 10) == 8`). Traced values
    use the checked float32 array.
    """
    if is_concrete(raw) and is_concrete(total):
        return _step_count(
            "a fraction of a step count",
            int(rounding(float(np.asarray(raw, dtype=np.float64)) * int(total))),
        )
    exact = checked * total
    rounded = jnp.floor(exact) if rounding is int else jnp.round(exact)
    if jnp.issubdtype(total.dtype, jnp.integer):
        return rounded.astype(jnp.int32)
    return rounded.astype(jnp.float32)  # a fraction of a count beyond int32


class LinearOneCycle(AbstractSchedule):
    """The linear one-cycle policy (Smith & Topin, 2017).

    From `peak_value / div_factor` up to `peak_value` at `int(pct_start * T)`, back
    down to `peak_value / div_factor` at `int(pct_final * T)`, then down to
    `peak_value / div_factor / final_div_factor` at `T = transition_steps`, and held.

    Equal to `optax.linear_onecycle_schedule` (where `div_factor=0` is a Python
    `ZeroDivisionError`; here a `ValueError` naming it). torch's `OneCycleLR` is a
    different curve: it ends its phases at `pct * total_steps - 1` and its linear
    three-phase variant falls to the final value over the last phase only.

    **Arguments:**

    - `transition_steps`: the length of the cycle `T`, `>= 1`.
    - `peak_value`: the highest value, `>= 0`.
    - `pct_start`: fraction of `T` spent rising, in `[0, 1]`.
    - `pct_final`: fraction of `T` at which the fall back ends, in `[pct_start, 1]`.
    - `div_factor`: `peak_value / div_factor` is the starting value, `> 0`.
    - `final_div_factor`: the final value is the starting value over this, `> 0`.

    The phase ends `int(pct * T)` are int32 fields computed at construction (in
    float64 from the fractions as given, like optax; in float32 when they are traced).
    When two phase ends coincide, optax's dict of boundaries merges them and drops a
    factor; here the phase simply has zero length.
    """

    transition_steps: Int[Array, ""]
    peak_value: Float[Array, ""]
    start_step: Int[Array, ""]
    final_step: Int[Array, ""]
    div_factor: Float[Array, ""]
    final_div_factor: Float[Array, ""]

    def __init__(
        self,
        transition_steps: Any,
        peak_value: Any,
        pct_start: Any = 0.3,
        pct_final: Any = 0.85,
        div_factor: Any = 25.0,
        final_div_factor: Any = 1e4,
    ):
        self.transition_steps = _positive_count("transition_steps", transition_steps)
        self.peak_value = _value("peak_value", peak_value)
        start = hyperparameter("pct_start", pct_start, low=0.0, high=1.0)
        final = hyperparameter("pct_final", pct_final, low=0.0, high=1.0)
        if is_concrete(start) and is_concrete(final) and float(final) < float(start):
            raise ValueError(
                f"pct_final must be >= pct_start, got pct_final={float(final)!r} and "
                f"pct_start={float(start)!r}"
            )
        self.start_step = _fraction_of(pct_start, start, self.transition_steps, int)
        self.final_step = _fraction_of(pct_final, final, self.transition_steps, int)
        self.div_factor = _factor("div_factor", div_factor)
        self.final_div_factor = _factor("final_div_factor", final_div_factor)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float32[Array, "*k"]:
        div = _f32(self.div_factor)
        bounds = jnp.stack(
            [
                jnp.zeros((), jnp.int32),
                self.start_step,
                self.final_step,
                self.transition_steps,
            ]
        )
        values = _cumulative_values(
            _f32(self.peak_value) / div,
            [div, 1.0 / div, 1.0 / _f32(self.final_div_factor)],
        )
        return _interpolate(_steps(step), bounds, values, cosine=False)


class CosineOneCycle(AbstractSchedule):
    """The cosine one-cycle policy (Smith & Topin, 2017).

    From `peak_value / div_factor` up to `peak_value` at `int(pct_start * T)` and
    down to `peak_value / (div_factor * final_div_factor)` at `T = transition_steps`,
    both along half cosines, then held.

    Equal to `optax.cosine_onecycle_schedule`. torch's `OneCycleLR` ends its phases at
    `pct * total_steps - 1`, so its curve is close to this one but not equal.

    **Arguments:**

    - `transition_steps`: the length of the cycle `T`, `>= 1`.
    - `peak_value`: the highest value, `>= 0`.
    - `pct_start`: fraction of `T` spent rising, in `[0, 1]`.
    - `div_factor`: `peak_value / div_factor` is the starting value, `> 0`.
    - `final_div_factor`: the final value is the starting value over this, `> 0`.

    The end of the rise, `int(pct_start * T)`, is an int32 field computed at
    construction.
    """

    transition_steps: Int[Array, ""]
    peak_value: Float[Array, ""]
    start_step: Int[Array, ""]
    div_factor: Float[Array, ""]
    final_div_factor: Float[Array, ""]

    def __init__(
        self,
        transition_steps: Any,
        peak_value: Any,
        pct_start: Any = 0.3,
        div_factor: Any = 25.0,
        final_div_factor: Any = 1e4,
    ):
        self.transition_steps = _positive_count("transition_steps", transition_steps)
        self.peak_value = _value("peak_value", peak_value)
        start = hyperparameter("pct_start", pct_start, low=0.0, high=1.0)
        self.start_step = _fraction_of(pct_start, start, self.transition_steps, int)
        self.div_factor = _factor("div_factor", div_factor)
        self.final_div_factor = _factor("final_div_factor", final_div_factor)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float32[Array, "*k"]:
        div = _f32(self.div_factor)
        bounds = jnp.stack(
            [jnp.zeros((), jnp.int32), self.start_step, self.transition_steps]
        )
        values = _cumulative_values(
            _f32(self.peak_value) / div,
            [div, 1.0 / (div * _f32(self.final_div_factor))],
        )
        return _interpolate(_steps(step), bounds, values, cosine=True)


def _factor(name: str, value: Any) -> Float[Array, ""]:
    return hyperparameter(
        name, value, low=0.0, high=math.inf, low_open=True, high_open=True
    )


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


_SGDR_KEYS = (
    "init_value",
    "peak_value",
    "warmup_steps",
    "decay_steps",
    "end_value",
    "exponent",
)


class SGDR(AbstractSchedule):
    """Stochastic gradient descent with warm restarts (Loshchilov & Hutter, 2017):
    a sequence of warmup-cosine cycles, each starting where the last one ended.

    Cycle `i` lasts `decay_steps_i` steps; within it, at local step `t`:

    ```
    f = init + (peak - init) * t / warmup                              for t < warmup
    f = peak * ((1 - a) * (0.5 * (1 + cos(pi * c / (decay - warmup)))) ** exponent + a)
        where c = min(t - warmup, decay - warmup), a = end / peak (0 if peak == 0)
    ```

    and after the last cycle its end value is held. Equal to `optax.sgdr_schedule`
    (whose cycles are `optax.warmup_cosine_decay_schedule`s), and to torch's
    `CosineAnnealingWarmRestarts` with equal cycles, no warmup and `end = eta_min`.
    The number of cycles is structure; every per-cycle value is an array field of
    shape `(n_cycles,)`.

    **Arguments:**

    - `cycles`: a non-empty sequence of dicts with keys `peak_value` and
      `decay_steps` (the cycle length, `> warmup_steps`), and optionally `init_value`
      (default 0), `warmup_steps` (default 0), `end_value` (default 0) and `exponent`
      (default 1, `> 0`) — the arguments of `optax.warmup_cosine_decay_schedule`.
    """

    init_values: Float[Array, " n"]
    peak_values: Float[Array, " n"]
    warmup_steps: Int[Array, " n"]
    decay_steps: Int[Array, " n"]
    end_values: Float[Array, " n"]
    exponents: Float[Array, " n"]

    def __init__(self, cycles: Any):
        if isinstance(cycles, Mapping) or not isinstance(cycles, (list, tuple)):
            raise TypeError(
                "cycles must be a list of dicts of warmup-cosine arguments, got "
                f"{type(cycles).__name__}"
            )
        if not cycles:
            raise ValueError("cycles must hold at least one cycle, got none")
        columns: dict[str, list[Array]] = {k: [] for k in _SGDR_KEYS}
        for i, cycle in enumerate(cycles):
            where = f"cycles[{i}]"
            if not isinstance(cycle, Mapping):
                raise TypeError(f"{where} must be a dict, got {type(cycle).__name__}")
            unknown = sorted(set(cycle) - set(_SGDR_KEYS))
            if unknown:
                raise ValueError(
                    f"{where} has unknown keys {unknown}; allowed: {list(_SGDR_KEYS)}"
                )
            for key in ("peak_value", "decay_steps"):
                if key not in cycle:
                    raise ValueError(f"{where} needs the key {key!r}")
            columns["init_value"].append(
                _value(f"{where}['init_value']", cycle.get("init_value", 0.0))
            )
            columns["peak_value"].append(
                _value(f"{where}['peak_value']", cycle["peak_value"])
            )
            columns["end_value"].append(
                _value(f"{where}['end_value']", cycle.get("end_value", 0.0))
            )
            columns["exponent"].append(
                hyperparameter(
                    f"{where}['exponent']",
                    cycle.get("exponent", 1.0),
                    low=0.0,
                    high=math.inf,
                    low_open=True,
                    high_open=True,
                )
            )
            warmup = _step_count(
                f"{where}['warmup_steps']", cycle.get("warmup_steps", 0)
            )
            decay = _step_count(f"{where}['decay_steps']", cycle["decay_steps"])
            if is_concrete(warmup) and is_concrete(decay) and int(decay) <= int(warmup):
                raise ValueError(
                    f"{where}['decay_steps'] must be > {where}['warmup_steps'], got "
                    f"decay_steps={int(decay)} and warmup_steps={int(warmup)}"
                )
            columns["warmup_steps"].append(warmup)
            columns["decay_steps"].append(decay)
        self.init_values = jnp.stack(columns["init_value"])
        self.peak_values = jnp.stack(columns["peak_value"])
        self.warmup_steps = jnp.stack(columns["warmup_steps"])
        decay = jnp.stack(columns["decay_steps"])
        # Cycle i starts after the lengths of those before it: float32 if beyond
        # int32.
        self.decay_steps = (
            decay.astype(jnp.float32) if _sum_overflows(decay[:-1]) else decay
        )
        self.end_values = jnp.stack(columns["end_value"])
        self.exponents = jnp.stack(columns["exponent"])

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float32[Array, "*k"]:
        s = jnp.asarray(step)
        lengths = self.decay_steps
        starts = jnp.concatenate(
            [jnp.zeros((1,), lengths.dtype), jnp.cumsum(lengths[:-1])]
        )
        cycle = jnp.sum(s[..., None] >= starts[1:], axis=-1)
        t = _f32(s - starts[cycle])
        init = _f32(self.init_values[cycle])
        peak = _f32(self.peak_values[cycle])
        end = _f32(self.end_values[cycle])
        warmup = _f32(self.warmup_steps[cycle])
        length = _f32(self.decay_steps[cycle]) - warmup
        ramp = _linear_warmup(t, init, peak, warmup)
        c = jnp.minimum(t - warmup, length)
        cosine = 0.5 * (1.0 + jnp.cos(jnp.pi * c / length))
        alpha = jnp.where(peak == 0.0, 0.0, end / jnp.where(peak == 0.0, 1.0, peak))
        exponent = _f32(self.exponents[cycle])
        decay = peak * ((1.0 - alpha) * jnp.power(cosine, exponent) + alpha)
        return jnp.where(t < warmup, ramp, decay)


class Join(AbstractSchedule):
    """Schedules run one after another: from `boundaries[i - 1]` on, `schedules[i]`
    is called on the step minus that boundary.

    ```
    f(s) = schedules[0](s)                          for s < b[0]
    f(s) = schedules[i](s - b[i - 1])               for b[i - 1] <= s < b[i]
    (b = boundaries)
    ```

    Equal to `optax.join_schedules`; torch's `SequentialLR`. The number of schedules
    is structure; the boundaries are an int32 array field.

    **Arguments:**

    - `schedules`: a non-empty sequence of eqxopt schedule modules.
    - `boundaries`: `len(schedules) - 1` sorted integer steps `>= 0`.
    """

    schedules: tuple[AbstractSchedule, ...]
    boundaries: Int[Array, " n"]

    def __init__(self, schedules: Any, boundaries: Any):
        if not isinstance(schedules, (list, tuple)):
            raise TypeError(
                f"schedules must be a list of schedules, got {type(schedules).__name__}"
            )
        if not schedules:
            raise ValueError("schedules must hold at least one schedule, got none")
        for i, sched in enumerate(schedules):
            if not isinstance(sched, AbstractSchedule):
                raise TypeError(
                    f"schedules[{i}] must be an eqxopt schedule module, got "
                    f"{type(sched).__name__}"
                )
        self.boundaries = _boundary_array("boundaries", boundaries)
        if self.boundaries.shape[0] != len(schedules) - 1:
            raise ValueError(
                f"boundaries must have len(schedules) - 1 = {len(schedules) - 1} "
                f"entries, got {self.boundaries.shape[0]}"
            )
        self.schedules = tuple(schedules)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float32[Array, "*k"]:
        s = jnp.asarray(step)
        out = self.schedules[0](s)
        for i, sched in enumerate(self.schedules[1:]):
            b = self.boundaries[i]
            out = jnp.where(s < b, out, sched(s - _int_steps(b)))
        return out


# --------------------------------------------------------------------------------------
# torch.optim.lr_scheduler's that optax lacks, and warmup-stable-decay.
# --------------------------------------------------------------------------------------


class StepDecay(AbstractSchedule):
    """Multiply by `gamma` every `step_size` steps.

    ```
    f(s) = init_value * gamma ** floor(s / step_size)
    ```

    torch's `StepLR(optimizer, step_size, gamma)` with `init_value` the optimizer's
    learning rate (torch multiplies in float64 step by step; this takes a float32
    power).

    **Arguments:**

    - `init_value`: the value at step 0, `>= 0`.
    - `step_size`: steps between decays, `>= 1`.
    - `gamma`: the factor, `> 0`.
    """

    init_value: Float[Array, ""]
    step_size: Int[Array, ""]
    gamma: Float[Array, ""]

    def __init__(self, init_value: Any, step_size: Any, gamma: Any = 0.1):
        self.init_value = _value("init_value", init_value)
        self.step_size = _positive_count("step_size", step_size)
        self.gamma = _factor("gamma", gamma)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float32[Array, "*k"]:
        s = jnp.maximum(jnp.asarray(step), 0)
        k = _f32(s // self.step_size)
        return _f32(self.init_value) * jnp.power(_f32(self.gamma), k)


class MultiStepDecay(AbstractSchedule):
    """Multiply by `gamma` at each milestone.

    ```
    f(s) = init_value * gamma ** (number of milestones <= s)
    ```

    torch's `MultiStepLR(optimizer, milestones, gamma)`; a repeated milestone counts
    twice, as in torch. The number of milestones is structure, the steps are an int32
    array field.

    **Arguments:**

    - `init_value`: the value at step 0, `>= 0`.
    - `milestones`: a sorted sequence of integer steps `>= 0`.
    - `gamma`: the factor, `> 0`.
    """

    init_value: Float[Array, ""]
    milestones: Int[Array, " n"]
    gamma: Float[Array, ""]

    def __init__(self, init_value: Any, milestones: Any, gamma: Any = 0.1):
        self.init_value = _value("init_value", init_value)
        self.milestones = _boundary_array("milestones", milestones)
        self.gamma = _factor("gamma", gamma)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float32[Array, "*k"]:
        s = jnp.asarray(step)
        k = _f32(jnp.sum(s[..., None] >= self.milestones, axis=-1))
        return _f32(self.init_value) * jnp.power(_f32(self.gamma), k)


class Cyclic(AbstractSchedule):
    """Cyclical learning rates (Smith, 2017): triangles between `base_lr` and
    `max_lr`, `step_size_up` steps up then `step_size_down` down.

    With `T = step_size_up + step_size_down`, cycle `n = floor(s / T) + 1` and
    `r = s mod T`:

    ```
    h = r / step_size_up                       for r <= step_size_up
    h = (T - r) / step_size_down               otherwise
    f(s) = base_lr + (max_lr - base_lr) * h * scale
    ```

    where `scale = 1` (`"triangular"`), `1 / 2 ** (n - 1)` (`"triangular2"`) or
    `gamma ** s` (`"exp_range"`). torch's `CyclicLR` with these modes (torch's
    momentum cycling is not part of a learning-rate schedule). Computing `r` in
    integers keeps float32 exact where torch's `1 + s / T - n` would lose digits.

    **Arguments:**

    - `base_lr`: the low end, `>= 0`.
    - `max_lr`: the high end, `>= 0`.
    - `step_size_up`: steps rising, `>= 1`.
    - `step_size_down`: steps falling, `>= 0`; `None` for `step_size_up`.
    - `mode`: `"triangular"`, `"triangular2"` or `"exp_range"` (static).
    - `gamma`: the per-step factor of `"exp_range"`, in `(0, 1]`.
    """

    base_lr: Float[Array, ""]
    max_lr: Float[Array, ""]
    step_size_up: Int[Array, ""]
    step_size_down: Int[Array, ""]
    gamma: Float[Array, ""]
    mode: str = eqx.field(static=True)

    def __init__(
        self,
        base_lr: Any,
        max_lr: Any,
        step_size_up: Any = 2000,
        step_size_down: Any = None,
        mode: str = "triangular",
        gamma: Any = 1.0,
    ):
        self.base_lr = _value("base_lr", base_lr)
        self.max_lr = _value("max_lr", max_lr)
        self.step_size_up = _positive_count("step_size_up", step_size_up)
        down = (
            self.step_size_up
            if step_size_down is None
            else _step_count("step_size_down", step_size_down)
        )
        if _sum_overflows(self.step_size_up, down):  # a cycle is up + down steps
            self.step_size_up = self.step_size_up.astype(jnp.float32)
            down = down.astype(jnp.float32)
        self.step_size_down = down
        self.mode = _choice("mode", mode, ("triangular", "triangular2", "exp_range"))
        self.gamma = hyperparameter("gamma", gamma, low=0.0, high=1.0, low_open=True)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float32[Array, "*k"]:
        s = jnp.maximum(jnp.asarray(step), 0)
        up, down = self.step_size_up, self.step_size_down
        total = up + down
        r = s % total
        height = jnp.where(
            r <= up, _f32(r) / _f32(up), _f32(total - r) / _f32(jnp.maximum(down, 1))
        )
        if self.mode == "triangular":
            scale = jnp.ones_like(height)
        elif self.mode == "triangular2":
            scale = 1.0 / jnp.power(2.0, _f32(s // total))
        else:
            scale = jnp.power(_f32(self.gamma), _f32(s))
        base = _f32(self.base_lr)
        return base + (_f32(self.max_lr) - base) * height * scale


class WarmupStableDecay(AbstractSchedule):
    """Warmup-stable-decay ("WSD", trapezoidal): a linear warmup, a constant plateau
    at `peak_value`, then a decay to `end_value` over the last `decay_steps` of
    `total_steps`, held afterwards.

    With `W = warmup_steps`, `T = total_steps`, `D = decay_steps`, `p = clip((s - (T -
    D)) / D, 0, 1)`:

    ```
    f(s) = init_value + (peak_value - init_value) * s / W      for s < W
    f(s) = end_value + (peak_value - end_value) * shape(p)      otherwise
    shape(p) = 1 - p                    ("linear")
             = (1 + cos(pi * p)) / 2    ("cosine")
             = 1 - sqrt(p)              ("1-sqrt", Hägele et al. 2024)
    ```

    Neither optax nor torch has it as one object (it is a `Join` of a warmup, a
    constant and a decay; the tests check it against that join and a NumPy formula).

    **Arguments:**

    - `peak_value`: the plateau, `>= 0`.
    - `warmup_steps`: length of the warmup, `>= 0`.
    - `total_steps`: the step at which `end_value` is reached, `>= warmup_steps +
      decay_steps`.
    - `decay_steps`: length of the decay, `>= 1`; or give
    - `decay_fraction`: the decay length as a fraction of `total_steps`, in `(0, 1]`
      (rounded to whole steps; default 0.2 when neither is given).
    - `init_value`: the value at step 0, `>= 0`.
    - `end_value`: the floor, `>= 0`.
    - `decay_shape`: `"linear"`, `"cosine"` or `"1-sqrt"` (static).
    """

    peak_value: Float[Array, ""]
    warmup_steps: Int[Array, ""]
    total_steps: Int[Array, ""]
    decay_steps: Int[Array, ""]
    init_value: Float[Array, ""]
    end_value: Float[Array, ""]
    decay_shape: str = eqx.field(static=True)

    def __init__(
        self,
        peak_value: Any,
        warmup_steps: Any,
        total_steps: Any,
        *,
        decay_steps: Any = None,
        decay_fraction: Any = None,
        init_value: Any = 0.0,
        end_value: Any = 0.0,
        decay_shape: str = "linear",
    ):
        self.peak_value = _value("peak_value", peak_value)
        self.warmup_steps = _step_count("warmup_steps", warmup_steps)
        self.total_steps = _positive_count("total_steps", total_steps)
        if decay_steps is not None and decay_fraction is not None:
            raise ValueError(
                "give decay_steps or decay_fraction, not both; got "
                f"decay_steps={decay_steps!r} and decay_fraction={decay_fraction!r}"
            )
        if decay_steps is None:
            raw = 0.2 if decay_fraction is None else decay_fraction
            fraction = hyperparameter(
                "decay_fraction", raw, low=0.0, high=1.0, low_open=True
            )
            self.decay_steps = _fraction_of(raw, fraction, self.total_steps, round)
            if is_concrete(self.decay_steps) and int(self.decay_steps) < 1:
                raise ValueError(
                    "decay_fraction * total_steps must round to at least one step, "
                    f"got decay_fraction={float(fraction)!r} and total_steps="
                    f"{int(self.total_steps)}"
                )
        else:
            self.decay_steps = _positive_count("decay_steps", decay_steps)
        if all(
            is_concrete(x)
            for x in (self.warmup_steps, self.total_steps, self.decay_steps)
        ):
            w, t, d = (
                int(self.warmup_steps),
                int(self.total_steps),
                int(self.decay_steps),
            )
            if w + d > t:
                raise ValueError(
                    "warmup_steps + decay_steps must be <= total_steps, got "
                    f"warmup_steps={w}, decay_steps={d} and total_steps={t}"
                )
        self.init_value = _value("init_value", init_value)
        self.end_value = _value("end_value", end_value)
        self.decay_shape = _choice(
            "decay_shape", decay_shape, ("linear", "cosine", "1-sqrt")
        )

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float32[Array, "*k"]:
        s = _steps(step)
        w = _f32(self.warmup_steps)
        d = _f32(self.decay_steps)
        peak, end = _f32(self.peak_value), _f32(self.end_value)
        ramp = _linear_warmup(s, _f32(self.init_value), peak, w)
        p = jnp.clip((s - (_f32(self.total_steps) - d)) / d, 0.0, 1.0)
        if self.decay_shape == "linear":
            shape = 1.0 - p
        elif self.decay_shape == "cosine":
            shape = 0.5 * (1.0 + jnp.cos(jnp.pi * p))
        else:
            shape = 1.0 - jnp.sqrt(p)
        return jnp.where(s < w, ramp, end + (peak - end) * shape)
