"""Building blocks for writing an optimizer as a chain of links, the optax way:
`Chain(ScaleByAdam(b1, b2, eps), AddDecayedWeights(wd), ScaleByLearningRate(lr))`
is `AdamW(lr, b1, b2, eps, wd)`.

Each block is a checked module with named state that runs through the per-leaf
engine (`map_leaves`), so the element-wise ones get the native kernels, and its
float options are hyperparameters (numbers, scalar arrays or schedules): a block
built with new values reuses the compiled step."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from .._core._base import AbstractTransform, Grads, Params, Updates
from .._core._checks import renames
from .._core._fields import (
    DTypeLike,
    ScalarOrSchedule,
    StepValue,
    axis_name_field,
    checked_field,
    dtype_field,
    flag_field,
    hyper,
    learning_rate_field,
    replace,
    step_value,
)
from .._core._leafwise import AbstractLeafwiseOptimizer, map_leaves
from .._core._moments import Moment
from .._core._real import RealOnly
from .._core._shards import AxisName, leaf_norm
from .._core._tree import abs_sq, increment
from .._optimizers._adam._adam_like import AbstractBiasCorrected
from ._state import EmptyState, StepState


class AbstractBlock(AbstractLeafwiseOptimizer):
    """A building block run by the per-leaf engine: its fields plus a `leaf` rule
    (see `AbstractLeafwiseOptimizer`), on the incoming updates `g`. A block scales
    updates rather than stepping, so it has no learning rate (`ScaleByLearningRate`
    is the block that has one)."""

    reads_params = None  # the parameters are not read (`params_needed`)

    # Satisfies the engine's `learning_rate`: blocks have none (not a field, so
    # `values_at` and the hyperparameter readers never see it).
    learning_rate = None


def _t_as(t: Int[Array, ""], like: Array) -> Array:
    return t.astype(jnp.result_type(like))


class ScaleByAdamState(eqx.Module):
    """State of `ScaleByAdam` and of the other two-moment blocks (`ScaleByAdamax`,
    `ScaleByBelief`, `ScaleByRadam`, `ScaleByYogi`).

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: first moment, shaped like params (`None` at non-float leaves).
    - `nu`: second-moment statistic, shaped like params (`None` at non-float
      leaves): the mean of squared updates for most, the infinity norm for
      `ScaleByAdamax`, the variance around `mu` for `ScaleByBelief`.
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]


class ScaleByAdam(AbstractBlock, AbstractBiasCorrected):
    r"""Adam's direction (Kingma & Ba, 2015) without the learning rate: with
    `t = step + 1`,

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, u \\
    \nu &\leftarrow b_2 \nu + (1 - b_2)\, u^2 \\
    u &\leftarrow
        \frac{\mu / (1 - b_1^t)}{\sqrt{\nu / (1 - b_2^t) + \epsilon_\mathrm{root}} +
            \epsilon}
    \end{aligned}
    $$

    With `nesterov=True` the first moment is Dozat's Nesterov estimate
    `b1 * mu / (1 - b1**(t+1)) + (1 - b1) * u / (1 - b1**t)`. The same as
    `optax.scale_by_adam`; `Chain(ScaleByAdam(b1, b2, eps), ScaleByLearningRate(lr))`
    is `Adam(lr, b1, b2, eps)`.

    **Arguments:**

    - `b1`: decay of the first moment, in `[0, 1)`.
    - `b2`: decay of the second moment, in `(0, 1)`.
    - `eps`: added to the root of the second moment, `> 0`.
    - `eps_root`: added inside the root, `>= 0`.
    - `mu_dtype`: dtype to store the first moment in; `None` keeps each
      parameter's dtype.
    - `nesterov`: use the Nesterov first moment (a bool).
    - `nu_dtype`: dtype to store the second moment in (optax has no such option).
    """

    b1: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True)
    b2: ScalarOrSchedule = hyper(
        0.999, low=0.0, high=1.0, low_open=True, high_open=True
    )
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0, low_open=True)
    eps_root: ScalarOrSchedule = hyper(0.0, low=0.0)
    mu_dtype: DTypeLike = dtype_field(storage=True, kw_only=False)
    nesterov: bool = flag_field(False)
    nu_dtype: DTypeLike = dtype_field(storage=True)

    state_type = ScaleByAdamState
    moments = (  # as the fused optimizers' moments
        Moment("mu", dtype=mu_dtype),
        Moment("nu", dtype=nu_dtype, nonnegative=True),
    )
    elementwise = True

    def step_values(self, step: Int[Array, ""]):
        # The bias corrections, once per step rather than once per leaf.
        h = super().step_values(step)
        t = increment(step)
        h = replace(h, bias1=1 - h.b1 ** _t_as(t, h.b1))
        h = replace(h, bias1_next=1 - h.b1 ** _t_as(increment(t), h.b1))
        h = replace(h, bias2=1 - h.b2 ** _t_as(t, h.b2))
        return h

    def leaf(self, h, t, g, p, mu, nu):
        del t, p
        mu = h.b1 * mu + (1 - h.b1) * g
        nu = h.b2 * nu + (1 - h.b2) * abs_sq(g)
        if self.nesterov:
            mu_hat = h.b1 * mu / h.bias1_next + (1 - h.b1) * g / h.bias1
        else:
            mu_hat = mu / h.bias1
        return mu_hat / (jnp.sqrt(nu / h.bias2 + h.eps_root) + h.eps), mu, nu


