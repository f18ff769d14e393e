"""Decays from a starting value: polynomial and linear, exponential, cosine, and
torch's step and multi-step decays."""

import abc
from typing import Any

import equinox as eqx
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import Array, ArrayLike, Float, Int, jaxtyped

from .._core._fields import checked_field, choice_field, count_field, flag_field
from .._core._schedule import AbstractSchedule
from ._common import (
    Count,
    Steps,
    Value,
    as_float,
    boundary_steps,
    exponential,
    factor_field,
    joined,
    optional_value,
    steps,
    value_field,
)


class AbstractTransition(AbstractSchedule):
    """From `init_value` to `end_value` over `transition_steps` steps from
    `transition_begin`, along a curve of the fraction of the way left (1 down to
    0), as optax's polynomial schedules are."""

    init_value: eqx.AbstractVar[Value]
    end_value: eqx.AbstractVar[Value]
    transition_steps: eqx.AbstractVar[Count]
    transition_begin: eqx.AbstractVar[Count]

    @abc.abstractmethod
    def curve(self, left: Float[Array, "*k"]) -> Float[Array, "*k"]:
        """The share of `init_value - end_value` left at the fraction `left`."""

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float[Array, "*k"]:
        s = as_float(step)
        t = as_float(self.transition_steps)
        c = jnp.clip(s - as_float(self.transition_begin), 0.0, t)
        init, end = as_float(self.init_value), as_float(self.end_value)
        return (init - end) * self.curve(1.0 - c / t) + end

    def breakpoints(self) -> list[Any]:
        # Held, then monotone from `init_value` to `end_value`, then held.
        return [steps(self.transition_begin) + steps(self.transition_steps)]


class Polynomial(AbstractTransition):
    r"""Polynomial decay from `init_value` to `end_value` over `transition_steps`.

    $$
    \begin{aligned}
    c &= \operatorname{clip}(
        s - \mathrm{transition\_begin}, 0, \mathrm{transition\_steps}) \\
    f(s) &= (\mathrm{init\_value} - \mathrm{end\_value})
        \left(1 - \frac{c}{\mathrm{transition\_steps}}\right)^{\mathrm{power}}
        + \mathrm{end\_value}
    \end{aligned}
    $$

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

    init_value: Value = value_field()
    end_value: Value = value_field()
    power: Value = factor_field()
    transition_steps: Count = count_field()
    transition_begin: Count = count_field(0, at_least_one=False)

    def curve(self, left: Float[Array, "*k"]) -> Float[Array, "*k"]:
        return jnp.power(left, as_float(self.power))


class Linear(AbstractTransition):
    r"""Linear interpolation from `init_value` to `end_value` over `transition_steps`.

    $$
    \begin{aligned}
    c &= \operatorname{clip}(
        s - \mathrm{transition\_begin}, 0, \mathrm{transition\_steps}) \\
    f(s) &= (\mathrm{init\_value} - \mathrm{end\_value})
        \left(1 - \frac{c}{\mathrm{transition\_steps}}\right) + \mathrm{end\_value}
    \end{aligned}
    $$

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

    init_value: Value = value_field()
    end_value: Value = value_field()
    transition_steps: Count = count_field()
    transition_begin: Count = count_field(0, at_least_one=False)

    def curve(self, left: Float[Array, "*k"]) -> Float[Array, "*k"]:
        return left


