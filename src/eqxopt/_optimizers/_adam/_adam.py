"""The Adam family's close variants: Adam, AdamW, NAdam, NAdamW, AMSGrad, Adamax,
AdamaxW (the maths and bases they share with the rest of the family are in
`_adam_like.py`)."""

import functools
from typing import Any, Literal

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import Grads, Params, Updates
from ..._core._fields import (
    MaskLike,
    ScalarOrSchedule,
    StepValue,
    choice_field,
    flag_field,
    mask_field,
    replace,
    step_value,
    weight_decay_field,
)
from ..._core._leafwise import map_leaves
from ..._core._moments import Moment, fields_of, moment_like, ref
from ..._core._tree import (
    abs_sq,
    increment,
    step_power,
    zero_step,
)
from ._adam_like import (
    AbstractAdamLike,
    AbstractAdamOptions,
    AbstractAdamW,
    adam_direction,
    bias_corrections,
    ema,
    momentum_decay_field,
    nonnegative_field,
)

# --------------------------------------------------------------------------------------
# States.
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# Adam and AdamW.
# --------------------------------------------------------------------------------------


class AbstractAdamStep(AbstractAdamLike):
    """Adam's direction (see `Adam`), with its `nesterov` option: shared by `Adam`
    and `AdamW` (which adds the options of `AbstractAdamW`)."""

    nesterov: bool = flag_field(False)

    elementwise = True

    def direction(self, h, g, mu, nu):
        direction, mu, nu, _ = adam_direction(h, g, mu, nu, self.nesterov)
        return direction, h.learning_rate, mu, nu


class Adam(AbstractAdamStep):
    r"""Adam (Kingma & Ba, 2015).

    For each leaf, with $t = \mathrm{step} + 1$, `lr` the learning rate at `step`,
    $\mu$, $\nu$ the moments (`state.mu`, `state.nu`) and $\epsilon$,
    $\epsilon_\mathrm{root}$ `eps`, `eps_root`:

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, g \\
    \nu &\leftarrow b_2 \nu + (1 - b_2)\, g^2 \\
    p &\leftarrow p - \mathrm{lr} \cdot
        \frac{\mu / (1 - b_1^t)}
            {\sqrt{\nu / (1 - b_2^t) + \epsilon_\mathrm{root}} + \epsilon}
    \end{aligned}
    $$

    With `nesterov=True` the first moment is replaced by Dozat's (2016) Nesterov
    estimate $\frac{b_1 \mu}{1 - b_1^{t+1}} + \frac{(1 - b_1)\, g}{1 - b_1^t}$, as in
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

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxopt

    params = {"w": jnp.ones(3)}
    grads = {"w": jnp.array([0.1, -0.2, 0.3])}
    opt = eqxopt.Adam(learning_rate=1e-2)
    state = opt.init(params)
    params, state = opt.step(grads, state, params)
    # the first step is lr * g / |g| (the bias corrections cancel the decays)
    assert jnp.allclose(params["w"], 1.0 - 1e-2 * jnp.sign(grads["w"]), atol=1e-6)
    assert jnp.allclose(state.mu["w"], 0.1 * grads["w"])  # (1 - b1) * g
    assert int(state.step) == 1
    ```
    """

    eps_root: ScalarOrSchedule = nonnegative_field()


class AdamW(AbstractAdamW, AbstractAdamStep):
    r"""AdamW: Adam with decoupled weight decay (Loshchilov & Hutter, 2019).

    For each leaf, with $t = \mathrm{step} + 1$, `lr`, `wd` the learning rate and
    weight decay at `step`, $\mu$, $\nu$ the moments (`state.mu`, `state.nu`) and
    $\epsilon$, $\epsilon_\mathrm{root}$ `eps`, `eps_root`:

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, g \\
    \nu &\leftarrow b_2 \nu + (1 - b_2)\, g^2 \\
    p &\leftarrow p - \mathrm{lr} \left(
        \frac{\mu / (1 - b_1^t)}
            {\sqrt{\nu / (1 - b_2^t) + \epsilon_\mathrm{root}} + \epsilon}
        + \mathrm{wd} \cdot p \right)
    \end{aligned}
    $$

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

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxopt

    params = {"w": jnp.array([1.0, -2.0])}
    grads = {"w": jnp.array([0.5, 0.5])}
    opt = eqxopt.AdamW(learning_rate=0.1, weight_decay=0.01)
    state = opt.init(params)
    params, state = opt.step(grads, state, params)
    # step 1: lr * (g / |g| + wd * p), the decay on the parameter before the step
    expected = jnp.array([1.0, -2.0]) - 0.1 * (1.0 + 0.01 * jnp.array([1.0, -2.0]))
    assert jnp.allclose(params["w"], expected, atol=1e-6)
    ```
    """

    decoupled_decay = fields_of(AbstractAdamW).weight_decay