class ScaleByRmsState(eqx.Module):
    """State of `ScaleByRms`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `nu`: moving average of squared updates, shaped like params (`None` at
      non-float leaves).
    """

    step: Int[Array, ""]
    nu: PyTree[Float[Array, "..."] | None]


def _initial_scale(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    if not value >= 0.0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return float(value)


class ScaleByRms(AbstractBlock):
    r"""Divides by the root of a moving average of squared updates (RMSProp's
    scaling, Hinton 2012), with `t = step + 1`:

    $$
    \begin{aligned}
    \nu &\leftarrow \mathrm{decay} \cdot \nu + (1 - \mathrm{decay})\, u^2 \\
    v &= \begin{cases} \nu / (1
        - \mathrm{decay}^t) & \text{\texttt{bias\_correction}} \\
        \nu & \text{otherwise} \end{cases} \\
    u &\leftarrow \begin{cases} u / \sqrt{v + \epsilon} & \text{\texttt{eps\_in\_sqrt}}
        \\
        u / (\sqrt{v} + \epsilon) & \text{otherwise} \end{cases}
    \end{aligned}
    $$

    The same as `optax.scale_by_rms`.

    **Arguments:**

    - `decay`: decay of the average, in `[0, 1)`.
    - `eps`: added to the average (or its root), `> 0`.
    - `initial_scale`: the value the average starts at, a float `>= 0` (the state's
      initial value, so a Python number).
    - `eps_in_sqrt`: add `eps` inside the root (a bool).
    - `bias_correction`: divide the average by `1 - decay**t` (a bool).
    - `nu_dtype`: dtype to store the average in; `None` keeps each parameter's.
    """

    # Computed once per step (`step_values`).
    bias: StepValue = step_value()

    decay: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True)
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0, low_open=True)
    # The fill of the state at `init`, so it cannot be a schedule or an array.
    initial_scale: float = checked_field(_initial_scale, 0.0, static=True)
    eps_in_sqrt: bool = flag_field(True, kw_only=False)
    bias_correction: bool = flag_field(False, kw_only=False)
    nu_dtype: DTypeLike = dtype_field(storage=True)

    state_type = ScaleByRmsState
    moments = (Moment("nu", dtype=nu_dtype, nonnegative=True, fill=initial_scale),)
    elementwise = True

    def step_values(self, step: Int[Array, ""]):
        h = super().step_values(step)
        h = replace(h, bias=1 - h.decay ** _t_as(increment(step), h.decay))
        return h

    def leaf(self, h, t, g, p, nu):
        del t, p
        nu = h.decay * nu + (1 - h.decay) * abs_sq(g)
        v = nu / h.bias if self.bias_correction else nu
        if self.eps_in_sqrt:
            return g * jax.lax.rsqrt(v + h.eps), nu
        return g / (jnp.sqrt(v) + h.eps), nu


class ScaleBySign(AbstractBlock):
    """Replaces each update by its sign, `u = sign(u)`. The same as
    `optax.scale_by_sign`; `Chain(ScaleBySign(), ScaleByLearningRate(lr))` is
    `SignSGD(lr)`. It takes no arguments.
    """

    state_type = StepState
    moments = ()
    elementwise = True

    def leaf(self, h, t, g, p):
        return (jnp.sign(g),)


