"""Layer-wise trust-ratio optimizers: LAMB and LARS."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import Params
from ..._core._fields import (
    MaskLike,
    ScalarOrSchedule,
    axis_name_field,
    flag_field,
    hyper,
    learning_rate_field,
    mask_field,
    weight_decay_field,
)
from ..._core._masks import decay_flags
from ..._core._moments import Moment, ref
from ..._core._shards import AxisName
from ..._core._tree import abs_sq, step_power
from ._trust import AbstractTrustRatioOptimizer


class LAMBState(eqx.Module):
    """State of `LAMB`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: first moment (mean of gradients), shaped like params.
    - `nu`: second moment (mean of squared gradients), shaped like params.
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]


class LAMB(AbstractTrustRatioOptimizer):
    r"""LAMB: Adam with a layer-wise trust ratio (You et al., 2020).

    For each leaf, with $t = \mathrm{step} + 1$, `lr` the learning rate at `step`,
    `wd` the weight decay and $\lVert x \rVert$ the Frobenius norm of the whole leaf:

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, g \\
    \nu &\leftarrow b_2 \nu + (1 - b_2)\, g^2 \\
    r &= \frac{\mu / (1 - b_1^t)}
        {\sqrt{\nu / (1 - b_2^t) + \epsilon_\mathrm{root}} + \epsilon}
        + \mathrm{wd} \cdot p && \text{(weight decay only where mask)} \\
    p &\leftarrow p - \mathrm{lr} \, \frac{\lVert p \rVert}{\lVert r \rVert} \, r
        && \text{(ratio 1 where }
            \lVert p \rVert \text{ or } \lVert r \rVert \text{ is 0)}
    \end{aligned}
    $$

    The same as `optax.lamb`. The trust ratio is per leaf, so it is computed on each
    parameter array as a whole.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: decay of the first moment, in `[0, 1)`.
    - `b2`: decay of the second moment, in `(0, 1)`.
    - `eps`: added to the root of the second moment, `> 0`.
    - `weight_decay`: decoupled decay coefficient (inside the trust ratio), `>= 0`.
    - `eps_root`: added inside the root, `>= 0`.
    - `mask`: which leaves get weight decay: `None` (all), a tree of bools (or a
      prefix of params), or a function of params returning one. An Equinox module is
      read as a tree of bools, never called.
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: the
      norms in the trust ratio are those of whole leaves, summed over the named
      axes a leaf is split over, as the unsharded run. `None` (default): this
      device's block of each leaf.

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxopt

    params = {"w": jnp.full((2, 2), 3.0)}
    grads = {"w": jnp.array([[1.0, -1.0], [1.0, -1.0]])}
    opt = eqxopt.LAMB(learning_rate=0.1)
    state = opt.init(params)
    new, state = opt.step(grads, state, params)
    # the trust ratio scales each leaf's step to lr times the leaf's own norm
    step_norm = jnp.linalg.norm(new["w"] - params["w"])
    assert jnp.allclose(step_norm, 0.1 * jnp.linalg.norm(params["w"]), rtol=1e-5)
    ```
    """

    learning_rate: ScalarOrSchedule = learning_rate_field()
    b1: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True)
    b2: ScalarOrSchedule = hyper(
        0.999, low=0.0, high=1.0, low_open=True, high_open=True
    )
    eps: ScalarOrSchedule = hyper(1e-6, low=0.0, low_open=True)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    eps_root: ScalarOrSchedule = hyper(0.0, low=0.0, kw_only=True)
    mask: MaskLike = mask_field()

    axis_name: AxisName = axis_name_field()

    state_type = LAMBState
    moments = (Moment("mu"), Moment("nu", nonnegative=True))
    decay_mask = ref(mask)

    def leaf(self, h, t, g, p, mu, nu, decayed):
        mu = h.b1 * mu + (1 - h.b1) * g
        nu = h.b2 * nu + (1 - h.b2) * abs_sq(g)
        mu_hat = mu / (1 - step_power(h.b1, t))
        nu_hat = nu / (1 - step_power(h.b2, t))
        r = mu_hat / (jnp.sqrt(nu_hat + h.eps_root) + h.eps)
        if decayed:
            r = r + h.weight_decay * p
        return -h.learning_rate * self.scaled(h, r, p), mu, nu


