"""Momo and MomoAdam (Schaipp et al., 2023): momentum with a Polyak-type step size
from the loss value and a lower bound on the loss."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import Grads, Params, Supplied, Updates, supplies
from ..._core._fields import (
    ScalarOrSchedule,
    axis_name_field,
    flag_field,
    hyper,
    learning_rate_field,
    values_at,
    weight_decay_field,
)
from ..._core._leafwise import AbstractEngineTransform, map_leaves
from ..._core._norms import divisible, statistic_like
from ..._core._shards import AxisName
from ..._core._tree import abs_sq, float_leaves_like, increment, zero_step
from ._sums import re_dot, tree_sums

# optax's guard against a zero direction: jnp.finfo(float).eps.
_TINY = float(np.finfo(np.float64).eps)


def _loss(value: Any, owner: str, dtype: Any) -> Float[Array, ""]:
    """The loss passed as `value=`, checked, as a scalar of `dtype` (the state's
    statistics')."""
    if value is None:
        raise TypeError(
            f"{owner} needs the loss at the current parameters: call update/step "
            "with value=loss (a scalar)"
        )
    if jnp.ndim(value) != 0:
        raise ValueError(f"value must be the scalar loss, got shape {jnp.shape(value)}")
    if not jnp.issubdtype(jnp.result_type(value), jnp.floating):
        raise TypeError(
            f"value must be a float scalar, got dtype {jnp.result_type(value)}"
        )
    return jnp.asarray(value, dtype)


def _step_size(h, adapt, barf, gamma, iprod, norm, lb, bc1):
    """Momo's step size `tau` and the new lower bound (shared by both variants;
    `bc1` is 1 for Momo)."""
    decay = 1 + h.learning_rate * h.weight_decay
    if adapt:
        cap = decay * (barf - gamma) + iprod
        lb = jnp.where(
            cap < decay * bc1 * lb,
            jnp.maximum(cap / (2 * bc1 * decay), h.lower_bound),
            lb,
        )
    gap = jnp.maximum(decay * (barf - bc1 * lb - gamma) + iprod, 0.0)
    safe = divisible(norm, _TINY)  # a NaN gradient gives a NaN step, as in optax
    t1 = jnp.where(safe, gap / jnp.where(safe, norm, 1.0), 0.0)
    tau = jnp.minimum(h.learning_rate / bc1, t1)
    if adapt:
        new_lb = (barf + iprod - gamma - 0.5 * tau * norm) / bc1
        lb = jnp.maximum(new_lb, h.lower_bound)
    return tau, lb, h.learning_rate * h.weight_decay / decay


def _initial_scalars(params: Params, lower_bound: Any) -> dict[str, Array]:
    """The loss-model scalars both variants start their state with."""
    return dict(
        loss_avg=statistic_like(params),
        gamma=statistic_like(params),
        lower_bound=statistic_like(params, lower_bound),
    )


def _model_step(opt, h, state, value, beta, total, bc1):
    """The step size `tau` from the loss model, the decay factor, and the new
    loss-model scalars of the state. `total` holds `<g, p>`, `<mu, mu / D>` and
    `<mu, p>` summed over the tree; `bc1` is 1 for Momo."""
    dtype = state.loss_avg.dtype
    f = _loss(value, type(opt).__name__, dtype)
    loss_avg = beta * state.loss_avg + (1 - beta) * f
    gamma = beta * state.gamma + (1 - beta) * total[0]
    tau, lb, shrink = _step_size(
        h,
        opt.adapt_lower_bound,
        loss_avg,
        gamma,
        total[2],
        total[1],
        state.lower_bound,
        bc1,
    )
    scalars = dict(loss_avg=loss_avg, gamma=gamma, lower_bound=lb)
    return tau, shrink, {k: v.astype(dtype) for k, v in scalars.items()}


class MomoState(eqx.Module):
    """State of `Momo`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: the momentum (moving average of gradients), shaped like params
      (`None` at non-float leaves).
    - `loss_avg`: scalar, the moving average of the loss values.
    - `gamma`: scalar, the moving average of `<g, p>`.
    - `lower_bound`: scalar, the current lower bound on the loss.

    The float scalars are float32, or float64 for float64 parameters under
    `jax_enable_x64` (the dtype of sums over the parameters).
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    loss_avg: Float[Array, ""]
    gamma: Float[Array, ""]
    lower_bound: Float[Array, ""]


class Momo(AbstractEngineTransform):
    r"""Momo (Schaipp et al., 2023, "MoMo: Momentum Models for Adaptive Learning
    Rates"): SGD with momentum whose step size is capped by a Polyak-type step
    from a model of the loss; needs the loss value.

    With `f` the loss (passed as `value=`), `lr` the learning rate at the
    current step, `b = beta` (`0` at the first step), inner products over the
    whole tree and `c = 1 + lr * weight_decay`:

    $$
    \begin{aligned}
    \bar f &\leftarrow b \bar f + (1 - b)\, f \\
    \mu &\leftarrow b \mu + (1 - b)\, g \\
    \gamma &\leftarrow b \gamma + (1 - b) \langle g, p \rangle \\
    \tau &= \min\left(\mathrm{lr},
        \frac{\max\left(c\, (\bar f - \mathrm{lb} - \gamma) + \langle \mu, p \rangle,
            0\right)}
        {\|\mu\|^2}\right)
        && \text{($0$ when $\|\mu\|^2 \le 2.2 \cdot 10^{-16}$)} \\
    p &\leftarrow p - \tau \mu - \frac{\mathrm{lr} \cdot \mathrm{weight\_decay}}{c}\, p
    \end{aligned}
    $$

    With `adapt_lower_bound`, the lower bound `lb` (starting at `lower_bound`)
    is updated each step as in the paper's Momo* (optax's `adapt_lower_bound`).

    **The loss is a keyword of `update` and `step`:**

    ```python
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
    model, state = opt.step(grads, state, model, value=loss)
    ```

    The same as `optax.contrib.momo`. Only leaves with a gradient count towards
    the inner products; complex leaves use the real inner product.

    **Arguments:**

    - `learning_rate`: the largest step size (a float `>= 0`, a scalar array or
      a schedule module; default `1.0`).
    - `beta`: decay of the moving averages, in `[0, 1)`.
    - `lower_bound`: a lower bound on the loss (`0` for losses that are
      non-negative), a number: the state starts at it.
    - `weight_decay`: decoupled decay coefficient, `>= 0`.
    - `adapt_lower_bound`: update the lower bound from the losses seen.
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: the
      whole-tree sums its step size comes from cover the whole model (each leaf
      summed over the named axes it is split over), as the unsharded run. `None`
      (default): this device's blocks only.
    """

    reduces_over = "tree"

    reads_params = "model-based step size (the parameters' product with the momentum)"

    axis_name: AxisName = axis_name_field()

    learning_rate: ScalarOrSchedule = learning_rate_field(1.0)
    beta: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True)
    # The state starts at it (and the adapted bound never falls below it): not a
    # schedule.
    lower_bound: ScalarOrSchedule = hyper(0.0, schedule=False)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0, kw_only=False)
    adapt_lower_bound: bool = flag_field(False)

    keywords = supplies(value=Supplied.LOSS)  # the loss

    def init(self, params: Params) -> MomoState:
        return MomoState(
            step=zero_step(),
            mu=float_leaves_like(params),
            **_initial_scalars(params, self.lower_bound),
        )

    def run(
        self,
        grads: Grads,
        state: MomoState,
        params: Params,
        *,
        apply: bool,
        value: Any = None,
    ) -> tuple[Updates, MomoState]:
        h = values_at(self, state.step)
        b = jnp.where(state.step == 0, 0.0, h.beta)

        def moments(g, p, mu):
            mu = b * mu + (1 - b) * g
            sums = jnp.stack([re_dot(g, p), jnp.sum(abs_sq(mu)), re_dot(mu, p)])
            return sums, mu

        total, (mu,) = tree_sums(
            moments,
            3,
            grads,
            params,
            (state.mu,),
            axis_name=self.axis_name,
            owner=type(self).__name__,
        )
        tau, shrink, scalars = _model_step(self, h, state, value, b, total, 1.0)

        def step(g, p, mu):
            return -tau * mu - shrink * p, mu

        updates, _ = map_leaves(
            step, grads, params, (mu,), elementwise=True, apply=apply
        )
        return updates, MomoState(step=increment(state.step), mu=mu, **scalars)


class MomoAdamState(eqx.Module):
    """State of `MomoAdam`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: first moment of the gradients, shaped like params (`None` at
      non-float leaves).
    - `nu`: second moment of the gradients, shaped like params.
    - `loss_avg`: scalar, the moving average of the loss values.
    - `gamma`: scalar, the moving average of `<g, p>`.
    - `lower_bound`: scalar, the current lower bound on the loss.

    The float scalars are float32, or float64 for float64 parameters under
    `jax_enable_x64` (the dtype of sums over the parameters).
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]
    loss_avg: Float[Array, ""]
    gamma: Float[Array, ""]
    lower_bound: Float[Array, ""]