class ScaleByTrustRatio(AbstractBlock):
    r"""Scales each leaf's update by its trust ratio (You et al., 2017, 2019: LARS
    and LAMB's layer-wise scaling), with `||.||` the leaf's Euclidean norm:

    $$
    \begin{aligned}
    p_n &= \max(\|p\|, \mathrm{min\_norm}) \\
    u_n &= \max(\|u\|, \mathrm{min\_norm}) \\
    u &\leftarrow u \cdot \mathrm{trust\_coefficient} \cdot \frac{p_n}{u_n + \epsilon}
        && \text{(unchanged if $p_n$ or $u_n$ is 0)}
    \end{aligned}
    $$

    The same as `optax.scale_by_trust_ratio`.

    **Arguments:**

    - `min_norm`: the least value of either norm, `>= 0`.
    - `trust_coefficient`: multiplies the ratio, `>= 0`.
    - `eps`: added to the update's norm, `>= 0`.
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: the
      norms are those of whole leaves, summed over the named axes a leaf is split
      over, as the unsharded run. `None` (default): this device's block of each
      leaf.
    """

    reads_params = "trust ratio (the norm of each parameter)"

    min_norm: ScalarOrSchedule = hyper(0.0, low=0.0)
    trust_coefficient: ScalarOrSchedule = hyper(1.0, low=0.0)
    eps: ScalarOrSchedule = hyper(0.0, low=0.0)
    axis_name: AxisName = axis_name_field()

    state_type = StepState
    moments = ()
    elementwise = False  # the norms reduce over the leaf

    def leaf(self, h, t, g, p):
        pn = jnp.maximum(leaf_norm(p, self.axis_name, "ScaleByTrustRatio"), h.min_norm)
        un = jnp.maximum(leaf_norm(g, self.axis_name, "ScaleByTrustRatio"), h.min_norm)
        ratio = h.trust_coefficient * pn / (un + h.eps)
        ratio = jnp.where((pn == 0) | (un == 0), jnp.ones_like(ratio), ratio)
        return (g * ratio.astype(g.dtype),)


