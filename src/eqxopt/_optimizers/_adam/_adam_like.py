"""What the Adam family shares: the moment maths (moving averages, bias corrections,
the Nesterov estimate, Adam's direction), the usual field declarations, the state
of the two-moment variants, and the bases `AbstractAdamOptions` (the options every
variant has), `AbstractAdamLike` (a per-leaf `direction` hook on two moments, with
decoupled weight decay) and `AbstractAdamW` (AdamW's options, shared by AdamW,
CAdamW and StableAdamW)."""

import abc
import math
from typing import Any, TypeVar

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._fields import (
    DTypeLike,
    MaskLike,
    ScalarOrSchedule,
    StepValue,
    dtype_field,
    hyper,
    learning_rate_field,
    mask_field,
    replace,
    step_value,
    weight_decay_field,
)
from ..._core._leafwise import AbstractLeafwiseOptimizer
from ..._core._moments import Moment, fields_of, ref
from ..._core._tree import abs_sq, increment, step_power

# --------------------------------------------------------------------------------------
# Moment maths (on arrays; `h` is the hyperparameters at the step, `_fields.values_at`).
# --------------------------------------------------------------------------------------


def ema(m: Array, x: Array, b: Array) -> Array:
    """`b * m + (1 - b) * x`: one step of an exponential moving average."""
    return b * m + (1 - b) * x


def bias_correction(b: Array, t: Int[Array, ""]) -> Array:
    """`1 - b**t`."""
    return 1 - step_power(b, t)


class AbstractBiasCorrected(AbstractLeafwiseOptimizer):
    """The bias corrections of Adam's moments, as values computed once per step
    (`bias_corrections`), for the optimizers whose `leaf` reads them."""

    # Computed once per step (`step_values`).
    bias1: StepValue = step_value()
    bias1_next: StepValue = step_value()
    bias2: StepValue = step_value()


_B = TypeVar("_B", bound=AbstractBiasCorrected)


def bias_corrections(h: _B, step: Int[Array, ""]) -> _B:
    """`h` (the optimizer at `step`, `_fields.values_at`) with, for `t = step +
    1`, `h.bias1 = 1 - b1**t`, `h.bias1_next = 1 - b1**(t+1)` and `h.bias2 = 1 -
    b2**t` set: computed once per step (`AbstractLeafwiseOptimizer.step_values`),
    not once per leaf."""
    t = increment(step)
    return replace(
        h,
        bias1=bias_correction(h.b1, t),  # pyright: ignore[reportAttributeAccessIssue]
        bias1_next=bias_correction(h.b1, increment(t)),  # pyright: ignore
        bias2=bias_correction(h.b2, t),  # pyright: ignore[reportAttributeAccessIssue]
    )


def first_moment_hat(mu: Array, g: Array, h: Any, nesterov: bool) -> Array:
    """The bias-corrected first moment `mu / (1 - b1**t)` or, with `nesterov`, the
    Nesterov one of Dozat (2016) as optax writes it:
    `b1 * mu / (1 - b1**(t+1)) + (1 - b1) * g / (1 - b1**t)` (`h` from
    `bias_corrections`)."""
    if nesterov:
        return h.b1 * mu / h.bias1_next + (1 - h.b1) * g / h.bias1
    return mu / h.bias1


def adam_direction(
    h: Any, g: Array, mu: Array, nu: Array, nesterov: bool = False
) -> tuple[Array, Array, Array, Array]:
    """Adam's moment updates and direction `m_hat / (sqrt(v_hat + eps_root) + eps)`
    (`h` from `bias_corrections`): `(direction, mu, nu, v_hat)`."""
    mu = ema(mu, g, h.b1)
    nu = ema(nu, abs_sq(g), h.b2)
    v_hat = nu / h.bias2
    mu_hat = first_moment_hat(mu, g, h, nesterov)
    return mu_hat / (jnp.sqrt(v_hat + h.eps_root) + h.eps), mu, nu, v_hat


# --------------------------------------------------------------------------------------
# Field declarations with the family's bounds (each call makes a new field).
# --------------------------------------------------------------------------------------


def b1_field(default: float = 0.9, *, kw_only: bool = False) -> Any:
    """Decay of the first moment, in `[0, 1)`."""
    return hyper(default, low=0.0, high=1.0, high_open=True, kw_only=kw_only)