# --------------------------------------------------------------------------------------
# NAdam and NAdamW.
# --------------------------------------------------------------------------------------


class AbstractNAdam(AbstractAdamOptions):
    """NAdam's step (see `NAdam`), shared by `NAdam` and `NAdamW`. Its state also
    holds the product of the momentum coefficients, a scalar, so `init` and
    `transform` are its own; the per-leaf rule is `leaf`."""

    # Computed once per step (`step_values`).
    coef_g: StepValue = step_value()
    coef_m: StepValue = step_value()

    eps_root: ScalarOrSchedule = nonnegative_field()
    momentum_decay: ScalarOrSchedule = momentum_decay_field()

    state_type = NAdamState
    moments = (
        Moment("mu", dtype=fields_of(AbstractAdamOptions).mu_dtype),
        Moment("nu", dtype=fields_of(AbstractAdamOptions).nu_dtype, nonnegative=True),
    )
    elementwise = True

    def init(self, params: Params) -> NAdamState:
        self.leaf_flags(params)  # a mask that does not fit raises here
        return NAdamState(
            step=zero_step(),
            mu_product=jnp.ones((), jnp.float32),
            mu=moment_like(self, params, "mu"),
            nu=moment_like(self, params, "nu"),
        )

    def run(
        self, grads: Grads, state: NAdamState, params: Params, *, apply: bool
    ) -> tuple[Updates, NAdamState]:
        h = bias_corrections(self.step_values(state.step), state.step)
        b1, psi = h.b1, h.momentum_decay
        t = increment(state.step)
        tf = t.astype(jnp.float32)
        mu_t = b1 * (1 - 0.5 * 0.96 ** (tf * psi))
        mu_next = b1 * (1 - 0.5 * 0.96 ** ((tf + 1) * psi))
        constant = jnp.isinf(psi)  # optax's convention: mu_t = b1 at every step
        product = jnp.where(constant, step_power(b1, t), state.mu_product * mu_t)
        product_next = jnp.where(
            constant, step_power(b1, increment(t)), product * mu_next
        )
        h = replace(h, coef_g=(1 - mu_t) / (1 - product))
        h = replace(h, coef_m=mu_next / (1 - product_next))
        updates, (mu, nu) = map_leaves(
            functools.partial(self.leaf, h, t),
            grads,
            params,
            (state.mu, state.nu),
            elementwise=True,
            flags=self.leaf_flags(params),
            apply=apply,
        )
        mu_product = product.astype(jnp.float32)
        return updates, NAdamState(step=t, mu_product=mu_product, mu=mu, nu=nu)

    def leaf(self, h, t, g, p, mu, nu, decayed=False):
        del t  # the bias correction is in `h`
        mu = ema(mu, g, h.b1)
        nu = ema(nu, abs_sq(g), h.b2)
        root = jnp.sqrt(nu / h.bias2 + h.eps_root)
        direction = (h.coef_g * g + h.coef_m * mu) / (root + h.eps)
        if decayed:
            direction = direction + h.weight_decay * p
        return -h.learning_rate * direction, mu, nu


