"""D-Adaptation (Defazio & Mishchenko, 2023): a learning rate from a running lower
bound on the distance to the solution. AdamW and SGD."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import Grads, Params, Updates
from ..._core._checks import renames
from ..._core._fields import (
    ScalarOrSchedule,
    axis_name_field,
    hyper,
    learning_rate_field,
    values_at,
    weight_decay_field,
)
from ..._core._leafwise import AbstractEngineTransform, map_leaves
from ..._core._norms import divisible, statistic_like
from ..._core._shards import AxisName
from ..._core._tree import abs_sq, float_leaves_like, increment, zero_step
from ._sums import copy_params, re_dot, tree_sums


class DAdaptAdamWState(eqx.Module):
    """State of `DAdaptAdamW`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: first moment of `dlr * g`, shaped like params (`None` at non-float
      leaves).
    - `nu`: second moment of `g`, shaped like params.
    - `grad_sum`: `s`, the weighted sum of `dlr * g`, shaped like params.
    - `d`: scalar, the current estimate of the learning rate (distance to
      the solution), starting at `d0`.
    - `numerator`: scalar, the weighted sum of `dlr * <g, s / (sqrt(nu)
      + eps)>`.

    The float scalars are float32, or float64 for float64 parameters under
    `jax_enable_x64` (the dtype of sums over the parameters).
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]
    grad_sum: PyTree[Float[Array, "..."] | None]
    d: Float[Array, ""]
    numerator: Float[Array, ""]


class DAdaptAdamW(AbstractEngineTransform):
    r"""D-Adaptation AdamW (Defazio & Mishchenko, 2023, "Learning-Rate-Free
    Learning by D-Adaptation"): AdamW whose learning rate `d` grows with a lower
    bound on the distance to the solution (in the infinity norm); `learning_rate`
    is a multiplier (schedule) around 1.

    With `t = step + 1`, `sched` the learning rate at `step`, `r = sqrt(b2)` and
    sums `<., .>` and `|.|_1` over every leaf that has a gradient:

    $$
    \begin{aligned}
    \mathrm{dlr} &= d \cdot \mathrm{sched} \cdot \sqrt{1 - b_2^t} / (1 - b_1^t) \\
    \mathrm{num} &\leftarrow r\, \mathrm{num} + (1 - r)\, \mathrm{dlr}
        \left\langle g, \frac{s}{\sqrt{\nu} + \epsilon} \right\rangle
        && \text{(old $s$, $\nu$)} \\
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, \mathrm{dlr}\, g \\
    \nu &\leftarrow b_2 \nu + (1 - b_2) |g|^2 \\
    s &\leftarrow r s + (1 - r)\, \mathrm{dlr}\, g \\
    d' &= \max\left(d, \frac{\mathrm{num}}{(1 - r) \|s\|_1}\right) \\
    p &\leftarrow p - \frac{\mu}{\sqrt{\nu} + \epsilon}
        - \mathrm{weight\_decay} \cdot \mathrm{dlr} \cdot p
    \end{aligned}
    $$

    The same as `optax.contrib.dadapt_adamw` (`betas=(b1, b2)`, `estim_lr0` is
    `d0`), which takes the bias correction in `dlr` always (the authors'
    `DAdaptAdam` makes it an option, off by default), except that when `|s|_1` is
    zero (all gradients so far zero) `d` is kept instead of becoming NaN. A leaf
    whose gradient is `None` takes no part in the sums. Complex leaves use
    `|g|**2` and the real inner product.

    **Arguments:**

    - `learning_rate`: the multiplier of `d`: a float `>= 0`, a scalar array, or
      a schedule module (default `1.0`).
    - `b1`: decay of the first moment, in `[0, 1)`.
    - `b2`: decay of the second moment, in `(0, 1)`.
    - `eps`: added to the root of the second moment, `> 0`.
    - `d0`: the initial (under-)estimate of the learning rate, `> 0` (a number:
      the state starts at it).
    - `weight_decay`: decoupled decay coefficient (times `dlr`), `>= 0`.
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: the
      whole-tree sums its step size comes from cover the whole model (each leaf
      summed over the named axes it is split over), as the unsharded run. `None`
      (default): this device's blocks only.
    """

    reduces_over = "tree"

    reads_params = "estimate of the distance from the initial parameters"

    # optax's spellings (`_checks.refuse_renamed`)
    renamed_arguments = renames(betas=("b1", "b2"), estim_lr0=("d0",))

    axis_name: AxisName = axis_name_field()

    learning_rate: ScalarOrSchedule = learning_rate_field(1.0)
    b1: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True, kw_only=True)
    b2: ScalarOrSchedule = hyper(
        0.999, low=0.0, high=1.0, low_open=True, high_open=True, kw_only=True
    )
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0, low_open=True, kw_only=True)
    # The state's starting estimate of `d`: used at `init`, so not a schedule.
    d0: ScalarOrSchedule = hyper(
        1e-6, low=0.0, low_open=True, schedule=False, kw_only=True
    )
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)

    def init(self, params: Params) -> DAdaptAdamWState:
        return DAdaptAdamWState(
            step=zero_step(),
            mu=float_leaves_like(params),
            nu=float_leaves_like(params),
            grad_sum=float_leaves_like(params),
            d=statistic_like(params, self.d0),
            numerator=statistic_like(params),
        )

    def run(
        self, grads: Grads, state: DAdaptAdamWState, params: Params, *, apply: bool
    ) -> tuple[Updates, DAdaptAdamWState]:
        h = values_at(self, state.step)
        t = increment(state.step)
        tf = t.astype(jnp.float32)
        b1, b2, eps = h.b1, h.b2, h.eps
        r = jnp.sqrt(b2)
        dlr = state.d * h.learning_rate * jnp.sqrt(1 - b2**tf) / (1 - b1**tf)

        # Per leaf: the moments, and this leaf's terms of the two whole-tree sums.
        def moments(g, p, mu, nu, s):
            nu = jnp.real(nu)
            slope = re_dot(g, s / (jnp.sqrt(nu) + eps))
            mu = b1 * mu + (1 - b1) * dlr * g
            nu = b2 * nu + (1 - b2) * abs_sq(g)
            s = r * s + (1 - r) * dlr * g
            return jnp.stack([slope, jnp.sum(jnp.abs(s))]), mu, nu, s

        total, (mu, nu, grad_sum) = tree_sums(
            moments,
            2,
            grads,
            params,
            (state.mu, state.nu, state.grad_sum),
            axis_name=self.axis_name,
            owner=type(self).__name__,
        )
        numerator = r * state.numerator + (1 - r) * dlr * total[0]
        l1 = total[1]
        # No gradient yet: d stays; a NaN gradient: d turns NaN (as in optax).
        grown = divisible(l1)
        estimate = numerator / ((1 - r) * jnp.where(grown, l1, 1.0))
        new_d = jnp.where(grown, jnp.maximum(state.d, estimate), state.d)
        wd = h.weight_decay

        def step(g, p, mu, nu):
            direction = mu / (jnp.sqrt(jnp.real(nu)) + eps)
            return -direction - wd * dlr * p, mu, nu

        # mu and nu pass through unchanged; only the leaves with gradients move.
        updates, _ = map_leaves(
            step, grads, params, (mu, nu), elementwise=True, apply=apply
        )
        return updates, DAdaptAdamWState(
            step=t,
            mu=mu,
            nu=nu,
            grad_sum=grad_sum,
            d=new_d.astype(state.d.dtype),
            numerator=numerator.astype(state.d.dtype),
        )


