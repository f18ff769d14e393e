"""Schedules that rise and fall: the one-cycle policies (and torch's one-cycle
momentum), cyclical learning rates and SGDR's warm restarts."""

import abc
from collections.abc import Mapping, Sequence
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from beartype import beartype
from jaxtyping import Array, ArrayLike, Float, Int, jaxtyped

from .._core._checks import hyperparameter, positive_count, renames, step_count
from .._core._fields import choice_field, count_field, flag_field, hyper
from .._core._schedule import AbstractSchedule
from ._common import (
    REQUIRED,
    Count,
    Value,
    as_float,
    check_factor,
    check_order,
    check_value,
    cumulative_values,
    factor_field,
    fraction_of,
    interpolate,
    joined,
    linear_warmup,
    steps,
    sum_overflows,
    value_field,
)


def _phase_ends(total: Array, **fractions: Any) -> list[Array]:
    """`int(pct * total)` for each fraction of the cycle (checked to be in
    `[0, 1]`, and `pct_final >= pct_start`)."""
    checked = {
        name: hyperparameter(name, pct, low=0.0, high=1.0)
        for name, pct in fractions.items()
    }
    if "pct_final" in checked:
        start, final = checked["pct_start"], checked["pct_final"]
        check_order("pct_final", final, ">=", "pct_start", start)
    return [fraction_of(fractions[n], checked[n], total, int) for n in checked]


class AbstractOneCycle(AbstractSchedule):
    """A one-cycle policy: from `peak_value / div_factor` through phases ending at
    int32 fractions of `transition_steps`, each phase's value a multiple of the
    last."""

    transition_steps: eqx.AbstractVar[Int[Array, ""]]
    peak_value: eqx.AbstractVar[Value]
    div_factor: eqx.AbstractVar[Value]
    final_div_factor: eqx.AbstractVar[Value]

    def _set_cycle(
        self,
        transition_steps: Count,
        peak_value: Value,
        div_factor: Value,
        final_div_factor: Value,
        **fractions: Value,
    ) -> list[Array]:
        """Sets the fields both policies share (from a custom `__init__`); returns
        the phase ends `int(pct * T)` of `fractions`."""
        self.transition_steps = positive_count("transition_steps", transition_steps)
        self.peak_value = peak_value
        ends = _phase_ends(self.transition_steps, **fractions)
        self.div_factor, self.final_div_factor = div_factor, final_div_factor
        return ends

    def _cycle_at(
        self,
        step: Int[ArrayLike, "*k"],
        ends: Sequence[Array],
        factors: Sequence[Any],
        *,
        cosine: bool,
    ) -> Float[Array, "*k"]:
        """The value at `step`: phases from 0 through `ends` to `T`, starting at
        `peak_value / div_factor`, each the last times its factor."""
        bounds = jnp.stack(
            joined(jnp.zeros((), jnp.int32), *ends, self.transition_steps)
        )
        values = cumulative_values(
            as_float(self.peak_value) / as_float(self.div_factor), list(factors)
        )
        return interpolate(as_float(step), bounds, values, cosine=cosine)

    @abc.abstractmethod
    def phase_ends(self) -> list[Array]:
        """The ends of the phases before the last (int32 steps)."""

    def breakpoints(self) -> list[Any]:
        # Each phase runs from one value to the next, monotone.
        return [*self.phase_ends(), self.transition_steps]


class LinearOneCycle(AbstractOneCycle):
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
    start_step: Int[Array, ""]
    final_step: Int[Array, ""]
    peak_value: Value = value_field()
    div_factor: Value = factor_field(25.0)
    final_div_factor: Value = factor_field(1e4)

    def __init__(
        self,
        transition_steps: Count,
        peak_value: Value,
        pct_start: Value = 0.3,
        pct_final: Value = 0.85,
        div_factor: Value = 25.0,
        final_div_factor: Value = 1e4,
    ):
        self.start_step, self.final_step = self._set_cycle(
            transition_steps,
            peak_value,
            div_factor,
            final_div_factor,
            pct_start=pct_start,
            pct_final=pct_final,
        )

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float[Array, "*k"]:
        div = as_float(self.div_factor)
        factors = [div, 1.0 / div, 1.0 / as_float(self.final_div_factor)]
        return self._cycle_at(step, self.phase_ends(), factors, cosine=False)

    def phase_ends(self) -> list[Array]:
        return [self.start_step, self.final_step]


