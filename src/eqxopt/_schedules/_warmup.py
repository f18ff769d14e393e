"""Schedules that ramp up linearly first: warmup-cosine, warmup-constant,
warmup-exponential-decay and warmup-stable-decay."""

import abc
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from beartype import beartype
from jaxtyping import Array, ArrayLike, Float, Int, jaxtyped

from .._core._checks import hyperparameter, is_concrete, positive_count, renames
from .._core._fields import checked_field, choice_field, count_field, flag_field, hyper
from .._core._schedule import AbstractSchedule
from ._common import (
    Count,
    Value,
    as_float,
    check_order,
    exponential,
    factor_field,
    fraction_of,
    linear_warmup,
    optional_value,
    steps,
    value_field,
)


class WarmupCosine(AbstractSchedule):
    r"""Linear warmup from 0 to `peak_lr`, then a half cosine down to `min_lr`.

    With $W$ = `warmup_steps`, $S$ = `total_steps` and
    $p = \min\left(\frac{s - W}{S - W}, 1\right)$:

    $$
    f(s) = \begin{cases}
    \mathrm{peak\_lr} \cdot s / W & s < W \\
    \mathrm{min\_lr} + \frac{1}{2} (\mathrm{peak\_lr} - \mathrm{min\_lr})
        \left(1 + \cos(\pi p)\right) & s \ge W
    \end{cases}
    $$

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

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxopt

    schedule = eqxopt.WarmupCosine(
        peak_lr=1.0, min_lr=0.1, warmup_steps=10, total_steps=110
    )
    values = schedule(jnp.array([0, 5, 10, 60, 110, 200]))
    assert jnp.allclose(values, jnp.array([0.0, 0.5, 1.0, 0.55, 0.1, 0.1]))
    opt = eqxopt.AdamW(learning_rate=schedule)  # read at state.step at every step
    ```
    """

    # optax's spellings (`_checks.refuse_renamed`)
    renamed_arguments = renames(
        peak_value=("peak_lr",),
        end_value=("min_lr",),
        decay_steps=("total_steps",),
        init_value="leave it out: the warmup starts at 0 (optax's init_value=0)",
    )

    # Numbers only, as every schedule's values (`_common`).
    peak_lr: Value = hyper(low=0.0, schedule=False)
    min_lr: Value = hyper(low=0.0, schedule=False)
    warmup_steps: Count = count_field(at_least_one=False)
    total_steps: Count = count_field(at_least_one=False)

    def __check_init__(self) -> None:
        check_order("min_lr", self.min_lr, "<=", "peak_lr", self.peak_lr)
        check_order(
            "warmup_steps",
            self.warmup_steps,
            "<",
            "total_steps",
            self.total_steps,
            counts=True,
        )

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float[Array, "*k"]:
        s = as_float(step)
        peak = as_float(self.peak_lr)
        floor = as_float(self.min_lr)
        warmup = as_float(self.warmup_steps)
        total = as_float(self.total_steps)
        # max(., 1) keeps the unselected branch finite when W == 0 or S == W.
        ramp = peak * s / jnp.maximum(warmup, 1.0)
        progress = jnp.clip((s - warmup) / jnp.maximum(total - warmup, 1.0), 0.0, 1.0)
        decay = floor + (peak - floor) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
        return jnp.where(s < warmup, ramp, decay)

    def breakpoints(self) -> list[Any]:
        return [self.warmup_steps, self.total_steps]


