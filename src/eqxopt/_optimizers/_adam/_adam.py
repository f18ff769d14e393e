"""The Adam family's close variants: Adam, AdamW, NAdam, NAdamW, AMSGrad, Adamax,
AdamaxW; and the helpers the rest of the family (`_radam.py`, `_yogi.py`, ...)
shares: moment updates, bias corrections, decoupled decay with a mask, and the
validation of the arguments they all take."""

import math
from collections.abc import Callable
from typing import Any, Literal

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import float_dtype_or_none, hyperparameter
from ..._core._leafwise import map_leaves
from ..._core._masks import decay_flags, freeze_mask
from ..._core._schedule import AbstractSchedule, as_schedule
from ..._core._tree import abs_sq, float_leaves_like, increment, zero_step

# --------------------------------------------------------------------------------------
# Shared helpers (module level, used by every file of the family).
# --------------------------------------------------------------------------------------


dtype_or_none = float_dtype_or_none  # the name this family's files use


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def betas_and_eps(
    b1: Any, b2: Any, eps: Any, eps_root: Any = 0.0
) -> tuple[Array, Array, Array, Array]:
    """The usual checks: `b1` in `[0, 1)`, `b2` in `(0, 1)`, `eps > 0`,
    `eps_root >= 0`."""
    return (
        hyperparameter("b1", b1, low=0.0, high=1.0, high_open=True),
        hyperparameter("b2", b2, low=0.0, high=1.0, low_open=True, high_open=True),
        hyperparameter("eps", eps, low=0.0, low_open=True),
        hyperparameter("eps_root", eps_root, low=0.0),
    )


def float_or_schedule(
    name: str, value: Any, **bounds: Any
) -> Float[Array, ""] | AbstractSchedule:
    """A schedule module as given, or a checked scalar array field for a number.

    Unlike `as_schedule`, a number stays a plain array field (so `opt.weight_decay`
    reads as the number); `value_at` evaluates either at a step."""
    if isinstance(value, AbstractSchedule):
        return value
    if callable(value):
        raise TypeError(
            f"{name} must be a float, a scalar array or an eqxopt schedule module; "
            f"got the callable {value!r}"
        )
    return hyperparameter(name, value, **bounds)


def value_at(
    value: Float[Array, ""] | AbstractSchedule, step: Int[Array, ""]
) -> Float[Array, ""]:
    """A hyperparameter's value at `step` (schedules are called, arrays returned)."""
    return value(step) if isinstance(value, AbstractSchedule) else value


def init_moments(
    params: Params, mu_dtype: Any, nu_dtype: Any, nu_fill: float | Array = 0.0
) -> tuple[PyTree, PyTree]:
    """Zero first moments (in `mu_dtype`) and second moments (in `nu_dtype`, filled
    with `nu_fill`); `None` dtypes keep each parameter's dtype."""
    return (
        float_leaves_like(params, mu_dtype),
        float_leaves_like(params, nu_dtype, fill=nu_fill),  # type: ignore[arg-type]
    )


def ema(m: Array, x: Array, b: Array) -> Array:
    """`b * m + (1 - b) * x`: one step of an exponential moving average."""
    return b * m + (1 - b) * x


def bias_correction(b: Array, t: Int[Array, ""]) -> Array:
    """`1 - b**t`."""
    return 1 - b**t


def nesterov_mean(mu: Array, g: Array, b1: Array, t: Int[Array, ""]) -> Array:
    """The bias-corrected Nesterov first moment of Dozat (2016), as optax writes it:
    `b1 * mu / (1 - b1**(t+1)) + (1 - b1) * g / (1 - b1**t)`."""
    return b1 * mu / bias_correction(b1, increment(t)) + (1 - b1) * g / (
        bias_correction(b1, t)
    )


def with_decay(direction: Array, p: Array, weight_decay: Any, flag: bool) -> Array:
    """`direction + weight_decay * p` where the leaf is masked in (`flag`)."""
    return direction + weight_decay * p if flag else direction


