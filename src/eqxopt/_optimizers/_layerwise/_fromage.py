"""Fromage: Frobenius-matched gradient descent."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Int

from ..._core._fields import (
    ScalarOrSchedule,
    axis_name_field,
    hyper,
    learning_rate_field,
)
from ..._core._shards import AxisName
from ._trust import AbstractTrustRatioOptimizer


class FromageState(eqx.Module):
    """State of `Fromage`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done (for learning-rate
      schedules).
    """

    step: Int[Array, ""]


class Fromage(AbstractTrustRatioOptimizer):
    r"""Fromage (Bernstein et al., 2020): steps of relative size `lr` per layer.

    For each leaf, with `lr` the learning rate at `step` and $\|x\|$ the Frobenius norm
    of the whole leaf, each clipped below at `min_norm`:

    $$
    p \leftarrow
        \frac{p - \mathrm{lr} \cdot (\|p\| / \|g\|)\, g}{\sqrt{1 + \mathrm{lr}^2}}
    $$

    The same as `optax.fromage` (which writes it as the trust-ratio step scaled by
    `1 / sqrt(1 + lr**2)` plus a weight decay of `1 / sqrt(1 + lr**2) - 1`).

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `min_norm`: lower bound of both norms in the ratio, `>= 0` (keeps the ratio
      finite for zero parameters or gradients).
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: the
      norms in the trust ratio are those of whole leaves, summed over the named
      axes a leaf is split over, as the unsharded run. `None` (default): this
      device's block of each leaf.
    """

    learning_rate: ScalarOrSchedule = learning_rate_field()
    min_norm: ScalarOrSchedule = hyper(1e-6, low=0.0)

    axis_name: AxisName = axis_name_field()

    state_type = FromageState
    moments = ()

    def ratio_options(self, h):
        return dict(min_norm=h.min_norm)

    def leaf(self, h, t, g, p):
        shrink = 1 / jnp.sqrt(1 + h.learning_rate**2)
        # optax's order: -lr * shrink * step, plus (shrink - 1) * p.
        return ((-h.learning_rate * shrink) * self.scaled(h, g, p) + (shrink - 1) * p,)