class AbstractWarmup(AbstractSchedule):
    """A linear warmup from `init_value` to `peak_value` over `warmup_steps` (optax's
    `linear_schedule`), then what `after_warmup` gives from step `warmup_steps` on."""

    init_value: eqx.AbstractVar[Value]
    peak_value: eqx.AbstractVar[Value]
    warmup_steps: eqx.AbstractVar[Count]

    def breakpoints(self) -> list[Any]:
        # The ramp, then what follows it, monotone between its own breakpoints.
        return [self.warmup_steps, *self.after_warmup_breakpoints()]

    @abc.abstractmethod
    def after_warmup_breakpoints(self) -> list[Any]:
        """The breakpoints (`AbstractSchedule.breakpoints`) of `after_warmup`,
        as steps of the whole schedule."""

    @abc.abstractmethod
    def after_warmup(
        self,
        s: Float[Array, "*k"],
        warmup: Float[Array, ""],
        peak: Float[Array, ""],
    ) -> Float[Array, "*k"]:
        """The value at the float steps `s` (used where `s >= warmup`)."""

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float[Array, "*k"]:
        s = as_float(step)
        w = as_float(self.warmup_steps)
        peak = as_float(self.peak_value)
        ramp = linear_warmup(s, as_float(self.init_value), peak, w)
        return jnp.where(s < w, ramp, self.after_warmup(s, w, peak))


class WarmupConstant(AbstractWarmup):
    r"""Linear warmup from `init_value` to `peak_value`, then constant.

    $$
    f(s) = \begin{cases}
    \mathrm{init\_value} + (\mathrm{peak\_value}
        - \mathrm{init\_value})\, s / W & s < W \\
    \mathrm{peak\_value} & \text{otherwise}
    \end{cases}
    $$

    with $W$ = `warmup_steps`.

    Equal to `optax.warmup_constant_schedule` for `warmup_steps >= 1`. With
    `warmup_steps == 0` this gives `peak_value` at every step, where optax gives
    `init_value` forever. torch's `LinearLR(start_factor, 1.0, total_iters)`.

    **Arguments:**

    - `init_value`: the value at step 0, `>= 0`.
    - `peak_value`: the value from `warmup_steps` on, `>= 0`.
    - `warmup_steps`: the length of the ramp, `>= 0`.
    """

    init_value: Value = value_field()
    peak_value: Value = value_field()
    warmup_steps: Count = count_field(at_least_one=False)

    def after_warmup_breakpoints(self) -> list[Any]:
        return []

    def after_warmup(self, s, warmup, peak):
        return peak


class WarmupExponentialDecay(AbstractWarmup):
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

    init_value: Value = value_field()
    peak_value: Value = value_field()
    warmup_steps: Count = count_field(at_least_one=False)
    # The arguments of `ExponentialDecay` after its `init_value` (the peak here).
    transition_steps: Count = count_field()
    decay_rate: Value = factor_field()
    transition_begin: Count = count_field(0, at_least_one=False)
    staircase: bool = flag_field(False, kw_only=False)
    end_value: Value | None = checked_field(optional_value, None)

    def after_warmup_breakpoints(self) -> list[Any]:
        return []  # monotone from the peak on

    def after_warmup(self, s, warmup, peak):
        return exponential(
            s - warmup,
            peak,
            as_float(self.decay_rate),
            as_float(self.transition_steps),
            as_float(self.transition_begin),
            self.staircase,
            self.end_value,
        )


def _decay_steps(decay_steps: Any, decay_fraction: Any, total_steps: Array) -> Array:
    """`WarmupStableDecay`'s decay length, given or as a fraction of the total."""
    if decay_steps is not None and decay_fraction is not None:
        raise ValueError(
            "give decay_steps or decay_fraction, not both; got "
            f"decay_steps={decay_steps!r} and decay_fraction={decay_fraction!r}"
        )
    if decay_steps is not None:
        return positive_count("decay_steps", decay_steps)
    raw = 0.2 if decay_fraction is None else decay_fraction
    fraction = hyperparameter("decay_fraction", raw, low=0.0, high=1.0, low_open=True)
    steps = fraction_of(raw, fraction, total_steps, round)
    if is_concrete(steps) and int(steps) < 1:
        raise ValueError(
            "decay_fraction * total_steps must round to at least one step, "
            f"got decay_fraction={float(fraction)!r} and total_steps="
            f"{int(total_steps)}"
        )
    return steps