# --------------------------------------------------------------------------------------
# States.
# --------------------------------------------------------------------------------------


class AdamState(eqx.Module):
    """State of `Adam`, `AdamW`, `Adamax`, `AdamaxW` and the other Adam variants that
    keep two moments (`RAdam`, `Yogi`, `AdaBelief`, `ADOPT`, `CAdamW`, `StableAdamW`).

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: first moment (mean of gradients), shaped like params.
    - `nu`: second-moment statistic, shaped like params: the mean of squared
      gradients for most; the infinity norm for Adamax, the variance of the
      gradient around `mu` for AdaBelief (see each optimizer's docstring).
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]


class NAdamState(eqx.Module):
    """State of `NAdam` and `NAdamW`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu_product`: float32 scalar, the product of the momentum coefficients
      `mu_1 * ... * mu_step` (`b1**step` with the default constant momentum).
    - `mu`: first moment, shaped like params.
    - `nu`: second moment, shaped like params.
    """

    step: Int[Array, ""]
    mu_product: Float[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]


class AMSGradState(eqx.Module):
    """State of `AMSGrad`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: first moment, shaped like params.
    - `nu`: second moment, shaped like params.
    - `nu_max`: the running maximum of the second moment (bias-corrected or not,
      according to `nu_correction`), shaped like params.
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]
    nu_max: PyTree[Float[Array, "..."] | None]


def adam_state(params: Params, mu_dtype: Any, nu_dtype: Any) -> AdamState:
    mu, nu = init_moments(params, mu_dtype, nu_dtype)
    return AdamState(step=zero_step(), mu=mu, nu=nu)


# --------------------------------------------------------------------------------------
# Adam and AdamW.
# --------------------------------------------------------------------------------------


def adam_transform(
    opt: Any,
    grads: Grads,
    state: AdamState,
    params: Params,
    weight_decay: Array | None,
    flags: list[bool] | None,
    *,
    nesterov: bool = False,
    adjust: Callable[..., tuple[Array, Array]] | None = None,
) -> tuple[Updates, AdamState]:
    """One Adam(W) step with `opt`'s `learning_rate`, `b1`, `b2`, `eps`, `eps_root`.

    `adjust(g, mu, v_hat, direction, lr) -> (direction, step_size)` reshapes each
    leaf's step before the decay is added (cautious masking, update clipping); it may
    reduce over the leaf, so with it the rule is not elementwise."""
    lr = opt.learning_rate(state.step)
    b1, b2, eps, eps_root = opt.b1, opt.b2, opt.eps, opt.eps_root
    t = increment(state.step)
    bias1 = bias_correction(b1, t)
    bias2 = bias_correction(b2, t)

    def rule(g, p, mu, nu, *flag):
        mu = ema(mu, g, b1)
        nu = ema(nu, abs_sq(g), b2)
        mu_hat = nesterov_mean(mu, g, b1, t) if nesterov else mu / bias1
        v_hat = nu / bias2
        direction = mu_hat / (jnp.sqrt(v_hat + eps_root) + eps)
        step_size = lr
        if adjust is not None:
            direction, step_size = adjust(g, mu, v_hat, direction, lr)
        if flag:
            direction = with_decay(direction, p, weight_decay, flag[0])
        return -step_size * direction, mu, nu

    updates, (mu, nu) = map_leaves(
        rule,
        grads,
        params,
        (state.mu, state.nu),
        elementwise=adjust is None,
        flags=flags,
    )
    return updates, AdamState(step=t, mu=mu, nu=nu)


class Adam(AbstractTransform):
    """Adam (Kingma & Ba, 2015).

    For each leaf, with `t = step + 1` and `lr` the learning rate at `step`:

    ```
    mu = b1 * mu + (1 - b1) * g
    nu = b2 * nu + (1 - b2) * g**2
    p  = p - lr * (mu / (1 - b1**t)) / (sqrt(nu / (1 - b2**t) + eps_root) + eps)
    ```

    With `nesterov=True` the first moment is replaced by Dozat's (2016) Nesterov
    estimate `b1 * mu / (1 - b1**(t+1)) + (1 - b1) * g / (1 - b1**t)`, as in
    `optax.adam(..., nesterov=True)` (= `optax.nadam`; see also `NAdam`).

    The same as `optax.adam` and `torch.optim.Adam` (no weight decay).

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: decay of the first moment, in `[0, 1)`.
    - `b2`: decay of the second moment, in `(0, 1)`.
    - `eps`: added to the root of the second moment, `> 0`.
    - `eps_root`: added inside the root, `>= 0` (optax's `eps_root`).
    - `nesterov`: use the Nesterov first moment (a bool).
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
    nesterov: bool = eqx.field(static=True)

    def __init__(
        self,
        learning_rate: Any,
        b1: Any = 0.9,
        b2: Any = 0.999,
        eps: Any = 1e-8,
        *,
        eps_root: Any = 0.0,
        nesterov: bool = False,
        mu_dtype: Any = None,
        nu_dtype: Any = None,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.b1, self.b2, self.eps, self.eps_root = betas_and_eps(b1, b2, eps, eps_root)
        self.nesterov = check_bool("nesterov", nesterov)
        self.mu_dtype = dtype_or_none("mu_dtype", mu_dtype)
        self.nu_dtype = dtype_or_none("nu_dtype", nu_dtype)

    def init(self, params: Params) -> AdamState:
        return adam_state(params, self.mu_dtype, self.nu_dtype)

    def transform(
        self, grads: Grads, state: AdamState, params: Params
    ) -> tuple[Updates, AdamState]:
        return adam_transform(
            self, grads, state, params, None, None, nesterov=self.nesterov
        )


class AdamW(AbstractTransform):
    """AdamW: Adam with decoupled weight decay (Loshchilov & Hutter, 2019).

    For each leaf, with `t = step + 1` and `lr`, `wd` the learning rate and weight
    decay at `step`:

    ```
    mu = b1 * mu + (1 - b1) * g
    nu = b2 * nu + (1 - b2) * g**2
    p  = p - lr * ((mu / (1 - b1**t)) / (sqrt(nu / (1 - b2**t) + eps_root) + eps)
                   + wd * p)
    ```

    The decay uses the parameter from before the update and applies to every leaf
    with a gradient, unless `mask` leaves it out. The same as `optax.adamw` and
    `torch.optim.AdamW` (whose `p *= 1 - lr * wd` before the step is the same
    formula). `nesterov=True` gives `NAdamW` with optax's constant momentum
    (`optax.nadamw`).

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: decay of the first moment, in `[0, 1)`.
    - `b2`: decay of the second moment, in `(0, 1)`.
    - `eps`: added to the root of the second moment, `> 0`.
    - `weight_decay`: decoupled decay coefficient, `>= 0`, or a schedule module
      (evaluated at `step`, like the learning rate; the decay is multiplied by the
      learning rate too, as in optax and torch).
    - `eps_root`: added inside the root, `>= 0`.
    - `nesterov`: use the Nesterov first moment (see `Adam`).
    - `mask`: which leaves get weight decay: `None` (all), a tree of bools with the
      structure of params (or a prefix of it; `None` entries count as `False`), or a
      function of params returning one. An Equinox module given as the mask is
      always read as the tree of bools, never called (unlike `optax.masked`).
    - `mu_dtype`, `nu_dtype`: as for `Adam`.
    """

    learning_rate: AbstractSchedule
    b1: Float[Array, ""]
    b2: Float[Array, ""]
    eps: Float[Array, ""]
    eps_root: Float[Array, ""]
    mu_dtype: Any = eqx.field(static=True)
    nu_dtype: Any = eqx.field(static=True)
    weight_decay: Float[Array, ""] | AbstractSchedule
    nesterov: bool = eqx.field(static=True)
    mask: Any = eqx.field(static=True)

    def __init__(
        self,
        learning_rate: Any,
        b1: Any = 0.9,
        b2: Any = 0.999,
        eps: Any = 1e-8,
        weight_decay: Any = 1e-4,
        *,
        eps_root: Any = 0.0,
        nesterov: bool = False,
        mask: Any = None,
        mu_dtype: Any = None,
        nu_dtype: Any = None,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.b1, self.b2, self.eps, self.eps_root = betas_and_eps(b1, b2, eps, eps_root)
        self.mu_dtype = dtype_or_none("mu_dtype", mu_dtype)
        self.nu_dtype = dtype_or_none("nu_dtype", nu_dtype)
        self.weight_decay = float_or_schedule("weight_decay", weight_decay, low=0.0)
        self.nesterov = check_bool("nesterov", nesterov)
        self.mask = freeze_mask(mask)

    def init(self, params: Params) -> AdamState:
        decay_flags(self.mask, params)  # a mask that does not fit raises here
        return adam_state(params, self.mu_dtype, self.nu_dtype)

    def transform(
        self, grads: Grads, state: AdamState, params: Params
    ) -> tuple[Updates, AdamState]:
        return adam_transform(
            self,
            grads,
            state,
            params,
            value_at(self.weight_decay, state.step),
            decay_flags(self.mask, params),
            nesterov=self.nesterov,
        )


# --------------------------------------------------------------------------------------
# NAdam and NAdamW.
# --------------------------------------------------------------------------------------


def _nadam_transform(
    opt: "NAdam | NAdamW",
    grads: Grads,
    state: NAdamState,
    params: Params,
    weight_decay: Array | None,
    flags: list[bool] | None,
) -> tuple[Updates, NAdamState]:
    lr = opt.learning_rate(state.step)
    b1, b2, eps, eps_root, psi = (
        opt.b1,
        opt.b2,
        opt.eps,
        opt.eps_root,
        opt.momentum_decay,
    )
    t = increment(state.step)
    t_next = increment(t)
    bias2 = bias_correction(b2, t)
    tf = t.astype(jnp.float32)
    mu_t = b1 * (1 - 0.5 * 0.96 ** (tf * psi))
    mu_next = b1 * (1 - 0.5 * 0.96 ** ((tf + 1) * psi))
    constant = jnp.isinf(psi)  # optax's convention: mu_t = b1 at every step
    product = jnp.where(constant, b1**t, state.mu_product * mu_t)
    product_next = jnp.where(constant, b1**t_next, product * mu_next)
    coef_g = (1 - mu_t) / (1 - product)
    coef_m = mu_next / (1 - product_next)

    def rule(g, p, mu, nu, *flag):
        mu = ema(mu, g, b1)
        nu = ema(nu, abs_sq(g), b2)
        direction = (coef_g * g + coef_m * mu) / (jnp.sqrt(nu / bias2 + eps_root) + eps)
        if flag:
            direction = with_decay(direction, p, weight_decay, flag[0])
        return -lr * direction, mu, nu

    updates, (mu, nu) = map_leaves(
        rule, grads, params, (state.mu, state.nu), elementwise=True, flags=flags
    )
    new_state = NAdamState(step=t, mu_product=product.astype(jnp.float32), mu=mu, nu=nu)
    return updates, new_state


def _momentum_decay(value: Any) -> Array:
    # inf (the default) means "no momentum warm-up": optax's NAdam.
    return hyperparameter("momentum_decay", value, low=0.0, allow_inf=True)


def _nadam_state(params: Params, mu_dtype: Any, nu_dtype: Any) -> NAdamState:
    mu, nu = init_moments(params, mu_dtype, nu_dtype)
    return NAdamState(
        step=zero_step(), mu_product=jnp.ones((), jnp.float32), mu=mu, nu=nu
    )


_NADAM_FORMULA = """
    For each leaf, with `t = step + 1`, `lr` the learning rate at `step`, and the
    momentum coefficients `mu_i = b1 * (1 - 0.5 * 0.96**(i * momentum_decay))`:

    ```
    mu = b1 * mu + (1 - b1) * g
    nu = b2 * nu + (1 - b2) * g**2
    m_hat = (1 - mu_t) * g / (1 - mu_1 ... mu_t)
            + mu_{t+1} * mu / (1 - mu_1 ... mu_{t+1})
    p  = p - lr * m_hat / (sqrt(nu / (1 - b2**t) + eps_root) + eps)
    ```

    Two conventions are in use, and `momentum_decay` picks between them:

    - `momentum_decay=inf` (the default) makes every `mu_i = b1`, so that
      `m_hat = b1 * mu / (1 - b1**(t+1)) + (1 - b1) * g / (1 - b1**t)`: this is
      `optax.nadam` / `optax.adam(..., nesterov=True)`.
    - a finite `momentum_decay` (torch's default is `0.004`) is Dozat's momentum
      warm-up schedule as `torch.optim.NAdam` implements it.
"""


class NAdam(AbstractTransform):
    __doc__ = (
        """NAdam: Adam with Nesterov momentum (Dozat, 2016).
"""
        + _NADAM_FORMULA
        + """
    Same as `optax.nadam` (default) and `torch.optim.NAdam(momentum_decay=...)`
    without weight decay (torch's `eps` is added outside the root, as here).

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`, `b2`, `eps`, `eps_root`: as for `Adam`.
    - `momentum_decay`: `psi >= 0` in the schedule above; `inf` (default) for a
      constant `b1` (optax), `0.004` for torch's default.
    - `mu_dtype`, `nu_dtype`: as for `Adam`.
    """
    )

    learning_rate: AbstractSchedule
    b1: Float[Array, ""]
    b2: Float[Array, ""]
    eps: Float[Array, ""]
    eps_root: Float[Array, ""]
    momentum_decay: Float[Array, ""]
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
        momentum_decay: Any = math.inf,
        mu_dtype: Any = None,
        nu_dtype: Any = None,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.b1, self.b2, self.eps, self.eps_root = betas_and_eps(b1, b2, eps, eps_root)
        self.momentum_decay = _momentum_decay(momentum_decay)
        self.mu_dtype = dtype_or_none("mu_dtype", mu_dtype)
        self.nu_dtype = dtype_or_none("nu_dtype", nu_dtype)

    def init(self, params: Params) -> NAdamState:
        return _nadam_state(params, self.mu_dtype, self.nu_dtype)

    def transform(
        self, grads: Grads, state: NAdamState, params: Params
    ) -> tuple[Updates, NAdamState]:
        return _nadam_transform(self, grads, state, params, None, None)


class NAdamW(AbstractTransform):
    __doc__ = (
        """NAdamW: NAdam with decoupled weight decay (`+ wd * p` inside the bracket,
    as `AdamW`).