class CosineOneCycle(AbstractOneCycle):
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
    start_step: Int[Array, ""]
    peak_value: Value = value_field()
    div_factor: Value = factor_field(25.0)
    final_div_factor: Value = factor_field(1e4)

    def __init__(
        self,
        transition_steps: Count,
        peak_value: Value,
        pct_start: Value = 0.3,
        div_factor: Value = 25.0,
        final_div_factor: Value = 1e4,
    ):
        (self.start_step,) = self._set_cycle(
            transition_steps,
            peak_value,
            div_factor,
            final_div_factor,
            pct_start=pct_start,
        )

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float[Array, "*k"]:
        div = as_float(self.div_factor)
        factors = [div, 1.0 / (div * as_float(self.final_div_factor))]
        return self._cycle_at(step, self.phase_ends(), factors, cosine=True)

    def phase_ends(self) -> list[Array]:
        return [self.start_step]


def _cycle_lengths(up: Any, down: Any) -> tuple[Array, Array]:
    """`Cyclic`'s steps up and down (down defaults to up); float32 both when a
    cycle, their sum, is beyond int32."""
    up = positive_count("step_size_up", up)
    down = up if down is None else step_count("step_size_down", down)
    if sum_overflows(up, down):
        return up.astype(jnp.float32), down.astype(jnp.float32)
    return up, down


