"""NovoGrad: layer-wise second moments."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import Params
from ..._core._fields import (
    ScalarOrSchedule,
    axis_name_field,
    hyper,
    learning_rate_field,
    weight_decay_field,
)
from ..._core._leafwise import AbstractLeafwiseOptimizer
from ..._core._moments import Moment
from ..._core._shards import AxisName, shard_sum
from ..._core._tree import (
    abs_sq,
    float_leaves_like,
    is_float_leaf,
    scalar_for_leaf,
    zero_step,
)


def leaf_scalars(params: Params) -> PyTree[Array | None]:
    """One zero scalar per float leaf of `params` (NovoGrad's per-layer `nu`),
    `None` elsewhere."""

    def scalar(p):
        return scalar_for_leaf(p) if is_float_leaf(p) else None

    return jax.tree.map(scalar, params)


def novograd_direction(
    h: Any,
    t: Int[Array, ""],
    g: Array,
    p: Array,
    mu: Array,
    nu: Array,
    axis_name: AxisName,
    name: str,
) -> tuple[Array, Array]:
    """NovoGrad's moments at update `t` (see `NovoGrad`), shared with
    `ScaleByNovograd` (`name` is the class, for the sharding errors):
    `(mu, nu)`; `mu` is also the direction."""
    first = t == 1  # the optimizer's first update
    sq_norm = shard_sum(jnp.sum(abs_sq(g)), axis_name, name)
    nu = jnp.where(first, sq_norm, h.b2 * nu + (1 - h.b2) * sq_norm)
    r = g / (jnp.sqrt(nu + h.eps_root) + h.eps) + h.weight_decay * p
    mu = jnp.where(first, r, h.b1 * mu + r)
    return mu, nu


class NovoGradState(eqx.Module):
    """State of `NovoGrad`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: the momentum of normalised gradients, shaped like params (`None` at
      non-float leaves).
    - `nu`: one scalar per float leaf, the moving average of the squared norm of
      that leaf's gradient (`None` at non-float leaves).
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, ""] | None]


class NovoGrad(AbstractLeafwiseOptimizer):
    r"""NovoGrad (Ginsburg et al., 2019): Adam-like steps with one second moment per
    layer.

    For each leaf, with `lr` the learning rate at `step` and $\|g\|$ the Frobenius norm
    of the leaf's gradient:

    $$
    \begin{aligned}
    \nu &\leftarrow \begin{cases} \|g\|^2 & \text{first step} \\
        b_2 \nu + (1 - b_2) \|g\|^2 & \text{later steps} \end{cases} \\
    r &= \frac{g}{\sqrt{\nu + \epsilon_\mathrm{root}} + \epsilon}
        + \mathrm{weight\_decay} \cdot p \\
    \mu &\leftarrow \begin{cases} r & \text{first step} \\
        b_1 \mu + r & \text{later steps} \end{cases} \\
    p &\leftarrow p - \mathrm{lr} \cdot \mu
    \end{aligned}
    $$

    The same as `optax.novograd` (note `mu` is a sum, not an average: no `1 - b1`
    factor, no bias correction). "First step" is the optimizer's first update: a leaf
    whose gradient is `None` then starts its averages from 0 on its first gradient.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: decay of the momentum, in `[0, 1)`.
    - `b2`: decay of the per-layer second moment, in `[0, 1)`.
    - `eps`: added to the root of the second moment, `> 0`.
    - `weight_decay`: coefficient of `p` added to the normalised gradient, `>= 0`.
    - `eps_root`: added inside the root, `>= 0`.
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: the
      norms are those of whole leaves, summed over the named axes a leaf is split
      over, as the unsharded run. `None` (default): this device's block of each
      leaf.
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule = learning_rate_field()
    b1: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True)
    b2: ScalarOrSchedule = hyper(0.25, low=0.0, high=1.0, high_open=True)
    eps: ScalarOrSchedule = hyper(1e-6, low=0.0, low_open=True)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    eps_root: ScalarOrSchedule = hyper(0.0, low=0.0, kw_only=True)
    axis_name: AxisName = axis_name_field()

    state_type = NovoGradState
    moments = (Moment("mu"), Moment("nu", nonnegative=True))
    elementwise = False

    def init(self, params: Params) -> NovoGradState:
        # `nu` is one scalar per leaf, not shaped like it.
        return NovoGradState(
            step=zero_step(), mu=float_leaves_like(params), nu=leaf_scalars(params)
        )

    def leaf(self, h, t, g, p, mu, nu):
        mu, nu = novograd_direction(h, t, g, p, mu, nu, self.axis_name, "NovoGrad")
        return -h.learning_rate * mu, mu, nu