"""
        + _NADAM_FORMULA
        + """
    Same as `optax.nadamw` (default) and
    `torch.optim.NAdam(momentum_decay=..., decoupled_weight_decay=True)`.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`, `b2`, `eps`: as for `Adam`.
    - `weight_decay`, `mask`: as for `AdamW`.
    - `eps_root`, `momentum_decay`, `mu_dtype`, `nu_dtype`: as for `NAdam`.
    """
    )

    learning_rate: AbstractSchedule
    b1: Float[Array, ""]
    b2: Float[Array, ""]
    eps: Float[Array, ""]
    eps_root: Float[Array, ""]
    momentum_decay: Float[Array, ""]
    weight_decay: Float[Array, ""] | AbstractSchedule
    mask: Any = eqx.field(static=True)
    mu_dtype: Any = eqx.field(static=True)
    nu_dtype: Any = eqx.field(static=True)

    def __init__(
        self,
        learning_rate: Any,
        b1: Any = 0.9,
        b2: Any = 0.999,
        eps: Any = 1e-8,
        weight_decay: Any = 1e-4,
        *,
        eps_root: Any = 0.0,
        momentum_decay: Any = math.inf,
        mask: Any = None,
        mu_dtype: Any = None,
        nu_dtype: Any = None,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.b1, self.b2, self.eps, self.eps_root = betas_and_eps(b1, b2, eps, eps_root)
        self.momentum_decay = _momentum_decay(momentum_decay)
        self.weight_decay = float_or_schedule("weight_decay", weight_decay, low=0.0)
        self.mask = freeze_mask(mask)
        self.mu_dtype = dtype_or_none("mu_dtype", mu_dtype)
        self.nu_dtype = dtype_or_none("nu_dtype", nu_dtype)

    def init(self, params: Params) -> NAdamState:
        decay_flags(self.mask, params)
        return _nadam_state(params, self.mu_dtype, self.nu_dtype)

    def transform(
        self, grads: Grads, state: NAdamState, params: Params
    ) -> tuple[Updates, NAdamState]:
        return _nadam_transform(
            self,
            grads,
            state,
            params,
            value_at(self.weight_decay, state.step),
            decay_flags(self.mask, params),
        )


# --------------------------------------------------------------------------------------
# AMSGrad.
# --------------------------------------------------------------------------------------

NuCorrection = Literal["before_max", "after_max", "none"]


class AMSGrad(AbstractTransform):
    """AMSGrad (Reddi et al., 2018): Adam that divides by the running maximum of the
    second moment, so the effective step size never grows.

    For each leaf, with `t = step + 1`, `lr`, `wd` the learning rate and weight decay
    at `step`, `c1 = 1 - b1**t` (`1` if `bias_correction_mu=False`), `c2 = 1 - b2**t`:

    ```
    mu = b1 * mu + (1 - b1) * g
    nu = b2 * nu + (1 - b2) * g**2
    nu_correction="before_max":  nu_max = max(nu_max, nu / c2);  v = nu_max
    nu_correction="after_max":   nu_max = max(nu_max, nu);       v = nu_max / c2
    nu_correction="none":        nu_max = max(nu_max, nu);       v = nu_max
    p  = p - lr * ((mu / c1) / (sqrt(v + eps_root) + eps) + wd * p)
    ```

    The libraries differ in where the bias correction of the second moment goes:
    `"before_max"` (default) is `optax.amsgrad`; `"after_max"` is
    `torch.optim.Adam(amsgrad=True)` / `torch.optim.AdamW(amsgrad=True)` (with
    `weight_decay` as AdamW's); `"none"` with `bias_correction_mu=False` is the
    paper's algorithm (optax's `bias_correction_mu=False, bias_correction_nu=False`).

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`, `b2`, `eps`, `eps_root`: as for `Adam`.
    - `weight_decay`: decoupled decay as in `AdamW`, default `0` (no decay);
      a float `>= 0` or a schedule module.
    - `mask`: which leaves get weight decay, as for `AdamW`.
    - `nu_correction`: `"before_max"`, `"after_max"` or `"none"`, as above.
    - `bias_correction_mu`: divide the first moment by `1 - b1**t` (a bool).
    - `mu_dtype`, `nu_dtype`: as for `Adam` (`nu_max` is stored in `nu_dtype`).
    """

    learning_rate: AbstractSchedule
    b1: Float[Array, ""]
    b2: Float[Array, ""]
    eps: Float[Array, ""]
    eps_root: Float[Array, ""]
    weight_decay: Float[Array, ""] | AbstractSchedule
    mask: Any = eqx.field(static=True)
    nu_correction: str = eqx.field(static=True)
    bias_correction_mu: bool = eqx.field(static=True)
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
        weight_decay: Any = 0.0,
        mask: Any = None,
        nu_correction: NuCorrection = "before_max",
        bias_correction_mu: bool = True,
        mu_dtype: Any = None,
        nu_dtype: Any = None,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.b1, self.b2, self.eps, self.eps_root = betas_and_eps(b1, b2, eps, eps_root)
        self.weight_decay = float_or_schedule("weight_decay", weight_decay, low=0.0)
        self.mask = freeze_mask(mask)
        self.nu_correction = check_choice(
            "nu_correction", nu_correction, ("before_max", "after_max", "none")
        )
        self.bias_correction_mu = check_bool("bias_correction_mu", bias_correction_mu)
        self.mu_dtype = dtype_or_none("mu_dtype", mu_dtype)
        self.nu_dtype = dtype_or_none("nu_dtype", nu_dtype)

    def init(self, params: Params) -> AMSGradState:
        decay_flags(self.mask, params)
        mu, nu = init_moments(params, self.mu_dtype, self.nu_dtype)
        nu_max = float_leaves_like(params, self.nu_dtype)
        return AMSGradState(step=zero_step(), mu=mu, nu=nu, nu_max=nu_max)

    def transform(
        self, grads: Grads, state: AMSGradState, params: Params
    ) -> tuple[Updates, AMSGradState]:
        lr = self.learning_rate(state.step)
        wd = value_at(self.weight_decay, state.step)
        b1, b2, eps, eps_root = self.b1, self.b2, self.eps, self.eps_root
        t = increment(state.step)
        bias1 = bias_correction(b1, t) if self.bias_correction_mu else 1.0
        bias2 = bias_correction(b2, t)
        mode = self.nu_correction

        def rule(g, p, mu, nu, nu_max, flag):
            mu = ema(mu, g, b1)
            nu = ema(nu, abs_sq(g), b2)
            if mode == "before_max":
                nu_max = jnp.maximum(nu_max, nu / bias2)
                v = nu_max
            else:
                nu_max = jnp.maximum(nu_max, nu)
                v = nu_max / bias2 if mode == "after_max" else nu_max
            direction = (mu / bias1) / (jnp.sqrt(v + eps_root) + eps)
            return -lr * with_decay(direction, p, wd, flag), mu, nu, nu_max

        updates, (mu, nu, nu_max) = map_leaves(
            rule,
            grads,
            params,
            (state.mu, state.nu, state.nu_max),
            elementwise=True,
            flags=decay_flags(self.mask, params),
        )
        return updates, AMSGradState(step=t, mu=mu, nu=nu, nu_max=nu_max)


# --------------------------------------------------------------------------------------
# Adamax and AdamaxW.
# --------------------------------------------------------------------------------------


def _adamax_transform(
    opt: "Adamax | AdamaxW",
    grads: Grads,
    state: AdamState,
    params: Params,
    weight_decay: Array | None,
    flags: list[bool] | None,
) -> tuple[Updates, AdamState]:
    lr = opt.learning_rate(state.step)
    b1, b2, eps = opt.b1, opt.b2, opt.eps
    t = increment(state.step)
    bias1 = bias_correction(b1, t)

    def rule(g, p, mu, nu, *flag):
        mu = ema(mu, g, b1)
        nu = jnp.maximum(b2 * nu, jnp.abs(g) + eps)
        direction = (mu / bias1) / nu
        if flag:
            direction = with_decay(direction, p, weight_decay, flag[0])
        return -lr * direction, mu, nu

    updates, (mu, nu) = map_leaves(
        rule, grads, params, (state.mu, state.nu), elementwise=True, flags=flags
    )
    return updates, AdamState(step=t, mu=mu, nu=nu)


_ADAMAX_FORMULA = """
    For each leaf, with `t = step + 1` and `lr` the learning rate at `step`:

    ```
    mu = b1 * mu + (1 - b1) * g
    nu = max(b2 * nu, |g| + eps)          (the infinity norm; no bias correction)
    p  = p - lr * (mu / (1 - b1**t)) / nu{decay}
    ```
