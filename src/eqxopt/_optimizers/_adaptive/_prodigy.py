"""Prodigy: AdamW that estimates its own learning rate (Mishchenko & Defazio, 2023)."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import Grads, Params, Updates
from ..._core._checks import renames
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
from ..._core._shards import AxisName, shard_total
from ..._core._tree import (
    abs_sq,
    float_leaves_like,
    increment,
    is_float_leaf,
    step_power,
    zero_step,
)


class ProdigyState(eqx.Module):
    """State of `Prodigy`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: first moment of `d * g`, shaped like params.
    - `nu`: second moment of `d * g`, shaped like params.
    - `grad_sum`: the weighted sum `s` of past gradients, shaped like params.
    - `params0`: the parameters at `init`, shaped like params.
    - `d`: scalar, the current estimate of the learning rate (distance to
      the solution), starting at `d0`.
    - `numerator`: scalar, the weighted sum of `<g, params0 - p>`.

    The float scalars are float32, or float64 for float64 parameters under
    `jax_enable_x64` (the dtype of sums over the parameters).
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]
    grad_sum: PyTree[Float[Array, "..."] | None]
    params0: PyTree[Float[Array, "..."] | None]
    d: Float[Array, ""]
    numerator: Float[Array, ""]


class Prodigy(AbstractEngineTransform):
    r"""Prodigy (Mishchenko & Defazio, 2023): AdamW with a learning rate `d` that it
    estimates itself; `learning_rate` is a multiplier (schedule) around 1.

    With `t = step + 1`, `sched` the learning rate at `step`, sums `<., .>` and
    `|.|_1` over every leaf that has a gradient (with `safeguard_warmup`, $s$ adds
    $(d / d_0)\, d\, g$ instead of $(d / d_0)\, \mathrm{dlr}\, g$):

    $$
    \begin{aligned}
    \mathrm{dlr} &= d \cdot \mathrm{sched} \cdot \sqrt{1 - b_2^t} / (1 - b_1^t) \\
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, d\, g \\
    \nu &\leftarrow b_2 \nu + (1 - b_2) (d\, g)^2 \\
    s &\leftarrow b_3 s + (d / d_0)\, \mathrm{dlr}\, g \\
    \mathrm{numerator} &\leftarrow b_3\, \mathrm{numerator}
        + (d / d_0)\, \mathrm{dlr} \langle g, p_0 - p \rangle \\
    d' &= \max\left(d, d_\mathrm{coef} \cdot \mathrm{numerator} / \|s\|_1\right) \\
    p &\leftarrow p - \mathrm{dlr} \left(\frac{\mu}{\sqrt{\nu} + d' \epsilon}
        + \mathrm{weight\_decay} \cdot p\right)
    \end{aligned}
    $$

    The same as `optax.contrib.prodigy` (`b3` is its `beta3`, default
    `sqrt(b2)`; `d0` its `estim_lr0`; `d_coef` its `estim_lr_coef`), except that
    when `|s|_1` is zero (all gradients so far zero) `d` is kept instead of
    becoming NaN. A leaf whose gradient is `None` takes no part in the sums.

    **Arguments:**

    - `learning_rate`: the multiplier of `d`: a float `>= 0`, a scalar array, or
      a schedule module (default `1.0`).
    - `b1`: decay of the first moment, in `[0, 1)`.
    - `b2`: decay of the second moment, in `(0, 1)`.
    - `b3`: decay of the sums behind the estimate of `d`, in `[0, 1)`; `None`
      gives `sqrt(b2)` (at each step, if `b2` is a schedule).
    - `eps`: added to the root of the second moment (times `d`), `> 0`.
    - `d0`: the initial (under-)estimate of the learning rate, `> 0` (a number:
      the state starts at it).
    - `d_coef`: multiplies the estimates of `d`, `> 0`.
    - `weight_decay`: decoupled decay coefficient, `>= 0`.
    - `safeguard_warmup`: leave the learning rate out of the sum `s`, to avoid
      overestimating `d` during warmup.
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: the
      whole-tree sums `d` comes from cover the whole model (each leaf summed over
      the named axes it is split over), as the unsharded run. `None` (default):
      this device's blocks only.
    """

    reduces_over = "tree"

    reads_params = "estimate of the distance from the initial parameters"

    # optax's spellings (`_checks.refuse_renamed`)
    renamed_arguments = renames(
        betas=("b1", "b2"), beta3=("b3",), estim_lr0=("d0",), estim_lr_coef=("d_coef",)
    )

    learning_rate: ScalarOrSchedule = learning_rate_field(1.0)
    b1: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True, kw_only=True)
    b2: ScalarOrSchedule = hyper(
        0.999, low=0.0, high=1.0, low_open=True, high_open=True, kw_only=True
    )
    b3: ScalarOrSchedule | None = hyper(
        None, low=0.0, high=1.0, high_open=True, optional=True, kw_only=True
    )
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0, low_open=True, kw_only=True)
    # The state's starting estimate of `d`: used at `init`, so not a schedule.
    d0: ScalarOrSchedule = hyper(
        1e-6, low=0.0, low_open=True, schedule=False, kw_only=True
    )
    d_coef: ScalarOrSchedule = hyper(1.0, low=0.0, low_open=True, kw_only=True)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    safeguard_warmup: bool = flag_field(False)
    axis_name: AxisName = axis_name_field()

    def init(self, params: Params) -> ProdigyState:
        def copy(p):
            return jnp.array(p, copy=True) if is_float_leaf(p) else None

        return ProdigyState(
            step=zero_step(),
            mu=float_leaves_like(params),
            nu=float_leaves_like(params),
            grad_sum=float_leaves_like(params),
            params0=jax.tree.map(copy, params),
            d=statistic_like(params, self.d0),
            numerator=statistic_like(params),
        )

    def run(
        self, grads: Grads, state: ProdigyState, params: Params, *, apply: bool
    ) -> tuple[Updates, ProdigyState]:
        h = values_at(self, state.step)
        t = increment(state.step)
        b1, b2, d0 = h.b1, h.b2, h.d0
        b3 = jnp.sqrt(b2) if h.b3 is None else h.b3
        d = state.d
        sched = h.learning_rate
        dlr = d * sched * jnp.sqrt(1 - step_power(b2, t)) / (1 - step_power(b1, t))
        s_scale = d if self.safeguard_warmup else dlr

        # First pass, per leaf: the moments, the sum s, and this leaf's terms of
        # the two whole-tree sums (returned in place of an update).
        def moments(g, p, mu, nu, s, p0):
            dg = d * g
            mu = b1 * mu + (1 - b1) * dg
            nu = b2 * nu + (1 - b2) * abs_sq(dg)
            s = b3 * s + s_scale * dg / d0
            # Re<g, p0 - p>: the slope towards the start, real for complex leaves.
            slope = jnp.real(jnp.vdot(g, p0 - p))
            sums = jnp.stack([slope, jnp.sum(jnp.abs(s))])
            return sums, mu, nu, s, p0

        sums, (mu, nu, grad_sum, params0) = map_leaves(
            moments,
            grads,
            params,
            (state.mu, state.nu, state.grad_sum, state.params0),
        )
        dtype = state.d.dtype  # that of sums over the parameters
        partials = [x.astype(dtype) for x in jax.tree.leaves(sums)]
        total = jnp.zeros(2, dtype) + shard_total(
            partials, self.axis_name, "Prodigy", dtype
        )
        numerator = b3 * state.numerator + (d / d0) * dlr * total[0]
        denominator = total[1]
        # No gradient yet: d stays; a NaN gradient: d turns NaN (as in optax).
        grown = divisible(denominator)
        estimate = h.d_coef * numerator / jnp.where(grown, denominator, 1)
        new_d = jnp.where(grown, jnp.maximum(d, estimate), d)

        eps, wd = h.eps, h.weight_decay

        def step(g, p, mu, nu):
            direction = mu / (jnp.sqrt(nu) + new_d * eps) + wd * p
            return -dlr * direction, mu, nu

        # mu and nu pass through unchanged; only the leaves with gradients move.
        updates, _ = map_leaves(
            step, grads, params, (mu, nu), elementwise=True, apply=apply
        )
        return updates, ProdigyState(
            step=t,
            mu=mu,
            nu=nu,
            grad_sum=grad_sum,
            params0=params0,
            d=new_d.astype(dtype),
            numerator=numerator.astype(dtype),
        )
