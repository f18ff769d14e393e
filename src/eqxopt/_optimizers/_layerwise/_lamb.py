"""Layer-wise trust-ratio optimizers: LAMB and LARS."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import hyperparameter
from ..._core._leafwise import map_leaves
from ..._core._masks import Mask, resolve_mask
from ..._core._schedule import AbstractSchedule, as_schedule
from ..._core._tree import abs_sq, float_leaves_like, increment, zero_step


def _norm(x: Array) -> Array:
    return jnp.sqrt(jnp.sum(abs_sq(x)))


def trust_ratio(
    update: Array,
    param: Array,
    *,
    min_norm: Any = 0.0,
    trust_coefficient: Any = 1.0,
    eps: Any = 0.0,
) -> Array:
    """`trust_coefficient * max(|p|, min_norm) / (max(|u|, min_norm) + eps)` for one
    leaf (Frobenius norms), and `1` where either clipped norm is zero, so that a zero
    parameter or a zero update is not frozen forever (as `optax.scale_by_trust_ratio`).
    """
    param_norm = jnp.maximum(_norm(param), min_norm)
    update_norm = jnp.maximum(_norm(update), min_norm)
    zero = (param_norm == 0.0) | (update_norm == 0.0)
    safe_denominator = jnp.where(zero, 1.0, update_norm + eps)
    return jnp.where(zero, 1.0, trust_coefficient * param_norm / safe_denominator)


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


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


class LAMB(AbstractTransform):
    """LAMB: Adam with a layer-wise trust ratio (You et al., 2020).

    For each leaf, with `t = step + 1`, `lr` the learning rate at `step` and `|x|`
    the Frobenius norm of the whole leaf:

    ```
    mu = b1 * mu + (1 - b1) * g
    nu = b2 * nu + (1 - b2) * g**2
    r  = (mu / (1 - b1**t)) / (sqrt(nu / (1 - b2**t) + eps_root) + eps)
         + weight_decay * p                      (weight decay only where `mask`)
    p  = p - lr * (|p| / |r|) * r                (ratio 1 where |p| or |r| is 0)
    ```

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
    """

    learning_rate: AbstractSchedule
    b1: Float[Array, ""]
    b2: Float[Array, ""]
    eps: Float[Array, ""]
    weight_decay: Float[Array, ""]
    eps_root: Float[Array, ""]
    mask: Mask

    def __init__(
        self,
        learning_rate: Any,
        b1: Any = 0.9,
        b2: Any = 0.999,
        eps: Any = 1e-6,
        weight_decay: Any = 0.0,
        *,
        eps_root: Any = 0.0,
        mask: Mask = None,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.b1 = hyperparameter("b1", b1, low=0.0, high=1.0, high_open=True)
        self.b2 = hyperparameter(
            "b2", b2, low=0.0, high=1.0, low_open=True, high_open=True
        )
        self.eps = hyperparameter("eps", eps, low=0.0, low_open=True)
        self.weight_decay = hyperparameter("weight_decay", weight_decay, low=0.0)
        self.eps_root = hyperparameter("eps_root", eps_root, low=0.0)
        self.mask = mask

    def init(self, params: Params) -> LAMBState:
        return LAMBState(
            step=zero_step(),
            mu=float_leaves_like(params),
            nu=float_leaves_like(params),
        )

    def transform(
        self, grads: Grads, state: LAMBState, params: Params
    ) -> tuple[Updates, LAMBState]:
        lr = self.learning_rate(state.step)
        b1, b2, eps, eps_root = self.b1, self.b2, self.eps, self.eps_root
        weight_decay = self.weight_decay
        t = increment(state.step)
        bias1 = 1 - b1**t
        bias2 = 1 - b2**t

        def rule(g, p, mu, nu, decay):
            mu = b1 * mu + (1 - b1) * g
            nu = b2 * nu + (1 - b2) * abs_sq(g)
            r = (mu / bias1) / (jnp.sqrt(nu / bias2 + eps_root) + eps)
            if decay:
                r = r + weight_decay * p
            return -lr * trust_ratio(r, p) * r, mu, nu

        updates, (mu, nu) = map_leaves(
            rule,
            grads,
            params,
            (state.mu, state.nu),
            elementwise=False,
            flags=resolve_mask(self.mask, params),
        )
        return updates, LAMBState(step=t, mu=mu, nu=nu)


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


class LARS(AbstractTransform):
    """LARS: SGD with momentum and a layer-wise trust ratio (You et al., 2017).

    For each leaf, with `lr` the learning rate at `step` and `|x|` the Frobenius norm
    of the whole leaf:

    ```
    r = g + weight_decay * p                      (decay only where weight_decay_mask)
    r = trust_coefficient * |p| / (|r| + eps) * r (only where trust_ratio_mask;
                                                   ratio 1 where |p| or |r| is 0)
    v = momentum * v + lr * r
    p = p - v                                     (nesterov=False)
    p = p - (lr * r + momentum * v)               (nesterov=True)
    ```

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
    """

    learning_rate: AbstractSchedule
    weight_decay: Float[Array, ""]
    trust_coefficient: Float[Array, ""]
    eps: Float[Array, ""]
    momentum: Float[Array, ""]
    weight_decay_mask: Mask
    trust_ratio_mask: Mask
    nesterov: bool = eqx.field(static=True)

    def __init__(
        self,
        learning_rate: Any,
        weight_decay: Any = 0.0,
        weight_decay_mask: Mask = True,
        trust_coefficient: Any = 0.001,
        eps: Any = 0.0,
        trust_ratio_mask: Mask = True,
        momentum: Any = 0.9,
        nesterov: bool = False,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.weight_decay = hyperparameter("weight_decay", weight_decay, low=0.0)
        self.trust_coefficient = hyperparameter(
            "trust_coefficient", trust_coefficient, low=0.0, low_open=True
        )
        self.eps = hyperparameter("eps", eps, low=0.0)
        self.momentum = hyperparameter(
            "momentum", momentum, low=0.0, high=1.0, high_open=True
        )
        self.weight_decay_mask = weight_decay_mask
        self.trust_ratio_mask = trust_ratio_mask
        self.nesterov = check_bool("nesterov", nesterov)

    def init(self, params: Params) -> LARSState:
        return LARSState(step=zero_step(), velocity=float_leaves_like(params))

    def transform(
        self, grads: Grads, state: LARSState, params: Params
    ) -> tuple[Updates, LARSState]:
        lr = self.learning_rate(state.step)
        weight_decay, momentum = self.weight_decay, self.momentum
        coefficient, eps = self.trust_coefficient, self.eps

        def rule(g, p, v, flags):
            decay, scaled = flags
            r = g + weight_decay * p if decay else g
            if scaled:
                r = trust_ratio(r, p, trust_coefficient=coefficient, eps=eps) * r
            r = lr * r
            v = momentum * v + r
            return -(r + momentum * v if self.nesterov else v), v

        flags = list(
            zip(
                resolve_mask(self.weight_decay_mask, params, "weight_decay_mask"),
                resolve_mask(self.trust_ratio_mask, params, "trust_ratio_mask"),
            )
        )
        updates, (velocity,) = map_leaves(
            rule, grads, params, (state.velocity,), elementwise=False, flags=flags
        )
        return updates, LARSState(step=increment(state.step), velocity=velocity)