def b2_field(default: float = 0.999, *, kw_only: bool = False) -> Any:
    """Decay of the second moment, in `(0, 1)`."""
    return hyper(
        default, low=0.0, high=1.0, low_open=True, high_open=True, kw_only=kw_only
    )


def eps_field(default: float = 1e-8, *, kw_only: bool = False) -> Any:
    """Added to the root of the second moment, `> 0`."""
    return hyper(default, low=0.0, low_open=True, kw_only=kw_only)


def nonnegative_field(default: float = 0.0, *, kw_only: bool = True) -> Any:
    """A hyperparameter `>= 0` (`eps_root`, `weight_decay`, ...)."""
    return hyper(default, low=0.0, kw_only=kw_only)


def momentum_decay_field() -> Any:
    """NAdam's `momentum_decay`, `>= 0`; `inf` (the default) means "no momentum
    warm-up": optax's NAdam."""
    return hyper(math.inf, low=0.0, allow_inf=True, kw_only=True)


# --------------------------------------------------------------------------------------
# The two-moment state and the bases.
# --------------------------------------------------------------------------------------


class AdamState(eqx.Module):
    """State of `Adam`, `AdamW`, `Adamax`, `AdamaxW` and the other Adam variants that
    keep two moments (`RAdam`, `Yogi`, `AdaBelief`, `ACProp`, `ADOPT`, `CAdamW`,
    `StableAdamW`).

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


class AbstractAdamOptions(AbstractBiasCorrected):
    """The options every optimizer of the family has, declared once: the positional
    `learning_rate`, `b1`, `b2`, `eps` (in that order) and the moments' storage
    dtypes `mu_dtype`, `nu_dtype` (keyword-only). A final adds its own fields after
    these; one that redeclares a field (a different default) keeps its place."""

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule = learning_rate_field()
    b1: ScalarOrSchedule = b1_field()
    b2: ScalarOrSchedule = b2_field()
    eps: ScalarOrSchedule = eps_field()
    mu_dtype: DTypeLike = dtype_field(storage=True)
    nu_dtype: DTypeLike = dtype_field(storage=True)


class AbstractAdamLike(AbstractAdamOptions):
    """An optimizer of the Adam family with a first moment `mu` and a second-moment
    statistic `nu` per parameter (`AdamState`).

    Per leaf, the update is `-step_size * (direction + weight_decay * p)`, the decay
    only at the leaves `mask` selects (for optimizers that declare it their
    `decay_mask`; `p` is the parameter before the update). A final class declares
    its options as fields, `elementwise`, and the hook
    `direction(h, g, mu, nu) -> (direction, step_size, mu, nu)` on arrays in the
    compute dtype, with `h` the hyperparameters at this step and their bias
    corrections (`bias_corrections`).
    """

    state_type = AdamState
    moments = (
        Moment("mu", dtype=fields_of(AbstractAdamOptions).mu_dtype),
        # Squares, maxima of |g|, ...
        Moment("nu", dtype=fields_of(AbstractAdamOptions).nu_dtype, nonnegative=True),
    )

    @abc.abstractmethod
    def direction(
        self, h: Any, g: Array, mu: Array, nu: Array
    ) -> tuple[Array, Array, Array, Array]:
        """`(direction, step_size, new_mu, new_nu)` for one leaf."""

    def step_values(self, step: Int[Array, ""]):
        return bias_corrections(super().step_values(step), step)

    def leaf(self, h, t, g, p, mu, nu, decayed=False):
        del t  # the bias corrections are in `h`
        direction, step_size, mu, nu = self.direction(h, g, mu, nu)
        if decayed:
            direction = direction + h.weight_decay * p
        return -step_size * direction, mu, nu


class AbstractAdamW(AbstractAdamLike):
    """AdamW's options (see `AdamW`): the base of AdamW and of the variants that
    change its per-leaf direction or step size (`CAdamW`, `StableAdamW`)."""

    weight_decay: ScalarOrSchedule = weight_decay_field(1e-4)
    eps_root: ScalarOrSchedule = nonnegative_field()
    mask: MaskLike = mask_field()

    decay_mask = ref(mask)