"""


class Adamax(AbstractTransform):
    __doc__ = (
        """Adamax: Adam with the infinity norm (Kingma & Ba, 2015, section 7.1).
"""
        + _ADAMAX_FORMULA.format(decay="")
        + """
    Same as `optax.adamax` and `torch.optim.Adamax` (without its coupled
    `weight_decay`). The state's `nu` holds the infinity norm.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: decay of the first moment, in `[0, 1)`.
    - `b2`: decay of the infinity norm, in `(0, 1)`.
    - `eps`: added to `|g|` before the maximum, `> 0`.
    - `mu_dtype`, `nu_dtype`: as for `Adam`.
    """
    )

    learning_rate: AbstractSchedule
    b1: Float[Array, ""]
    b2: Float[Array, ""]
    eps: Float[Array, ""]
    mu_dtype: Any = eqx.field(static=True)
    nu_dtype: Any = eqx.field(static=True)

    def __init__(
        self,
        learning_rate: Any,
        b1: Any = 0.9,
        b2: Any = 0.999,
        eps: Any = 1e-8,
        *,
        mu_dtype: Any = None,
        nu_dtype: Any = None,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.b1, self.b2, self.eps, _ = betas_and_eps(b1, b2, eps)
        self.mu_dtype = dtype_or_none("mu_dtype", mu_dtype)
        self.nu_dtype = dtype_or_none("nu_dtype", nu_dtype)

    def init(self, params: Params) -> AdamState:
        return adam_state(params, self.mu_dtype, self.nu_dtype)

    def transform(
        self, grads: Grads, state: AdamState, params: Params
    ) -> tuple[Updates, AdamState]:
        return _adamax_transform(self, grads, state, params, None, None)


class AdamaxW(AbstractTransform):
    __doc__ = (
        """AdamaxW: Adamax with decoupled weight decay.