_NADAM_FORMULA = r"""
    For each leaf, with `t = step + 1`, `lr` the learning rate at `step`, and the
    momentum coefficients $\mu_i = b_1 (1 - \tfrac{1}{2} \cdot 0.96^{i \psi})$ ($\psi$ =
    `momentum_decay`):

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, g \\
    \nu &\leftarrow b_2 \nu + (1 - b_2)\, g^2 \\
    \hat m &= \frac{(1 - \mu_t)\, g}{1 - \mu_1 \cdots \mu_t}
        + \frac{\mu_{t+1}\, \mu}{1 - \mu_1 \cdots \mu_{t+1}} \\
    p &\leftarrow p - \mathrm{lr} \cdot
        \frac{\hat m}{\sqrt{\nu / (1 - b_2^t) + \epsilon_\mathrm{root}} + \epsilon}
    \end{aligned}
    $$

    Two conventions are in use, and `momentum_decay` picks between them:

    - `momentum_decay=inf` (the default) makes every $\mu_i = b_1$, so that
      $\hat m = \frac{b_1 \mu}{1 - b_1^{t+1}} + \frac{(1 - b_1)\, g}{1 - b_1^t}$:
      this is `optax.nadam` / `optax.adam(..., nesterov=True)`.
    - a finite `momentum_decay` (torch's default is `0.004`) is Dozat's momentum
      warm-up schedule as `torch.optim.NAdam` implements it.
"""


class NAdam(AbstractNAdam):
    __doc__ = (
        """NAdam: Adam with Nesterov momentum (Dozat, 2016).
"""
        + _NADAM_FORMULA
        + r"""
    Same as `optax.nadam` (default) and `torch.optim.NAdam(momentum_decay=...)`
    without weight decay (torch's `eps` is added outside the root, as here).

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`, `b2`, `eps`, `eps_root`: as for `Adam`.
    - `momentum_decay`: $\psi \ge 0$ in the schedule above; `inf` (default) for a
      constant `b1` (optax), `0.004` for torch's default.
    - `mu_dtype`, `nu_dtype`: as for `Adam`.
    """
    )


class NAdamW(AbstractNAdam):
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

    weight_decay: ScalarOrSchedule = weight_decay_field(1e-4)
    mask: MaskLike = mask_field()

    decay_mask = ref(mask)
    decoupled_decay = ref(weight_decay)


# --------------------------------------------------------------------------------------
# AMSGrad.
# --------------------------------------------------------------------------------------

NuCorrection = Literal["before_max", "after_max", "none"]
NU_CORRECTIONS = ("before_max", "after_max", "none")


def amsgrad_direction(
    h: Any,
    g: Array,
    mu: Array,
    nu: Array,
    nu_max: Array,
    nu_correction: NuCorrection,
    bias_correction_mu: bool,
) -> tuple[Array, Array, Array, Array]:
    """AMSGrad's moment updates and direction (see `AMSGrad`; `h` from
    `bias_corrections`), shared with `ScaleByAmsgrad`:
    `(direction, mu, nu, nu_max)`."""
    mu = ema(mu, g, h.b1)
    nu = ema(nu, abs_sq(g), h.b2)
    bias1 = h.bias1 if bias_correction_mu else 1.0
    if nu_correction == "before_max":
        nu_max = jnp.maximum(nu_max, nu / h.bias2)
        v = nu_max
    else:
        nu_max = jnp.maximum(nu_max, nu)
        v = nu_max / h.bias2 if nu_correction == "after_max" else nu_max
    direction = (mu / bias1) / (jnp.sqrt(v + h.eps_root) + h.eps)
    return direction, mu, nu, nu_max