class WarmupStableDecay(AbstractWarmup):
    r"""Warmup-stable-decay ("WSD", trapezoidal): a linear warmup, a constant plateau
    at `peak_value`, then a decay to `end_value` over the last `decay_steps` of
    `total_steps`, held afterwards.

    With $W$ = `warmup_steps`, $T$ = `total_steps`, $D$ = `decay_steps`,
    $p = \operatorname{clip}\left(\frac{s - (T - D)}{D}, 0, 1\right)$, and `init`,
    `peak`, `end` for `init_value`, `peak_value`, `end_value`:

    $$
    \begin{aligned}
    f(s) &= \mathrm{init} + (\mathrm{peak} - \mathrm{init}) \, s / W && s < W \\
    f(s) &= \mathrm{end} + (\mathrm{peak} - \mathrm{end}) \operatorname{shape}(p)
        && \text{otherwise} \\
    \operatorname{shape}(p) &= 1 - p && \text{("linear")} \\
    \operatorname{shape}(p) &= \tfrac{1}{2} (1 + \cos \pi p) && \text{("cosine")} \\
    \operatorname{shape}(p) &= 1 - \sqrt{p} && \text{("1-sqrt", Hägele et al. 2024)}
    \end{aligned}
    $$

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

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxopt

    schedule = eqxopt.WarmupStableDecay(
        peak_value=1.0, warmup_steps=10, total_steps=100, decay_steps=20
    )
    values = schedule(jnp.array([0, 5, 10, 50, 80, 90, 100]))
    assert jnp.allclose(values, jnp.array([0.0, 0.5, 1.0, 1.0, 1.0, 0.5, 0.0]))
    ```
    """

    total_steps: Int[Array, ""]
    decay_steps: Int[Array, ""]
    peak_value: Value = value_field()
    warmup_steps: Count = count_field(at_least_one=False)
    init_value: Value = value_field(0.0)
    end_value: Value = value_field(0.0)
    decay_shape: str = choice_field("linear", ("linear", "cosine", "1-sqrt"))

    def __init__(
        self,
        peak_value: Value,
        warmup_steps: Count,
        total_steps: Count,
        *,
        decay_steps: Count | None = None,
        decay_fraction: Value | None = None,
        init_value: Value = 0.0,
        end_value: Value = 0.0,
        decay_shape: str = "linear",
    ):
        self.peak_value, self.warmup_steps = peak_value, warmup_steps
        self.total_steps = positive_count("total_steps", total_steps)
        self.decay_steps = _decay_steps(decay_steps, decay_fraction, self.total_steps)
        self.init_value, self.end_value = init_value, end_value
        self.decay_shape = decay_shape

    def __check_init__(self) -> None:
        counts = (self.warmup_steps, self.total_steps, self.decay_steps)
        if all(is_concrete(x) for x in counts):
            w, t, d = (int(np.asarray(x)) for x in counts)
            if w + d > t:
                raise ValueError(
                    "warmup_steps + decay_steps must be <= total_steps, got "
                    f"warmup_steps={w}, decay_steps={d} and total_steps={t}"
                )

    def after_warmup_breakpoints(self) -> list[Any]:
        # The plateau, then the decay over the last `decay_steps`.
        return [steps(self.total_steps) - steps(self.decay_steps), self.total_steps]

    def after_warmup(self, s, warmup, peak):
        d = as_float(self.decay_steps)
        end = as_float(self.end_value)
        p = jnp.clip((s - (as_float(self.total_steps) - d)) / d, 0.0, 1.0)
        if self.decay_shape == "linear":
            shape = 1.0 - p
        elif self.decay_shape == "cosine":
            shape = 0.5 * (1.0 + jnp.cos(jnp.pi * p))
        else:
            shape = 1.0 - jnp.sqrt(p)
        return end + (peak - end) * shape