class Cyclic(AbstractSchedule):
    r"""Cyclical learning rates (Smith, 2017): triangles between `base_lr` and
    `max_lr`, `step_size_up` steps up then `step_size_down` down.

    With `T = step_size_up + step_size_down`, cycle `n = floor(s / T) + 1` and
    `r = s mod T`:

    $$
    \begin{aligned}
    h &= \begin{cases} r / \mathrm{step\_size\_up} & r \le \mathrm{step\_size\_up} \\
        (T - r) / \mathrm{step\_size\_down} & \text{otherwise} \end{cases} \\
    f(s) &= \mathrm{base\_lr} + (\mathrm{max\_lr} - \mathrm{base\_lr}) \cdot h
        \cdot \mathrm{scale}
    \end{aligned}
    $$

    where `scale = 1` (`"triangular"`), `1 / 2 ** (n - 1)` (`"triangular2"`) or
    `gamma ** s` (`"exp_range"`). torch's `CyclicLR` with these modes. Computing `r`
    in integers keeps float32 exact where torch's `1 + s / T - n` would lose digits.

    torch's momentum cycling (`cycle_momentum=True`) is the same triangle upside
    down, `max_momentum - (max_momentum - base_momentum) * h * scale`: pass
    `Cyclic(max_momentum, base_momentum, ...)` (the same lengths, mode and `gamma`)
    as the optimizer's `momentum` (SGD) or `b1` (Adam and its family; torch sets
    `betas[0]`); `base_lr` may be above `max_lr`.

    **Arguments:**

    - `base_lr`: the low end, `>= 0`.
    - `max_lr`: the high end, `>= 0`.
    - `step_size_up`: steps rising, `>= 1`.
    - `step_size_down`: steps falling, `>= 0`; `None` for `step_size_up`.
    - `mode`: `"triangular"`, `"triangular2"` or `"exp_range"` (static).
    - `gamma`: the per-step factor of `"exp_range"`, in `(0, 1]`.
    """

    step_size_up: Int[Array, ""]
    step_size_down: Int[Array, ""]
    base_lr: Value = value_field()
    max_lr: Value = value_field()
    # A number, as every schedule's values (`_common`).
    gamma: Value = hyper(1.0, low=0.0, high=1.0, low_open=True, schedule=False)
    mode: str = choice_field("triangular", ("triangular", "triangular2", "exp_range"))

    def __init__(
        self,
        base_lr: Value,
        max_lr: Value,
        step_size_up: Count = 2000,
        step_size_down: Count | None = None,
        mode: str = "triangular",
        gamma: Value = 1.0,
    ):
        self.base_lr, self.max_lr, self.mode, self.gamma = base_lr, max_lr, mode, gamma
        up, down = _cycle_lengths(step_size_up, step_size_down)
        self.step_size_up, self.step_size_down = up, down

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float[Array, "*k"]:
        s = jnp.maximum(jnp.asarray(step), 0)
        s, up, down = joined(s, self.step_size_up, self.step_size_down)
        total = up + down
        r = s % total
        height = jnp.where(
            r <= up,
            as_float(r) / as_float(up),
            as_float(total - r) / as_float(jnp.maximum(down, 1)),
        )
        if self.mode == "triangular":
            scale = jnp.ones_like(height)
        elif self.mode == "triangular2":
            scale = 1.0 / jnp.power(2.0, as_float(s // total))
        else:
            scale = jnp.power(as_float(self.gamma), as_float(s))
        base = as_float(self.base_lr)
        return base + (as_float(self.max_lr) - base) * height * scale

    def breakpoints(self) -> list[Any]:
        # The first cycle holds the extremes (later ones are the same triangle,
        # or one scaled down towards `base_lr`): up, then down. With
        # "exp_range", `(s / up) * gamma**s` peaks at `s = -1 / ln(gamma)` on the
        # way up.
        up, down = steps(self.step_size_up), steps(self.step_size_down)
        points: list[Any] = [up, up + down]
        gamma = float(np.asarray(self.gamma, np.float64))
        if self.mode == "exp_range" and gamma < 1.0:
            peak = -1.0 / np.log(gamma)
            points += [np.floor(peak), np.floor(peak) + 1.0]
        return points


# Each cycle's keys (the arguments of `optax.warmup_cosine_decay_schedule`): the
# default (`REQUIRED` for none) and the check.
_SGDR_KEYS = {
    "init_value": (0.0, check_value),
    "peak_value": (REQUIRED, check_value),
    "warmup_steps": (0, step_count),
    "decay_steps": (REQUIRED, step_count),
    "end_value": (0.0, check_value),
    "exponent": (1.0, check_factor),
}


def _sgdr_columns(cycles: Any) -> list[Array]:
    """The cycles' values, one array of shape `(n_cycles,)` per key of a cycle."""
    if isinstance(cycles, Mapping) or not isinstance(cycles, (list, tuple)):
        raise TypeError(
            "cycles must be a list of dicts of warmup-cosine arguments, got "
            f"{type(cycles).__name__}"
        )
    if not cycles:
        raise ValueError("cycles must hold at least one cycle, got none")
    rows = []
    for i, cycle in enumerate(cycles):
        where = f"cycles[{i}]"
        if not isinstance(cycle, Mapping):
            raise TypeError(f"{where} must be a dict, got {type(cycle).__name__}")
        unknown = sorted(set(cycle) - set(_SGDR_KEYS))
        if unknown:
            raise ValueError(
                f"{where} has unknown keys {unknown}; allowed: {list(_SGDR_KEYS)}"
            )
        for key, (default, _) in _SGDR_KEYS.items():
            if default is REQUIRED and key not in cycle:
                raise ValueError(f"{where} needs the key {key!r}")
        row = {
            key: check(f"{where}[{key!r}]", cycle.get(key, default))
            for key, (default, check) in _SGDR_KEYS.items()
        }
        warmup, decay = row["warmup_steps"], row["decay_steps"]
        check_order(
            "decay_steps", decay, ">", "warmup_steps", warmup, counts=True, where=where
        )
        rows.append(row)
    columns = {
        key: jnp.stack(joined(*[row[key] for row in rows])) for key in _SGDR_KEYS
    }
    # Cycle i starts after the lengths of those before it: float32 if beyond int32.
    if sum_overflows(columns["decay_steps"][:-1]):
        columns["decay_steps"] = columns["decay_steps"].astype(jnp.float32)
    return list(columns.values())


class SGDR(AbstractSchedule):
    r"""Stochastic gradient descent with warm restarts (Loshchilov & Hutter, 2017):
    a sequence of warmup-cosine cycles, each starting where the last one ended.

    Cycle `i` lasts `decay_steps_i` steps; within it, at local step `t`:

    $$
    \begin{aligned}
    f &= \mathrm{init} + (\mathrm{peak} - \mathrm{init})\, t / \mathrm{warmup}
        && t < \mathrm{warmup} \\
    f &= \mathrm{peak} \left((1 - a) \left(\tfrac{1}{2} \left(1 + \cos
        \frac{\pi c}{\mathrm{decay} - \mathrm{warmup}}\right)\right)^{\mathrm{exponent}}
            + a\right)
        && \text{otherwise}
    \end{aligned}
    $$

    where $c = \min(t - \mathrm{warmup}, \mathrm{decay} - \mathrm{warmup})$ and
    $a = \mathrm{end} / \mathrm{peak}$ ($0$ if $\mathrm{peak} = 0$).

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

    # optax's spellings (`_checks.refuse_renamed`)
    renamed_arguments = renames(cosine_kwargs=("cycles",))

    init_values: Float[Array, " n"]
    peak_values: Float[Array, " n"]
    warmup_steps: Int[Array, " n"]
    decay_steps: Int[Array, " n"]
    end_values: Float[Array, " n"]
    exponents: Float[Array, " n"]

    def __init__(self, cycles: Sequence[Mapping[str, Any]]):
        columns = _sgdr_columns(cycles)
        self.init_values, self.peak_values, self.warmup_steps = columns[:3]
        self.decay_steps, self.end_values, self.exponents = columns[3:]

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float[Array, "*k"]:
        lengths = self.decay_steps
        starts = jnp.concatenate(
            [jnp.zeros((1,), lengths.dtype), jnp.cumsum(lengths[:-1])]
        )
        s, starts = joined(step, starts)
        cycle = jnp.sum(s[..., None] >= starts[1:], axis=-1)
        t = as_float(s - starts[cycle])
        init = as_float(self.init_values[cycle])
        peak = as_float(self.peak_values[cycle])
        end = as_float(self.end_values[cycle])
        warmup = as_float(self.warmup_steps[cycle])
        length = as_float(self.decay_steps[cycle]) - warmup
        ramp = linear_warmup(t, init, peak, warmup)
        c = jnp.minimum(t - warmup, length)
        cosine = 0.5 * (1.0 + jnp.cos(jnp.pi * c / length))
        alpha = jnp.where(peak == 0.0, 0.0, end / jnp.where(peak == 0.0, 1.0, peak))
        exponent = as_float(self.exponents[cycle])
        decay = peak * ((1.0 - alpha) * jnp.power(cosine, exponent) + alpha)
        return jnp.where(t < warmup, ramp, decay)

    def breakpoints(self) -> list[Any]:
        # Each cycle: a monotone ramp, then a monotone decay.
        lengths = steps(self.decay_steps)
        starts = np.concatenate([[0.0], np.cumsum(lengths)[:-1]])
        return [starts, starts + steps(self.warmup_steps), starts + lengths]


class OneCycleMomentum(AbstractSchedule):
    r"""The momentum of torch's `OneCycleLR` (`cycle_momentum=True`): down from
    `max_momentum` to `base_momentum` while the learning rate rises, and back up.

    With torch's phase ends $e_1 = \mathrm{pct\_start} \cdot T - 1$ and
    $e_2 = T - 1$ ($T$ = `total_steps`), and with `three_phase=True`
    $e_2 = 2\, \mathrm{pct\_start} \cdot T - 2$, $e_3 = T - 1$, each phase from
    $e_{i-1}$ ($e_0 = 0$) goes from $a$ to $b$ along

    $$
    f = b + \frac{a - b}{2} (1 + \cos \pi p) \quad (\texttt{"cos"}), \qquad
    f = a + (b - a)\, p \quad (\texttt{"linear"}), \qquad
    p = \frac{s - e_{i-1}}{e_i - e_{i-1}}
    $$

    from `max_momentum` to `base_momentum`, then back to `max_momentum` (and, with
    three phases, held there over the last). Pass it as the optimizer's
    `momentum` (SGD) or `b1` (Adam and its family; torch sets `betas[0]`). From
    `T - 1` on it holds `max_momentum` (torch raises past `T`). The phase ends are
    torch's, one step before optax's: eqxopt's `CosineOneCycle` and
    `LinearOneCycle` are optax's learning-rate curves, so pair this with a
    learning rate of torch's phases for torch's run.

    **Arguments:**

    - `total_steps`: the length of the cycle `T`, `>= 1`.
    - `base_momentum`: the lowest value, at the peak of the learning rate, `>= 0`.
    - `max_momentum`: the highest value, at the start and the end, `>= 0`.
    - `pct_start`: fraction of `T` in the first phase, in `[0, 1]`.
    - `anneal_strategy`: `"cos"` or `"linear"` (static).
    - `three_phase`: torch's three phases (static).
    """

    total_steps: Int[Array, ""] = count_field()
    base_momentum: Value = value_field(0.85)
    max_momentum: Value = value_field(0.95)
    pct_start: Value = hyper(0.3, low=0.0, high=1.0, schedule=False)
    anneal_strategy: str = choice_field("cos", ("cos", "linear"), kw_only=False)
    three_phase: bool = flag_field(False, kw_only=False)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float[Array, "*k"]:
        total = as_float(self.total_steps)
        pct = as_float(self.pct_start)
        high, low = as_float(self.max_momentum), as_float(self.base_momentum)
        s = jnp.minimum(as_float(step), total - 1.0)
        ends = [pct * total - 1.0]
        values = [high, low]
        if self.three_phase:
            ends.append(2.0 * pct * total - 2.0)
            values.append(high)
        ends.append(total - 1.0)
        values.append(high)
        # torch picks the first phase whose end the step has not passed.
        value = jnp.zeros_like(s)
        start = jnp.zeros_like(total)
        chosen = jnp.zeros(s.shape, bool)
        for i, end in enumerate(ends):
            inside = ~chosen & ((s <= end) | (i == len(ends) - 1))
            width = end - start
            p = jnp.where(
                width > 0, (s - start) / jnp.where(width > 0, width, 1.0), 1.0
            )
            p = jnp.clip(p, 0.0, 1.0)
            a, b = values[i], values[i + 1]
            if self.anneal_strategy == "cos":
                here = b + (a - b) / 2.0 * (jnp.cos(jnp.pi * p) + 1.0)
            else:
                here = (b - a) * p + a
            value = jnp.where(inside, here, value)
            chosen = chosen | inside
            start = end
        return value

    def breakpoints(self) -> list[Any]:
        # Each phase is monotone; its ends (`pct * T - 1`, ...) need not be whole
        # steps: the steps on both sides of each.
        total = steps(self.total_steps)
        pct = float(np.asarray(self.pct_start, np.float64))
        ends = [pct * total - 1.0, total - 1.0]
        if self.three_phase:
            ends.append(2.0 * pct * total - 2.0)
        return [np.floor(e) + k for e in ends for k in (0.0, 1.0, 2.0)]