class AMSGrad(AbstractAdamOptions):
    r"""AMSGrad (Reddi et al., 2018): Adam that divides by the running maximum of the
    second moment, so the effective step size never grows.

    For each leaf, with `t = step + 1`, `lr`, `wd` the learning rate and weight decay
    at `step`, $c_1 = 1 - b_1^t$ ($1$ if `bias_correction_mu=False`) and
    $c_2 = 1 - b_2^t$:

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, g \\
    \nu &\leftarrow b_2 \nu + (1 - b_2)\, g^2 \\
    \nu_\mathrm{max} &\leftarrow \max(\nu_\mathrm{max}, \nu / c_2), \quad v
        = \nu_\mathrm{max}
        && \text{(\texttt{nu\_correction="before\_max"})} \\
    \nu_\mathrm{max} &\leftarrow \max(\nu_\mathrm{max}, \nu), \quad v
        = \nu_\mathrm{max} / c_2
        && \text{(\texttt{nu\_correction="after\_max"})} \\
    \nu_\mathrm{max} &\leftarrow \max(\nu_\mathrm{max}, \nu), \quad v = \nu_\mathrm{max}
        && \text{(\texttt{nu\_correction="none"})} \\
    p &\leftarrow p - \mathrm{lr} \left(
        \frac{\mu / c_1}{\sqrt{v + \epsilon_\mathrm{root}} + \epsilon}
        + \mathrm{wd} \cdot p \right)
    \end{aligned}
    $$

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

    eps_root: ScalarOrSchedule = nonnegative_field()
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    mask: MaskLike = mask_field()
    nu_correction: NuCorrection = choice_field("before_max", NU_CORRECTIONS)
    bias_correction_mu: bool = flag_field(True)

    state_type = AMSGradState
    moments = (
        Moment("mu", dtype=fields_of(AbstractAdamOptions).mu_dtype),
        Moment("nu", dtype=fields_of(AbstractAdamOptions).nu_dtype, nonnegative=True),
        Moment(
            "nu_max", dtype=fields_of(AbstractAdamOptions).nu_dtype, nonnegative=True
        ),
    )
    decay_mask = ref(mask)
    decoupled_decay = ref(weight_decay)
    elementwise = True

    def step_values(self, step: Int[Array, ""]):
        return bias_corrections(super().step_values(step), step)

    def leaf(self, h, t, g, p, mu, nu, nu_max, decayed):
        del t  # the bias corrections are in `h`
        direction, mu, nu, nu_max = amsgrad_direction(
            h, g, mu, nu, nu_max, self.nu_correction, self.bias_correction_mu
        )
        if decayed:
            direction = direction + h.weight_decay * p
        return -h.learning_rate * direction, mu, nu, nu_max


# --------------------------------------------------------------------------------------
# Adamax and AdamaxW.
# --------------------------------------------------------------------------------------


def adamax_direction(
    h: Any, g: Array, mu: Array, nu: Array
) -> tuple[Array, Array, Array]:
    """Adamax's moment updates and direction (see `Adamax`; `h` from
    `bias_corrections`), shared with `ScaleByAdamax`: `(direction, mu, nu)`."""
    mu = ema(mu, g, h.b1)
    nu = jnp.maximum(h.b2 * nu, jnp.abs(g) + h.eps)
    return (mu / h.bias1) / nu, mu, nu


class AbstractAdamax(AbstractAdamLike):
    """Adamax's step (see `Adamax`), shared by `Adamax` and `AdamaxW`."""

    elementwise = True

    def direction(self, h, g, mu, nu):
        direction, mu, nu = adamax_direction(h, g, mu, nu)
        return direction, h.learning_rate, mu, nu


# Ends before the end of its last line, which AdamaxW extends with its decay term.
_ADAMAX_FORMULA = r"""
    For each leaf, with `t = step + 1` and `lr` the learning rate at `step`:

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, g \\
    \nu &\leftarrow \max(b_2 \nu, |g| + \epsilon)
        && \text{(the infinity norm; no bias correction)} \\
    p &\leftarrow p - \mathrm{lr} \cdot \frac{\mu / (1 - b_1^t)}{\nu}"""
_ADAMAX_FORMULA_END = r"""
    \end{aligned}
    $$
"""


class Adamax(AbstractAdamax):
    __doc__ = (
        """Adamax: Adam with the infinity norm (Kingma & Ba, 2015, section 7.1).
"""
        + _ADAMAX_FORMULA
        + _ADAMAX_FORMULA_END
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


class AdamaxW(AbstractAdamax):
    __doc__ = (
        """AdamaxW: Adamax with decoupled weight decay.
"""
        + _ADAMAX_FORMULA
        + r" - \mathrm{lr} \cdot \mathrm{wd} \cdot p"
        + _ADAMAX_FORMULA_END
        + """
    with `wd` the weight decay at `step` and `p` the parameter before the update.
    Same as `optax.adamaxw` (torch's `Adamax` only has coupled L2 decay).

    **Arguments:**

    - `learning_rate`, `b1`, `b2`, `eps`, `mu_dtype`, `nu_dtype`: as for `Adamax`.
    - `weight_decay`, `mask`: as for `AdamW`.
    """
    )

    weight_decay: ScalarOrSchedule = weight_decay_field(1e-4, kw_only=False)
    mask: MaskLike = mask_field()

    decay_mask = ref(mask)
    decoupled_decay = ref(weight_decay)