class ScaleByLearningRate(AbstractLeafwiseOptimizer):
    r"""Multiplies updates by the learning rate at the step and, with `flip_sign`
    (the default), by `-1`:

    $$
    u \leftarrow -\mathrm{lr} \cdot u
    $$

    the last link of an optimizer written as a chain (its other links give a
    direction to descend along). The same as `optax.scale_by_learning_rate`.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module (read
      at the step, which starts at 0 as optax's count).
    - `flip_sign`: multiply by `-lr` rather than `lr` (a bool).
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule = learning_rate_field()
    flip_sign: bool = flag_field(True)

    state_type = StepState
    moments = ()
    elementwise = True

    def leaf(self, h, t, g, p):
        return ((-h.learning_rate if self.flip_sign else h.learning_rate) * g,)


class KeepParamsNonnegative(AbstractBlock):
    r"""Changes the updates so that no parameter goes below 0: where `p + u < 0`
    the update is `-p` (the parameter lands on 0),

    $$
    u \leftarrow \begin{cases} -p & p + u < 0 \\ u & \text{otherwise} \end{cases}
    $$

    The same as `optax.keep_params_nonnegative`: the last link of a chain (after
    the learning rate), for parameters that start non-negative (a negative one is
    moved to 0). Real parameters only. It takes no arguments.
    """

    reads_params = "projection onto p >= 0 (it reads the parameters)"
    real_only = RealOnly("the sign of the parameters")

    state_type = StepState
    moments = ()
    elementwise = True

    def leaf(self, h, t, g, p):
        return (jnp.where(p + g < 0, -p.astype(g.dtype), g),)


class TraceState(eqx.Module):
    """State of `Trace`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `trace`: the momentum buffer, shaped like params (`None` at non-float
      leaves).
    """

    step: Int[Array, ""]
    trace: PyTree[Float[Array, "..."] | None]


class Trace(AbstractBlock):
    r"""Momentum (heavy ball, or Nesterov's):

    $$
    \begin{aligned}
    \mathrm{trace} &\leftarrow \mathrm{decay} \cdot \mathrm{trace} + u \\
    u &\leftarrow \mathrm{trace}
        && \text{($u + \mathrm{decay} \cdot \mathrm{trace}$ with \texttt{nesterov})}
    \end{aligned}
    $$

    The same as `optax.trace`; `Chain(Trace(m), ScaleByLearningRate(lr))` is
    `SGD(lr, momentum=m)` from the second step on (torch's first step copies the
    gradient into the buffer, which is the same from a zero buffer).

    **Arguments:**

    - `decay`: the momentum, in `[0, 1]`.
    - `nesterov`: use Nesterov's momentum (a bool).
    - `trace_dtype`: dtype to store the buffer in; `None` keeps each parameter's
      (optax's `accumulator_dtype`).
    """

    # optax's spellings (`_checks.refuse_renamed`)
    # Computed once per step (`step_values`).
    bias: StepValue = step_value()

    renamed_arguments = renames(accumulator_dtype=("trace_dtype",))

    decay: ScalarOrSchedule = hyper(low=0.0, high=1.0)
    nesterov: bool = flag_field(False, kw_only=False)
    trace_dtype: DTypeLike = dtype_field(storage=True)

    state_type = TraceState
    moments = (Moment("trace", dtype=trace_dtype),)
    elementwise = True

    def leaf(self, h, t, g, p, trace):
        trace = g + h.decay * trace
        return (g + h.decay * trace if self.nesterov else trace), trace


class EMAState(eqx.Module):
    """State of `EMA` (the fields of optax's `EmaState`).

    **Fields:**

    - `step`: int32 scalar, the number of updates done (optax's `count`).
    - `ema`: the moving average of the updates, shaped like params (`None` at
      non-float leaves).
    """

    step: Int[Array, ""]
    ema: PyTree[Float[Array, "..."] | None]


class EMA(AbstractBlock):
    r"""An exponential moving average of the updates, with `t = step + 1`:

    $$
    \begin{aligned}
    \mathrm{ema} &\leftarrow \mathrm{decay} \cdot \mathrm{ema} + (1
        - \mathrm{decay})\, u \\
    u &\leftarrow \mathrm{ema} / (1 - \mathrm{decay}^t)
        && \text{(\texttt{ema} itself without \texttt{debias})}
    \end{aligned}
    $$

    The same as `optax.ema`: a link of a chain, averaging whatever reaches it
    (`Trace` is the undamped sum, `decay * trace + u`). It averages updates, not
    parameters: for an average of the weights to evaluate with, use `ParamEMA`.

    **Arguments:**

    - `decay`: decay of the average, in `[0, 1)`.
    - `debias`: divide the average by `1 - decay**t` (a bool).
    - `ema_dtype`: dtype to store the average in; `None` keeps each parameter's
      (optax's `accumulator_dtype`).
    """

    # optax's spellings (`_checks.refuse_renamed`)
    # Computed once per step (`step_values`).
    bias: StepValue = step_value()

    renamed_arguments = renames(accumulator_dtype=("ema_dtype",))

    decay: ScalarOrSchedule = hyper(low=0.0, high=1.0, high_open=True)
    debias: bool = flag_field(True, kw_only=False)
    ema_dtype: DTypeLike = dtype_field(storage=True, kw_only=False)

    state_type = EMAState
    moments = (Moment("ema", dtype=ema_dtype),)
    elementwise = True

    def step_values(self, step: Int[Array, ""]):
        h = super().step_values(step)
        h = replace(h, bias=1 - h.decay ** _t_as(increment(step), h.decay))
        return h

    def leaf(self, h, t, g, p, ema):
        del t, p
        ema = h.decay * ema + (1 - h.decay) * g
        return (ema / h.bias if self.debias else ema), ema


class Identity(AbstractBlock):
    """Passes updates through unchanged (`u = u`), as `optax.identity`: a
    placeholder link. It takes no arguments."""

    state_type = StepState
    moments = ()
    elementwise = True

    def leaf(self, h, t, g, p):
        return (g,)


def _function(name: str, value: Callable[..., Any]) -> Callable:
    if not callable(value) or isinstance(value, eqx.Module):
        raise TypeError(
            f"{name} must be a function of (updates, params), got "
            f"{type(value).__name__}"
        )
    return value


class Stateless(AbstractTransform):
    """A link from a function of the updates and parameters,
    `u = fn(updates, params)`, with no state: the same as `optax.stateless`.

    `fn` gets the updates (full precision; `None` where a leaf gets no update) and
    the parameters with `None` at those same leaves, so
    `jax.tree.map(f, updates, params)` works inside it; it returns a tree of the
    same structure (`None` kept where it got `None`).

    `fn` is static, part of the compiled step's key: pass the same function each
    time (one defined at module level, or a `functools.partial` of one with the
    same arguments), not a new `lambda` per optimizer, or every new optimizer
    compiles its step again.

    **Arguments:**

    - `fn`: a function `(updates, params) -> updates`.
    """

    reads_params = "fn (it is given the parameters)"

    fn: Callable = checked_field(_function, static=True)

    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    def transform(
        self, grads: Grads, state: EmptyState, params: Params
    ) -> tuple[Updates, EmptyState]:
        updates, _ = map_leaves(lambda g, p: (g,), grads, params)
        # Parameters with None where there is no update, so both trees match.
        shown = jax.tree.map(
            lambda u, p: None if u is None else p,
            updates,
            params,
            is_leaf=lambda x: x is None,
        )
        out = self.fn(updates, shown)
        out = jax.tree.map(
            lambda o, u: None if u is None else jnp.asarray(o).astype(u.dtype),
            out,
            updates,
            is_leaf=lambda x: x is None,
        )
        return out, state