class DAdaptSGDState(eqx.Module):
    """State of `DAdaptSGD`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `grad_sum`: `s`, the sum of `dlr * g`, shaped like params (`None` at
      non-float leaves).
    - `params0`: the parameters at `init`, shaped like params.
    - `d`: scalar, the current estimate of the distance to the solution,
      starting at `d0`.
    - `g0_norm`: scalar, the norm of the first non-zero gradient (zero
      until then).
    - `gsq_weighted`: scalar, the sum of `dlr**2 * |g|**2`.

    The float scalars are float32, or float64 for float64 parameters under
    `jax_enable_x64` (the dtype of sums over the parameters).
    """

    step: Int[Array, ""]
    grad_sum: PyTree[Float[Array, "..."] | None]
    params0: PyTree[Float[Array, "..."] | None]
    d: Float[Array, ""]
    g0_norm: Float[Array, ""]
    gsq_weighted: Float[Array, ""]


class DAdaptSGD(AbstractEngineTransform):
    r"""D-Adaptation SGD (Defazio & Mishchenko, 2023, "Learning-Rate-Free Learning
    by D-Adaptation"): dual averaging whose step size `d` grows with a lower bound
    on the distance to the solution; `learning_rate` is a multiplier (schedule)
    around 1.

    With norms over every leaf that has a gradient, `lr` the learning rate at the
    current step and `g0` the norm of the first non-zero gradient (the $\min$ with
    `growth_rate * d` only when `growth_rate` is given):

    $$
    \begin{aligned}
    g &\leftarrow g + \mathrm{weight\_decay} \cdot p \\
    \mathrm{dlr} &= d \cdot \mathrm{lr} / g_0 \\
    s &\leftarrow s + \mathrm{dlr}\, g \\
    G &\leftarrow G + \mathrm{dlr}^2 \|g\|^2 \\
    d' &= \max\left(d, \min\left(\frac{\|s\|^2 - G}{\|s\|},
        \mathrm{growth\_rate} \cdot d\right)\right) \\
    p &\leftarrow \mathrm{momentum} \cdot p + (1 - \mathrm{momentum}) (p_0 - s)
    \end{aligned}
    $$

    The same as the authors' `dadaptation.DAdaptSGD` (facebookresearch/
    dadaptation), except that `d` is kept while `s` is zero and a step with a zero
    gradient norm before any other moves nothing (there: a division by zero).
    Their code's default `lr` is `1e-2` while their documentation says to leave
    it at 1; the default here is `1.0`. optax and torch have no equivalent.
    Complex leaves use `|.|**2`.

    **Arguments:**

    - `learning_rate`: the multiplier of the adapted step size: a float `>= 0`,
      a scalar array, or a schedule module (default `1.0`).
    - `momentum`: the weight of the current iterate in the average, in `[0, 1)`.
    - `weight_decay`: coefficient of `p` added to the gradient (L2), `>= 0`.
    - `d0`: the initial (under-)estimate of the distance, `> 0` (a number: the
      state starts at it).
    - `growth_rate`: the largest factor by which `d` may grow in one step,
      `>= 1`; `None` (the default, the authors' `inf`) leaves it unrestricted.
    - `axis_name`: as for `DAdaptAdamW`.
    """

    reduces_over = "tree"

    reads_params = "estimate of the distance from the initial parameters"

    axis_name: AxisName = axis_name_field()

    learning_rate: ScalarOrSchedule = learning_rate_field(1.0)
    momentum: ScalarOrSchedule = hyper(0.0, low=0.0, high=1.0, high_open=True)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0, kw_only=False)
    # The state's starting estimate of `d`: used at `init`, so not a schedule.
    d0: ScalarOrSchedule = hyper(1e-6, low=0.0, low_open=True, schedule=False)
    growth_rate: ScalarOrSchedule | None = hyper(None, low=1.0, optional=True)

    def init(self, params: Params) -> DAdaptSGDState:
        return DAdaptSGDState(
            step=zero_step(),
            grad_sum=float_leaves_like(params),
            params0=copy_params(params),
            d=statistic_like(params, self.d0),
            g0_norm=statistic_like(params),
            gsq_weighted=statistic_like(params),
        )

    def run(
        self, grads: Grads, state: DAdaptSGDState, params: Params, *, apply: bool
    ) -> tuple[Updates, DAdaptSGDState]:
        h = values_at(self, state.step)
        wd, momentum = h.weight_decay, h.momentum

        def grad_norm(g, p):
            g = g + wd * p
            return (jnp.sum(abs_sq(g))[None],)

        g_sq = tree_sums(
            grad_norm,
            1,
            grads,
            params,
            axis_name=self.axis_name,
            owner=type(self).__name__,
        )[0][0]
        g0_norm = jnp.where(divisible(state.g0_norm), state.g0_norm, jnp.sqrt(g_sq))
        d = state.d
        started = divisible(g0_norm)
        dlr = jnp.where(
            started, d * h.learning_rate / jnp.where(started, g0_norm, 1.0), 0.0
        )

        def accumulate(g, p, s):
            s = s + dlr * (g + wd * p)
            return jnp.sum(abs_sq(s))[None], s

        sk_sq, (grad_sum,) = tree_sums(
            accumulate,
            1,
            grads,
            params,
            (state.grad_sum,),
            axis_name=self.axis_name,
            owner=type(self).__name__,
        )
        sk_sq = sk_sq[0]
        gsq_weighted = state.gsq_weighted + dlr * dlr * g_sq
        sk_norm = jnp.sqrt(sk_sq)
        grown = divisible(sk_sq)
        d_hat = (sk_sq - gsq_weighted) / jnp.where(grown, sk_norm, 1.0)
        if h.growth_rate is not None:
            d_hat = jnp.minimum(d_hat, d * h.growth_rate)
        new_d = jnp.where(grown, jnp.maximum(d, d_hat), d)

        def step(g, p, s, p0):
            new = momentum * p + (1 - momentum) * (p0 - s)
            return new - p, s, p0

        # s and params0 pass through unchanged; only the leaves with gradients move.
        updates, (_, params0) = map_leaves(
            step,
            grads,
            params,
            (grad_sum, state.params0),
            elementwise=True,
            apply=apply,
        )
        return updates, DAdaptSGDState(
            step=increment(state.step),
            grad_sum=grad_sum,
            params0=params0,
            d=new_d.astype(state.d.dtype),
            g0_norm=g0_norm.astype(state.d.dtype),
            gsq_weighted=gsq_weighted.astype(state.d.dtype),
        )