"""
        + _ADAMAX_FORMULA.format(decay=" - lr * wd * p")
        + """
    with `wd` the weight decay at `step` and `p` the parameter before the update.
    Same as `optax.adamaxw` (torch's `Adamax` only has coupled L2 decay).

    **Arguments:**

    - `learning_rate`, `b1`, `b2`, `eps`, `mu_dtype`, `nu_dtype`: as for `Adamax`.
    - `weight_decay`, `mask`: as for `AdamW`.
    """
    )

    learning_rate: AbstractSchedule
    b1: Float[Array, ""]
    b2: Float[Array, ""]
    eps: Float[Array, ""]
    weight_decay: Float[Array, ""] | AbstractSchedule
    mask: Any = eqx.field(static=True)
    mu_dtype: Any = eqx.field(static=True)
    nu_dtype: Any = eqx.field(static=True)

    def __init__(
        self,
        learning_rate: Any,
        b1: Any = 0.9,
        b2: Any = 0.999,
        eps: Any = 1e-8,
        weight_decay: Any = 1e-4,
        *,
        mask: Any = None,
        mu_dtype: Any = None,
        nu_dtype: Any = None,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.b1, self.b2, self.eps, _ = betas_and_eps(b1, b2, eps)
        self.weight_decay = float_or_schedule("weight_decay", weight_decay, low=0.0)
        self.mask = freeze_mask(mask)
        self.mu_dtype = dtype_or_none("mu_dtype", mu_dtype)
        self.nu_dtype = dtype_or_none("nu_dtype", nu_dtype)

    def init(self, params: Params) -> AdamState:
        decay_flags(self.mask, params)
        return adam_state(params, self.mu_dtype, self.nu_dtype)

    def transform(
        self, grads: Grads, state: AdamState, params: Params
    ) -> tuple[Updates, AdamState]:
        return _adamax_transform(
            self,
            grads,
            state,
            params,
            value_at(self.weight_decay, state.step),
            decay_flags(self.mask, params),
        )