class MomoAdam(AbstractEngineTransform):
    r"""MomoAdam (Schaipp et al., 2023, "MoMo: Momentum Models for Adaptive
    Learning Rates"): Adam whose step size is capped by a Polyak-type step from a
    model of the loss; needs the loss value.

    With `f` the loss (passed as `value=`), `t = step + 1`, `lr` the learning
    rate at `step`, inner products over the whole tree, `c = 1 + lr *
    weight_decay` and `bc1 = 1 - b1**t` ($\tau = 0$ when
    $\langle \mu, \mu / D \rangle \le 2.2 \cdot 10^{-16}$):

    $$
    \begin{aligned}
    \bar f &\leftarrow b_1 \bar f + (1 - b_1)\, f \\
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, g \\
    \nu &\leftarrow b_2 \nu + (1 - b_2) |g|^2 \\
    D &= \epsilon + \sqrt{\nu / (1 - b_2^t)} \\
    \gamma &\leftarrow b_1 \gamma + (1 - b_1) \langle g, p \rangle \\
    \tau &= \min\left(\frac{\mathrm{lr}}{\mathrm{bc}_1},
        \frac{\max\left(c\, (\bar f - \mathrm{bc}_1 \mathrm{lb} - \gamma)
            + \langle \mu, p \rangle, 0\right)}{\langle \mu, \mu / D \rangle}\right) \\
    p &\leftarrow p - \tau \mu / D -
        \frac{\mathrm{lr} \cdot \mathrm{weight\_decay}}{c}\, p
    \end{aligned}
    $$

    With `adapt_lower_bound`, the lower bound `lb` (starting at `lower_bound`)
    is updated each step as in the paper's Momo* (optax's `adapt_lower_bound`).
    The loss is a keyword of `update` and `step` (`value=loss`), as for `Momo`.

    The same as `optax.contrib.momo_adam`. Only leaves with a gradient count
    towards the inner products; complex leaves use `|g|**2` and the real inner
    product.

    **Arguments:**

    - `learning_rate`: the largest step size (a float `>= 0`, a scalar array or
      a schedule module; default `1e-2`).
    - `b1`: decay of the first moment and the averages, in `[0, 1)`.
    - `b2`: decay of the second moment, in `(0, 1)`.
    - `eps`: added to the root of the second moment, `> 0`.
    - `lower_bound`, `weight_decay`, `adapt_lower_bound`, `axis_name`: as for
      `Momo`.
    """

    reduces_over = "tree"

    reads_params = "model-based step size (the parameters' product with the momentum)"

    axis_name: AxisName = axis_name_field()

    learning_rate: ScalarOrSchedule = learning_rate_field(1e-2)
    b1: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True)
    b2: ScalarOrSchedule = hyper(
        0.999, low=0.0, high=1.0, low_open=True, high_open=True
    )
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0, low_open=True)
    # The state starts at it (and the adapted bound never falls below it): not a
    # schedule.
    lower_bound: ScalarOrSchedule = hyper(0.0, schedule=False)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0, kw_only=False)
    adapt_lower_bound: bool = flag_field(False)

    keywords = supplies(value=Supplied.LOSS)  # the loss

    def init(self, params: Params) -> MomoAdamState:
        return MomoAdamState(
            step=zero_step(),
            mu=float_leaves_like(params),
            nu=float_leaves_like(params),
            **_initial_scalars(params, self.lower_bound),
        )

    def run(
        self,
        grads: Grads,
        state: MomoAdamState,
        params: Params,
        *,
        apply: bool,
        value: Any = None,
    ) -> tuple[Updates, MomoAdamState]:
        h = values_at(self, state.step)
        t = increment(state.step)
        tf = t.astype(jnp.float32)
        b1, b2, eps = h.b1, h.b2, h.eps
        bc1, bc2 = 1 - b1**tf, 1 - b2**tf

        def moments(g, p, mu, nu):
            mu = b1 * mu + (1 - b1) * g
            nu = b2 * jnp.real(nu) + (1 - b2) * abs_sq(g)
            precond = eps + jnp.sqrt(nu / bc2)
            sums = jnp.stack([re_dot(g, p), re_dot(mu, mu / precond), re_dot(mu, p)])
            return sums, mu, nu

        total, (mu, nu) = tree_sums(
            moments,
            3,
            grads,
            params,
            (state.mu, state.nu),
            axis_name=self.axis_name,
            owner=type(self).__name__,
        )
        tau, shrink, scalars = _model_step(self, h, state, value, b1, total, bc1)

        def step(g, p, mu, nu):
            precond = eps + jnp.sqrt(jnp.real(nu) / bc2)
            return -tau * mu / precond - shrink * p, mu, nu

        updates, _ = map_leaves(
            step, grads, params, (mu, nu), elementwise=True, apply=apply
        )
        return updates, MomoAdamState(step=t, mu=mu, nu=nu, **scalars)