class LARSState(eqx.Module):
    """State of `LARS`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `velocity`: the momentum buffer of learning-rate-scaled steps, shaped like
      params (`None` at non-float leaves); the update is `-velocity` (`optax.lars`
      stores the same buffer with the opposite sign).
    """

    step: Int[Array, ""]
    velocity: PyTree[Float[Array, "..."] | None]


class LARS(AbstractTrustRatioOptimizer):
    r"""LARS: SGD with momentum and a layer-wise trust ratio (You et al., 2017).

    For each leaf, with `lr` the learning rate at `step` and $\|x\|$ the Frobenius norm
    of the whole leaf (the trust ratio is 1 where $\|p\|$ or $\|r\|$ is 0):

    $$
    \begin{aligned}
    r &= g + \mathrm{weight\_decay} \cdot p
        && \text{(decay only where \texttt{weight\_decay\_mask})} \\
    r &\leftarrow \mathrm{trust\_coefficient} \cdot \frac{\|p\|}{\|r\| + \epsilon}\, r
        && \text{(only where \texttt{trust\_ratio\_mask})} \\
    v &\leftarrow \mathrm{momentum} \cdot v + \mathrm{lr} \cdot r \\
    p &\leftarrow p - v && \text{(\texttt{nesterov=False})} \\
    p &\leftarrow p - (\mathrm{lr} \cdot r + \mathrm{momentum} \cdot v)
        && \text{(\texttt{nesterov=True})}
    \end{aligned}
    $$

    The same as `optax.lars`. The learning rate is applied before the momentum
    buffer, as in optax (so a schedule's past values stay in the buffer).

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `weight_decay`: coefficient of the L2 term added to the gradient, `>= 0`.
    - `weight_decay_mask`: which leaves get weight decay: `True` (all, the default),
      a tree of bools (or a prefix of params), or a function of params returning one.
    - `trust_coefficient`: multiplier of the trust ratio, `> 0`.
    - `eps`: added to the update norm in the ratio, `>= 0`.
    - `trust_ratio_mask`: which leaves are scaled by the trust ratio, as
      `weight_decay_mask` (the others take plain momentum SGD steps).
    - `momentum`: in `[0, 1)`.
    - `nesterov`: use Nesterov momentum.
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: the
      norms in the trust ratio are those of whole leaves, summed over the named
      axes a leaf is split over, as the unsharded run. `None` (default): this
      device's block of each leaf.
    """

    learning_rate: ScalarOrSchedule = learning_rate_field()
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0, kw_only=False)
    weight_decay_mask: MaskLike = mask_field(True, kw_only=False)
    trust_coefficient: ScalarOrSchedule = hyper(0.001, low=0.0, low_open=True)
    eps: ScalarOrSchedule = hyper(0.0, low=0.0)
    trust_ratio_mask: MaskLike = mask_field(True, kw_only=False)
    momentum: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True)
    nesterov: bool = flag_field(False, kw_only=False)

    axis_name: AxisName = axis_name_field()

    state_type = LARSState
    moments = (Moment("velocity"),)

    def ratio_options(self, h):
        return dict(trust_coefficient=h.trust_coefficient, eps=h.eps)

    def leaf_flags(self, params: Params) -> Any:
        # Two masks: (decayed, scaled) for each leaf.
        decayed = decay_flags(self.weight_decay_mask, params, "weight_decay_mask")
        scaled = decay_flags(self.trust_ratio_mask, params, "trust_ratio_mask")
        return list(zip(decayed, scaled))

    def leaf(self, h, t, g, p, v, flags):
        decayed, scaled = flags
        r = g + h.weight_decay * p if decayed else g
        if scaled:
            r = self.scaled(h, r, p)
        r = h.learning_rate * r
        v = h.momentum * v + r
        return -(r + h.momentum * v if self.nesterov else v), v