class ExponentialDecay(AbstractSchedule):
    r"""Exponential decay by `decay_rate` every `transition_steps`, optionally in stairs
    and bounded by `end_value`.

    $$
    \begin{aligned}
    d &= s - \mathrm{transition\_begin} \\
    p &= \begin{cases} \lfloor d / \mathrm{transition\_steps} \rfloor
        & \text{\texttt{staircase}} \\
        d / \mathrm{transition\_steps} & \text{otherwise} \end{cases} \\
    f(s) &= \begin{cases} \mathrm{init\_value} & d \le 0 \\
        \mathrm{init\_value} \cdot \mathrm{decay\_rate}^p & \text{otherwise} \end{cases}
    \end{aligned}
    $$

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

    init_value: Value = value_field()
    transition_steps: Count = count_field()
    decay_rate: Value = factor_field()
    transition_begin: Count = count_field(0, at_least_one=False)
    staircase: bool = flag_field(False, kw_only=False)
    end_value: Value | None = checked_field(optional_value, None)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float[Array, "*k"]:
        return exponential(
            as_float(step),
            as_float(self.init_value),
            as_float(self.decay_rate),
            as_float(self.transition_steps),
            as_float(self.transition_begin),
            self.staircase,
            self.end_value,
        )

    def breakpoints(self) -> list[Any]:
        return []  # monotone (bounded by `end_value`): step 0 and the last step


class CosineDecay(AbstractSchedule):
    r"""Half-cosine decay from `init_value` to `alpha * init_value` over `decay_steps`.

    With $D$ = `decay_steps`:

    $$
    \begin{aligned}
    c &= \min(s, D), \qquad k = \tfrac{1}{2} \left(1 + \cos \frac{\pi c}{D}\right) \\
    f(s) &= \mathrm{init\_value} \cdot
        \left((1 - \alpha)\, k^{\mathrm{exponent}} + \alpha\right)
    \end{aligned}
    $$

    Equal to `optax.cosine_decay_schedule` (which returns `inf` at the end for an
    `exponent <= 0`; rejected here); torch's `CosineAnnealingLR` (without
    restarts) with `eta_min = alpha * init_value` and `T_max = decay_steps`, up to
    `T_max`.

    **Arguments:**

    - `init_value`: the starting value, `>= 0`.
    - `decay_steps`: the step at which the floor is reached, `>= 1`.
    - `alpha`: the floor as a fraction of `init_value`, `>= 0`.
    - `exponent`: power applied to the cosine factor, `> 0`.

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxopt

    schedule = eqxopt.CosineDecay(init_value=1.0, decay_steps=100, alpha=0.1)
    values = schedule(jnp.array([0, 50, 100, 150]))
    assert jnp.allclose(values, jnp.array([1.0, 0.55, 0.1, 0.1]))
    ```
    """

    init_value: Value = value_field()
    decay_steps: Count = count_field()
    alpha: Value = value_field(0.0)
    exponent: Value = factor_field(1.0)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float[Array, "*k"]:
        d = as_float(self.decay_steps)
        c = jnp.minimum(as_float(step), d)
        cosine = 0.5 * (1.0 + jnp.cos(jnp.pi * c / d))
        alpha = as_float(self.alpha)
        decayed = (1.0 - alpha) * jnp.power(cosine, as_float(self.exponent)) + alpha
        return as_float(self.init_value) * decayed

    def breakpoints(self) -> list[Any]:
        return [self.decay_steps]


class StepDecay(AbstractSchedule):
    r"""Multiply by `gamma` every `step_size` steps.

    $$
    f(s) = \mathrm{init\_value} \cdot \gamma^{\lfloor s / \mathrm{step\_size} \rfloor}
    $$

    torch's `StepLR(optimizer, step_size, gamma)` with `init_value` the optimizer's
    learning rate (torch multiplies in float64 step by step; this takes a power,
    in float32 unless `jax_enable_x64` is on).

    **Arguments:**

    - `init_value`: the value at step 0, `>= 0`.
    - `step_size`: steps between decays, `>= 1`.
    - `gamma`: the factor, `> 0`.
    """

    init_value: Value = value_field()
    step_size: Count = count_field()
    gamma: Value = factor_field(0.1)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float[Array, "*k"]:
        s = jnp.maximum(jnp.asarray(step), 0)
        s, size = joined(s, self.step_size)
        k = as_float(s // size)
        return as_float(self.init_value) * jnp.power(as_float(self.gamma), k)

    def breakpoints(self) -> list[Any]:
        return []  # monotone: step 0 and the last step


class MultiStepDecay(AbstractSchedule):
    r"""Multiply by `gamma` at each milestone.

    $$
    f(s) = \mathrm{init\_value} \cdot \gamma^{\#\{i \,:\, \mathrm{milestone}_i \le s\}}
    $$

    (the exponent is the number of milestones $\le s$).

    torch's `MultiStepLR(optimizer, milestones, gamma)`; a repeated milestone counts
    twice, as in torch. The number of milestones is structure, the steps are an int32
    array field.

    **Arguments:**

    - `init_value`: the value at step 0, `>= 0`.
    - `milestones`: a sorted sequence of integer steps `>= 0`.
    - `gamma`: the factor, `> 0`.
    """

    init_value: Value = value_field()
    milestones: Steps = checked_field(boundary_steps)
    gamma: Value = factor_field(0.1)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float[Array, "*k"]:
        s, milestones = joined(step, self.milestones)
        k = as_float(jnp.sum(s[..., None] >= milestones, axis=-1))
        return as_float(self.init_value) * jnp.power(as_float(self.gamma), k)

    def breakpoints(self) -> list[Any]:
        return []  # monotone: step 0 and the last step


class SWALR(AbstractSchedule):
    r"""Anneal from `init_value` to `swa_lr` over `anneal_steps`, then hold it: the
    learning rate of stochastic weight averaging (`SWA`).

    $$
    \begin{aligned}
    t &= \operatorname{clip}(s / \max(1, \mathrm{anneal\_steps}), 0, 1) \\
    \alpha &= t \quad (\texttt{"linear"}) \qquad
        \alpha = \tfrac{1}{2}(1 - \cos \pi t) \quad (\texttt{"cos"}) \\
    f(s) &= \mathrm{swa\_lr} \cdot \alpha + \mathrm{init\_value} \cdot (1 - \alpha)
    \end{aligned}
    $$

    torch's `swa_utils.SWALR(optimizer, swa_lr, anneal_epochs, anneal_strategy)`
    stepped once per step, with `init_value` the optimizer's learning rate when it
    is built (torch recovers that rate from the last one at each step; this
    computes it in closed form). `anneal_steps=0` is `swa_lr` from step 0, as in
    torch. To switch to it late in training, as torch's example does, join it
    after another schedule: `Join([schedule, SWALR(...)], [swa_start])`.

    **Arguments:**

    - `init_value`: the value at step 0, `>= 0`.
    - `swa_lr`: the value annealed to, `>= 0`.
    - `anneal_steps`: steps of the annealing, an int `>= 0` (torch's
      `anneal_epochs`, default 10).
    - `anneal_strategy`: `"cos"` or `"linear"` (static).
    """

    init_value: Value = value_field()
    swa_lr: Value = value_field()
    anneal_steps: Count = count_field(10, at_least_one=False)
    anneal_strategy: str = choice_field("cos", ("cos", "linear"), kw_only=False)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float[Array, "*k"]:
        steps = jnp.maximum(as_float(self.anneal_steps), 1.0)
        t = jnp.clip(as_float(step) / steps, 0.0, 1.0)
        # torch reads step 0 as 1 when there is no annealing: swa_lr throughout.
        t = jnp.where(as_float(self.anneal_steps) == 0, 1.0, t)
        if self.anneal_strategy == "cos":
            alpha = (1.0 - jnp.cos(jnp.pi * t)) / 2.0
        else:
            alpha = t
        return as_float(self.swa_lr) * alpha + as_float(self.init_value) * (1 - alpha)

    def breakpoints(self) -> list[Any]:
        return [self.anneal_steps]
