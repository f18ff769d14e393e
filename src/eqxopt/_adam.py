"""Adam and AdamW."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ._base import AbstractTransform, Grads, Params, Updates
from ._checks import hyperparameter
from ._leafwise import map_leaves
from ._schedules import AbstractSchedule, as_schedule
from ._tree import float_leaves_like, increment, zero_step


class AdamState(eqx.Module):
    """State of `Adam` and `AdamW`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: first moment (mean of gradients), shaped like params.
    - `nu`: second moment (mean of squared gradients), shaped like params.
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]


def _dtype_or_none(name: str, dtype: Any) -> Any:
    if dtype is None:
        return None
    try:
        dtype = jnp.dtype(dtype)
    except TypeError:
        raise TypeError(
            f"{name} must be a float dtype or None, got {dtype!r}"
        ) from None
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"{name} must be a float dtype or None, got {dtype}")
    return dtype


def _adam_init(opt: "Adam | AdamW", params: Params) -> AdamState:
    return AdamState(
        step=zero_step(),
        mu=float_leaves_like(params, opt.mu_dtype),
        nu=float_leaves_like(params, opt.nu_dtype),
    )


def _adam_transform(
    opt: "Adam | AdamW",
    grads: Grads,
    state: AdamState,
    params: Params,
    weight_decay: Array | None,
) -> tuple[Updates, AdamState]:
    lr = opt.learning_rate(state.step)
    b1, b2, eps, eps_root = opt.b1, opt.b2, opt.eps, opt.eps_root
    t = increment(state.step)
    bias1 = 1 - b1**t
    bias2 = 1 - b2**t

    def rule(g, p, mu, nu):
        mu = b1 * mu + (1 - b1) * g
        nu = b2 * nu + (1 - b2) * _abs_sq(g)
        direction = (mu / bias1) / (jnp.sqrt(nu / bias2 + eps_root) + eps)
        if weight_decay is not None:
            direction = direction + weight_decay * p
        return -lr * direction, mu, nu

    updates, (mu, nu) = map_leaves(
        rule, grads, params, (state.mu, state.nu), elementwise=True
    )
    return updates, AdamState(step=t, mu=mu, nu=nu)


def _abs_sq(g: Array) -> Array:
    return jnp.real(g * jnp.conj(g)) if jnp.iscomplexobj(g) else g * g


class Adam(AbstractTransform):
    """Adam (Kingma & Ba, 2015).

    For each leaf, with `t = step + 1` and `lr` the learning rate at `step`:

    ```
    mu = b1 * mu + (1 - b1) * g
    nu = b2 * nu + (1 - b2) * g**2
    p  = p - lr * (mu / (1 - b1**t)) / (sqrt(nu / (1 - b2**t) + eps_root) + eps)
    ```

    The same as `optax.adam` and `torch.optim.Adam` (no weight decay).

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: decay of the first moment, in `[0, 1)`.
    - `b2`: decay of the second moment, in `(0, 1)`.
    - `eps`: added to the root of the second moment, `> 0`.
    - `eps_root`: added inside the root, `>= 0` (optax's `eps_root`).
    - `mu_dtype`, `nu_dtype`: dtypes to store the moments in; `None` keeps each
      parameter's dtype. `nu_dtype=jnp.float32` keeps the second moment of bf16
      parameters accurate (optax has no such option).
    """

    learning_rate: AbstractSchedule
    b1: Float[Array, ""]
    b2: Float[Array, ""]
    eps: Float[Array, ""]
    eps_root: Float[Array, ""]
    mu_dtype: Any = eqx.field(static=True)
    nu_dtype: Any = eqx.field(static=True)

    def __init__(
        self,
        learning_rate: Any,
        b1: Any = 0.9,
        b2: Any = 0.999,
        eps: Any = 1e-8,
        *,
        eps_root: Any = 0.0,
        mu_dtype: Any = None,
        nu_dtype: Any = None,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.b1 = hyperparameter("b1", b1, low=0.0, high=1.0, high_open=True)
        self.b2 = hyperparameter(
            "b2", b2, low=0.0, high=1.0, low_open=True, high_open=True
        )
        self.eps = hyperparameter("eps", eps, low=0.0, low_open=True)
        self.eps_root = hyperparameter("eps_root", eps_root, low=0.0)
        self.mu_dtype = _dtype_or_none("mu_dtype", mu_dtype)
        self.nu_dtype = _dtype_or_none("nu_dtype", nu_dtype)

    def init(self, params: Params) -> AdamState:
        return _adam_init(self, params)

    def transform(
        self, grads: Grads, state: AdamState, params: Params
    ) -> tuple[Updates, AdamState]:
        return _adam_transform(self, grads, state, params, None)


class AdamW(AbstractTransform):
    """AdamW: Adam with decoupled weight decay (Loshchilov & Hutter, 2019).

    For each leaf, with `t = step + 1` and `lr` the learning rate at `step`:

    ```
    mu = b1 * mu + (1 - b1) * g
    nu = b2 * nu + (1 - b2) * g**2
    p  = p - lr * ((mu / (1 - b1**t)) / (sqrt(nu / (1 - b2**t) + eps_root) + eps)
                   + weight_decay * p)
    ```

    The decay uses the parameter from before the update and applies to every leaf
    with a gradient. The same as `optax.adamw` and `torch.optim.AdamW`.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: decay of the first moment, in `[0, 1)`.
    - `b2`: decay of the second moment, in `(0, 1)`.
    - `eps`: added to the root of the second moment, `> 0`.
    - `weight_decay`: decoupled decay coefficient, `>= 0`.
    - `eps_root`: added inside the root, `>= 0`.
    - `mu_dtype`, `nu_dtype`: as for `Adam`.
    """

    learning_rate: AbstractSchedule
    b1: Float[Array, ""]
    b2: Float[Array, ""]
    eps: Float[Array, ""]
    eps_root: Float[Array, ""]
    mu_dtype: Any = eqx.field(static=True)
    nu_dtype: Any = eqx.field(static=True)
    weight_decay: Float[Array, ""]

    def __init__(
        self,
        learning_rate: Any,
        b1: Any = 0.9,
        b2: Any = 0.999,
        eps: Any = 1e-8,
        weight_decay: Any = 1e-4,
        *,
        eps_root: Any = 0.0,
        mu_dtype: Any = None,
        nu_dtype: Any = None,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.b1 = hyperparameter("b1", b1, low=0.0, high=1.0, high_open=True)
        self.b2 = hyperparameter(
            "b2", b2, low=0.0, high=1.0, low_open=True, high_open=True
        )
        self.eps = hyperparameter("eps", eps, low=0.0, low_open=True)
        self.eps_root = hyperparameter("eps_root", eps_root, low=0.0)
        self.mu_dtype = _dtype_or_none("mu_dtype", mu_dtype)
        self.nu_dtype = _dtype_or_none("nu_dtype", nu_dtype)
        self.weight_decay = hyperparameter("weight_decay", weight_decay, low=0.0)

    def init(self, params: Params) -> AdamState:
        return _adam_init(self, params)

    def transform(
        self, grads: Grads, state: AdamState, params: Params
    ) -> tuple[Updates, AdamState]:
        return _adam_transform(self, grads, state, params, self.weight_decay)
