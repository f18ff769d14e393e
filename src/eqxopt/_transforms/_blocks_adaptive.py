"""The adaptive building blocks with an optax counterpart (`optax.scale_by_adamax`,
`scale_by_amsgrad`, ...): each is the direction of a fused optimizer without its
learning rate, `Chain(ScaleByYogi(...), ScaleByLearningRate(lr))` being
`Yogi(lr, ...)`. The per-leaf maths is the fused optimizer's own function, imported
from its module, so the two cannot drift apart."""

import equinox as eqx
from jaxtyping import Array, Float, Int, PyTree

from .._core._base import Params
from .._core._fields import (
    DTypeLike,
    ScalarOrSchedule,
    StepValue,
    axis_name_field,
    choice_field,
    dtype_field,
    flag_field,
    hyper,
    step_value,
    weight_decay_field,
)
from .._core._moments import Moment, fields_of, moment_like
from .._core._shards import AxisName
from .._core._tree import zero_step
from .._optimizers._adam._adabelief import belief_direction
from .._optimizers._adam._adam import adamax_direction, amsgrad_direction
from .._optimizers._adam._adam_like import AbstractBiasCorrected, bias_corrections
from .._optimizers._adam._radam import radam_direction, rectification
from .._optimizers._adam._yogi import yogi_direction
from .._optimizers._adaptive._adadelta import adadelta_direction
from .._optimizers._adaptive._adagrad import rss_direction
from .._optimizers._adaptive._adan import adan_direction, check_adan_eps
from .._optimizers._layerwise._novograd import leaf_scalars, novograd_direction
from .._optimizers._sgd._sign import LION_MODES, LionMode, lion_direction
from ._blocks import AbstractBlock, ScaleByAdamState


def _decay(default: float) -> ScalarOrSchedule:
    """A decay in `[0, 1)`."""
    return hyper(default, low=0.0, high=1.0, high_open=True)


def _open_decay(default: float) -> ScalarOrSchedule:
    """A decay in `(0, 1)`."""
    return hyper(default, low=0.0, high=1.0, low_open=True, high_open=True)


def _positive(default: float) -> ScalarOrSchedule:
    return hyper(default, low=0.0, low_open=True)


def _nonnegative(default: float) -> ScalarOrSchedule:
    return hyper(default, low=0.0)


class AbstractTwoMomentBlock(AbstractBlock, AbstractBiasCorrected):
    """A block with Adam's two moments `mu`, `nu` (`ScaleByAdamState`) and their
    bias corrections at the step (`h.bias1`, `h.bias1_next`, `h.bias2`), and the
    moments' storage dtypes `mu_dtype`, `nu_dtype` (keyword-only, after a final's
    positional fields)."""

    mu_dtype: DTypeLike = dtype_field(storage=True)
    nu_dtype: DTypeLike = dtype_field(storage=True)

    state_type = ScaleByAdamState
    moments = (
        Moment("mu", dtype=mu_dtype),
        Moment("nu", dtype=nu_dtype, nonnegative=True),
    )
    elementwise = True

    def step_values(self, step: Int[Array, ""]):
        # Once per step rather than once per leaf.
        return bias_corrections(super().step_values(step), step)


class ScaleByAdamax(AbstractTwoMomentBlock):
    r"""Adamax's direction (Kingma & Ba, 2015, section 7.1) without the learning
    rate: with `t = step + 1`,

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, u \\
    \nu &\leftarrow \max(b_2 \nu, |u| + \epsilon) \\
    u &\leftarrow \frac{\mu / (1 - b_1^t)}{\nu}
    \end{aligned}
    $$

    The same as `optax.scale_by_adamax`; `Chain(ScaleByAdamax(b1, b2, eps),
    ScaleByLearningRate(lr))` is `Adamax(lr, b1, b2, eps)`. The state is a
    `ScaleByAdamState` whose `nu` holds the infinity norm.

    **Arguments:**

    - `b1`: decay of the first moment, in `[0, 1)`.
    - `b2`: decay of the infinity norm, in `(0, 1)`.
    - `eps`: added to `|u|` before the maximum, `> 0`.
    - `mu_dtype`, `nu_dtype`: dtypes to store the moments in; `None` keeps each
      parameter's dtype (optax has no such options).
    """

    b1: ScalarOrSchedule = _decay(0.9)
    b2: ScalarOrSchedule = _open_decay(0.999)
    eps: ScalarOrSchedule = _positive(1e-8)

    def leaf(self, h, t, g, p, mu, nu):
        return adamax_direction(h, g, mu, nu)


class ScaleByAmsgradState(eqx.Module):
    """State of `ScaleByAmsgrad`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: first moment, shaped like params (`None` at non-float leaves).
    - `nu`: second moment, shaped like params.
    - `nu_max`: the running maximum of the (bias-corrected, with
      `bias_correction_nu`) second moment, shaped like params.
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]
    nu_max: PyTree[Float[Array, "..."] | None]


class ScaleByAmsgrad(AbstractBlock, AbstractBiasCorrected):
    r"""AMSGrad's direction (Reddi et al., 2018) without the learning rate: with
    `t = step + 1`, $c_1 = 1 - b_1^t$ and $c_2 = 1 - b_2^t$ (each `1` where its
    bias correction is off),

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, u \\
    \nu &\leftarrow b_2 \nu + (1 - b_2)\, u^2 \\
    \nu_\mathrm{max} &\leftarrow \max(\nu_\mathrm{max}, \nu / c_2) \\
    u &\leftarrow \frac{\mu / c_1}{\sqrt{\nu_\mathrm{max} + \epsilon_\mathrm{root}}
        + \epsilon}
    \end{aligned}
    $$

    The same as `optax.scale_by_amsgrad`; `Chain(ScaleByAmsgrad(b1, b2, eps),
    ScaleByLearningRate(lr))` is `AMSGrad(lr, b1, b2, eps)` (whose `nu_correction`
    `"before_max"` is `bias_correction_nu=True` here, `"none"` `False`).

    **Arguments:**

    - `b1`: decay of the first moment, in `[0, 1)`.
    - `b2`: decay of the second moment, in `(0, 1)`.
    - `eps`: added to the root, `> 0`.
    - `eps_root`: added inside the root, `>= 0`.
    - `mu_dtype`: dtype to store the first moment in; `None` keeps each
      parameter's dtype.
    - `bias_correction_mu`: divide the first moment by `1 - b1**t` (a bool).
    - `bias_correction_nu`: divide the second moment by `1 - b2**t` before the
      maximum (a bool).
    - `nu_dtype`: dtype to store `nu` and `nu_max` in (optax has no such option).
    """

    b1: ScalarOrSchedule = _decay(0.9)
    b2: ScalarOrSchedule = _open_decay(0.999)
    eps: ScalarOrSchedule = _positive(1e-8)
    eps_root: ScalarOrSchedule = _nonnegative(0.0)
    mu_dtype: DTypeLike = dtype_field(storage=True, kw_only=False)
    bias_correction_mu: bool = flag_field(True, kw_only=False)
    bias_correction_nu: bool = flag_field(True, kw_only=False)
    nu_dtype: DTypeLike = dtype_field(storage=True)

    state_type = ScaleByAmsgradState
    moments = (
        Moment("mu", dtype=mu_dtype),
        Moment("nu", dtype=nu_dtype, nonnegative=True),
        Moment("nu_max", dtype=nu_dtype, nonnegative=True),
    )
    elementwise = True

    def step_values(self, step: Int[Array, ""]):
        return bias_corrections(super().step_values(step), step)

    def leaf(self, h, t, g, p, mu, nu, nu_max):
        correction = "before_max" if self.bias_correction_nu else "none"
        return amsgrad_direction(
            h, g, mu, nu, nu_max, correction, self.bias_correction_mu
        )


class ScaleByAdadeltaState(eqx.Module):
    """State of `ScaleByAdadelta`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `avg_sq_grad`: running average of squared updates in, `E[u**2]`, shaped like
      params (`None` at non-float leaves; optax's `e_g`).
    - `avg_sq_delta`: running average of squared updates out, `E[dx**2]`
      (optax's `e_x`).
    """

    step: Int[Array, ""]
    avg_sq_grad: PyTree[Float[Array, "..."] | None]
    avg_sq_delta: PyTree[Float[Array, "..."] | None]


class ScaleByAdadelta(AbstractBlock):
    r"""Adadelta's scaling (Zeiler, 2012) without the learning rate:

    $$
    \begin{aligned}
    E[u^2] &\leftarrow \rho\, E[u^2] + (1 - \rho)\, u^2 \\
    \Delta &= \frac{\sqrt{E[\Delta^2] + \epsilon}}{\sqrt{E[u^2] + \epsilon}}\, u \\
    E[\Delta^2] &\leftarrow \rho\, E[\Delta^2] + (1 - \rho)\, \Delta^2 \\
    u &\leftarrow \Delta
    \end{aligned}
    $$

    The same as `optax.scale_by_adadelta`; `Chain(ScaleByAdadelta(rho, eps),
    ScaleByLearningRate(lr))` is `Adadelta(lr, rho, eps)`.

    **Arguments:**

    - `rho`: decay of both running averages, in `[0, 1)`.
    - `eps`: added inside both roots, `> 0`.
    """

    rho: ScalarOrSchedule = _decay(0.9)
    eps: ScalarOrSchedule = _positive(1e-6)

    state_type = ScaleByAdadeltaState
    moments = (
        Moment("avg_sq_grad", nonnegative=True),
        Moment("avg_sq_delta", nonnegative=True),
    )
    elementwise = True

    def leaf(self, h, t, g, p, avg_sq_grad, avg_sq_delta):
        return adadelta_direction(h, g, avg_sq_grad, avg_sq_delta)


class ScaleByAdanState(eqx.Module):
    """State of `ScaleByAdan`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: moving average of updates (optax's `m`), shaped like params.
    - `delta`: moving average of update differences `u - u_prev` (optax's `v`).
    - `nu`: moving average of the squared Nesterov term (optax's `n`).
    - `prev_grad`: the update of the previous step (optax's `g`).

    Every tree is shaped like params, with `None` at non-float leaves.
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    delta: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]
    prev_grad: PyTree[Float[Array, "..."] | None]


class ScaleByAdan(AbstractBlock):
    r"""Adan's direction (Xie et al., 2022) without the learning rate: with
    `t = step + 1`, $d = u - u_\mathrm{prev}$ ($0$ at the first step) and
    $c_i = 1 - b_i^t$,

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, u \\
    \delta &\leftarrow b_2 \delta + (1 - b_2)\, d \\
    \nu &\leftarrow b_3 \nu + (1 - b_3) \left(u + (1 - b_2)\, d\right)^2 \\
    u &\leftarrow \frac{\mu / c_1 + (1 - b_2)\, \delta / c_2}
        {\sqrt{\nu / c_3 + \epsilon_\mathrm{root}} + \epsilon}
    \end{aligned}
    $$

    The same as `optax.scale_by_adan`; `Chain(ScaleByAdan(b1, b2, b3, eps,
    eps_root), AddDecayedWeights(wd), ScaleByLearningRate(lr))` is
    `Adan(lr, b1, b2, b3, eps, eps_root, wd)` (whose default `eps_root` is `1e-8`,
    this block's optax's `0`).

    **Arguments:**

    - `b1`: decay of the update average, in `[0, 1)`.
    - `b2`: decay of the difference average, in `[0, 1)`.
    - `b3`: decay of the squared-term average, in `[0, 1)`.
    - `eps`: added to the root, `>= 0`.
    - `eps_root`: added inside the root, `>= 0`; `eps` and `eps_root` may not both
      be 0.
    """

    b1: ScalarOrSchedule = _decay(0.98)
    b2: ScalarOrSchedule = _decay(0.92)
    b3: ScalarOrSchedule = _decay(0.99)
    eps: ScalarOrSchedule = _nonnegative(1e-8)
    eps_root: ScalarOrSchedule = _nonnegative(0.0)

    state_type = ScaleByAdanState
    moments = (
        Moment("mu"),
        Moment("delta"),
        Moment("nu", nonnegative=True),
        Moment("prev_grad"),
    )
    elementwise = True

    def __check_init__(self):
        check_adan_eps(self.eps, self.eps_root)

    def leaf(self, h, t, g, p, mu, delta, nu, prev_grad):
        return adan_direction(h, t, g, mu, delta, nu, prev_grad)


class ScaleByBelief(AbstractTwoMomentBlock):
    r"""AdaBelief's direction (Zhuang et al., 2020) without the learning rate: with
    `t = step + 1`,

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, u \\
    \nu &\leftarrow b_2 \nu + (1 - b_2) (u - \mu)^2 + \epsilon_\mathrm{root} \\
    u &\leftarrow \frac{\mu / (1 - b_1^t)}{\sqrt{\nu / (1 - b_2^t)} + \epsilon}
    \end{aligned}
    $$

    With `nesterov=True` the first moment is Dozat's Nesterov estimate (see
    `ScaleByAdam`). The same as `optax.scale_by_belief`;
    `Chain(ScaleByBelief(b1, b2, eps, eps_root), ScaleByLearningRate(lr))` is
    `AdaBelief(lr, b1, b2, eps, eps_root=eps_root)`. The state is a
    `ScaleByAdamState` whose `nu` holds the variance around `mu`.

    **Arguments:**

    - `b1`: decay of the first moment, in `[0, 1)`.
    - `b2`: decay of the second moment, in `(0, 1)`.
    - `eps`: added to the root, `> 0`.
    - `eps_root`: added to the second moment at each step, `>= 0`.
    - `nesterov`: use the Nesterov first moment (a bool).
    - `mu_dtype`, `nu_dtype`: dtypes to store the moments in; `None` keeps each
      parameter's dtype (optax has no such options).
    """

    b1: ScalarOrSchedule = _decay(0.9)
    b2: ScalarOrSchedule = _open_decay(0.999)
    eps: ScalarOrSchedule = _positive(1e-16)
    eps_root: ScalarOrSchedule = _nonnegative(1e-16)
    nesterov: bool = flag_field(False)

    def leaf(self, h, t, g, p, mu, nu):
        return belief_direction(h, g, mu, nu, self.nesterov)


class ScaleByLionState(eqx.Module):
    """State of `ScaleByLion`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: the momentum, shaped like params (`None` at non-float leaves).
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]


class ScaleByLion(AbstractBlock):
    r"""Lion's direction (Chen et al., 2023) without the learning rate:

    $$
    \begin{aligned}
    c &= b_1 \mu + (1 - b_1)\, u \\
    u &\leftarrow \begin{cases} \mathrm{sign}(c) & \text{\texttt{"hard"}} \\
        \tanh(\mathrm{smooth\_beta} \cdot c) & \text{\texttt{"smooth"}} \\
        c \text{ where } |c| < 1, \text{ else } \mathrm{sign}(c)
            & \text{\texttt{"refined"}} \end{cases} \\
    \mu &\leftarrow b_2 \mu + (1 - b_2)\, u_\mathrm{in}
    \end{aligned}
    $$

    The same as `optax.scale_by_lion`; `Chain(ScaleByLion(b1, b2),
    AddDecayedWeights(wd), ScaleByLearningRate(lr))` is
    `Lion(lr, b1, b2, weight_decay=wd)` (the `"hard"` mode).

    **Arguments:**

    - `b1`: interpolation of the momentum and the update, in `[0, 1)`.
    - `b2`: decay of the momentum, in `[0, 1)`.
    - `mu_dtype`: dtype to store the momentum in; `None` keeps each parameter's.
    - `mode`: `"hard"`, `"smooth"` or `"refined"`, as above.
    - `smooth_beta`: the slope of `"smooth"`'s `tanh`, `> 0`.
    """

    b1: ScalarOrSchedule = _decay(0.9)
    b2: ScalarOrSchedule = _decay(0.99)
    mu_dtype: DTypeLike = dtype_field(storage=True, kw_only=False)
    mode: LionMode = choice_field("hard", LION_MODES)
    smooth_beta: ScalarOrSchedule = hyper(1.0, low=0.0, low_open=True, kw_only=True)

    state_type = ScaleByLionState
    moments = (Moment("mu", dtype=mu_dtype),)
    elementwise = True

    def leaf(self, h, t, g, p, mu):
        return lion_direction(h, g, mu, self.mode)


class ScaleByNovogradState(eqx.Module):
    """State of `ScaleByNovograd`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: the momentum of normalised updates, shaped like params (`None` at
      non-float leaves).
    - `nu`: one scalar per float leaf, the moving average of the squared norm of
      that leaf's update (`None` at non-float leaves).
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, ""] | None]


class ScaleByNovograd(AbstractBlock, AbstractBiasCorrected):
    r"""NovoGrad's direction (Ginsburg et al., 2019) without the learning rate,
    with one second moment per leaf: with $\|u\|$ the leaf's Euclidean norm,

    $$
    \begin{aligned}
    \nu &\leftarrow \begin{cases} \|u\|^2 & \text{first step} \\
        b_2 \nu + (1 - b_2) \|u\|^2 & \text{later steps} \end{cases} \\
    r &= \frac{u}{\sqrt{\nu + \epsilon_\mathrm{root}} + \epsilon}
        + \mathrm{weight\_decay} \cdot p \\
    \mu &\leftarrow \begin{cases} r & \text{first step} \\
        b_1 \mu + r & \text{later steps} \end{cases} \\
    u &\leftarrow \mu
    \end{aligned}
    $$

    The same as `optax.scale_by_novograd`; `Chain(ScaleByNovograd(b1, b2, eps,
    eps_root, wd), ScaleByLearningRate(lr))` is `NovoGrad(lr, b1, b2, eps,
    weight_decay=wd, eps_root=eps_root)` (whose default `eps` is `1e-6`, this
    block's optax's `1e-8`).

    **Arguments:**

    - `b1`: decay of the momentum, in `[0, 1)`.
    - `b2`: decay of the per-leaf second moment, in `[0, 1)`.
    - `eps`: added to the root, `> 0`.
    - `eps_root`: added inside the root, `>= 0`.
    - `weight_decay`: coefficient of `p` added to the normalised update, `>= 0`.
    - `mu_dtype`: dtype to store the momentum in; `None` keeps each parameter's.
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: the
      norms are those of whole leaves, summed over the named axes a leaf is split
      over. `None` (default): this device's block of each leaf.
    """

    b1: ScalarOrSchedule = _decay(0.9)
    b2: ScalarOrSchedule = _decay(0.25)
    eps: ScalarOrSchedule = _positive(1e-8)
    eps_root: ScalarOrSchedule = _nonnegative(0.0)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0, kw_only=False)
    mu_dtype: DTypeLike = dtype_field(storage=True, kw_only=False)
    axis_name: AxisName = axis_name_field()

    state_type = ScaleByNovogradState
    moments = (Moment("mu", dtype=mu_dtype), Moment("nu", nonnegative=True))
    elementwise = False  # the norm reduces over the leaf

    def init(self, params: Params) -> ScaleByNovogradState:
        # `nu` is one scalar per leaf, not shaped like it.
        return ScaleByNovogradState(
            step=zero_step(),
            mu=moment_like(self, params, "mu"),
            nu=leaf_scalars(params),
        )

    def leaf(self, h, t, g, p, mu, nu):
        mu, nu = novograd_direction(
            h, t, g, p, mu, nu, self.axis_name, "ScaleByNovograd"
        )
        return mu, mu, nu


class ScaleByRadam(AbstractTwoMomentBlock):
    r"""Rectified Adam's direction (Liu et al., 2020) without the learning rate:
    with `t = step + 1`, $\rho_\infty = 2 / (1 - b_2) - 1$ and
    $\rho_t = \rho_\infty - 2 t\, b_2^t / (1 - b_2^t)$,

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, u \\
    \nu &\leftarrow b_2 \nu + (1 - b_2)\, u^2 \\
    \hat m &= \mu / (1 - b_1^t) \\
    r &= \sqrt{\frac{(\rho_t - 4)(\rho_t - 2)\, \rho_\infty}
        {(\rho_\infty - 4)(\rho_\infty - 2)\, \rho_t}} \\
    u &\leftarrow \begin{cases}
        \dfrac{r\, \hat m}{\sqrt{\nu / (1 - b_2^t) + \epsilon_\mathrm{root}} + \epsilon}
            & \rho_t \ge \mathrm{threshold} \\
        \hat m & \text{otherwise}
    \end{cases}
    \end{aligned}
    $$

    With `nesterov=True` $\hat m$ is Dozat's Nesterov estimate (see `ScaleByAdam`).
    `optax.scale_by_radam`, with `rho_t` computed without cancellation as `RAdam`
    does (so in float32 `r` is more accurate than optax's, which is off by about
    1e-4 relative in the first steps with `b2 = 0.999`; in float64 they agree);
    `Chain(ScaleByRadam(b1, b2, eps), ScaleByLearningRate(lr))` is
    `RAdam(lr, b1, b2, eps)`.

    **Arguments:**

    - `b1`: decay of the first moment, in `[0, 1)`.
    - `b2`: decay of the second moment, in `(0, 1)`.
    - `eps`: added to the root, `> 0`.
    - `eps_root`: added inside the root, `>= 0`.
    - `threshold`: the `rho_t` from which the rectified step is used, `>= 0`.
    - `nesterov`: use the Nesterov first moment (a bool).
    - `mu_dtype`, `nu_dtype`: dtypes to store the moments in; `None` keeps each
      parameter's dtype (optax has no such options).
    """

    # Computed once per step (`step_values`).
    rectify: StepValue = step_value()
    r: StepValue = step_value()

    b1: ScalarOrSchedule = _decay(0.9)
    b2: ScalarOrSchedule = _open_decay(0.999)
    eps: ScalarOrSchedule = _positive(1e-8)
    eps_root: ScalarOrSchedule = _nonnegative(0.0)
    threshold: ScalarOrSchedule = _nonnegative(5.0)
    nesterov: bool = flag_field(False)

    def step_values(self, step: Int[Array, ""]):
        return rectification(super().step_values(step), step)

    def leaf(self, h, t, g, p, mu, nu):
        return radam_direction(h, g, mu, nu, self.nesterov)


class ScaleByRssState(eqx.Module):
    """State of `ScaleByRss`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `sum_of_squares`: the sum of squared updates, from `initial_accumulator_value`,
      shaped like params (`None` at non-float leaves).
    """

    step: Int[Array, ""]
    sum_of_squares: PyTree[Float[Array, "..."] | None]


class ScaleByRss(AbstractBlock):
    r"""Adagrad's scaling (Duchi et al., 2011) without the learning rate: divides by
    the root of the sum of squares (`rss`) of all updates so far,

    $$
    \begin{aligned}
    s &\leftarrow s + u^2 \\
    u &\leftarrow \begin{cases} u / \sqrt{s + \epsilon} & s > 0 \\
        0 & s = 0 \end{cases}
    \end{aligned}
    $$

    The same as `optax.scale_by_rss`; `Chain(ScaleByRss(v, eps),
    ScaleByLearningRate(lr))` is `Adagrad(lr, v, eps)`.

    **Arguments:**

    - `initial_accumulator_value`: the value the sum starts at, `>= 0` (used at
      `init`, so a number or array, not a schedule).
    - `eps`: added inside the root, `>= 0`.
    """

    # The state's starting value: used at `init`, so not a schedule.
    initial_accumulator_value: ScalarOrSchedule = hyper(0.1, low=0.0, schedule=False)
    eps: ScalarOrSchedule = _nonnegative(1e-7)

    state_type = ScaleByRssState
    moments = (
        Moment("sum_of_squares", nonnegative=True, fill=initial_accumulator_value),
    )
    elementwise = True

    def leaf(self, h, t, g, p, sum_of_squares):
        return rss_direction(h, g, sum_of_squares)


class ScaleByYogi(AbstractTwoMomentBlock):
    r"""Yogi's direction (Zaheer et al., 2018) without the learning rate: with
    `t = step + 1`,

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, u \\
    \nu &\leftarrow \nu - (1 - b_2)\, \mathrm{sign}(\nu - u^2)\, u^2 \\
    u &\leftarrow
        \frac{\mu / (1 - b_1^t)}{\sqrt{\nu / (1 - b_2^t) + \epsilon_\mathrm{root}} +
            \epsilon}
    \end{aligned}
    $$

    The same as `optax.scale_by_yogi`; `Chain(ScaleByYogi(b1, b2, eps),
    ScaleByLearningRate(lr))` is `Yogi(lr, b1, b2, eps)`.

    **Arguments:**

    - `b1`: decay of the first moment, in `[0, 1)`.
    - `b2`: decay of the second moment, in `(0, 1)`.
    - `eps`: added to the root, `> 0`.
    - `eps_root`: added inside the root, `>= 0`.
    - `initial_accumulator_value`: the starting value of both moments, `>= 0`
      (used at `init`, so a number or array, not a schedule).
    - `mu_dtype`, `nu_dtype`: dtypes to store the moments in; `None` keeps each
      parameter's dtype (optax has no such options).
    """

    b1: ScalarOrSchedule = _decay(0.9)
    b2: ScalarOrSchedule = _open_decay(0.999)
    eps: ScalarOrSchedule = _positive(1e-3)
    eps_root: ScalarOrSchedule = _nonnegative(0.0)
    # Not a schedule: it only sets the moments' starting value, at `init`.
    initial_accumulator_value: ScalarOrSchedule = hyper(1e-6, low=0.0, schedule=False)

    moments = (  # both start at initial_accumulator_value
        Moment(
            "mu",
            dtype=fields_of(AbstractTwoMomentBlock).mu_dtype,
            fill=initial_accumulator_value,
        ),
        Moment(
            "nu",
            dtype=fields_of(AbstractTwoMomentBlock).nu_dtype,
            nonnegative=True,
            fill=initial_accumulator_value,
        ),
    )

    def leaf(self, h, t, g, p, mu, nu):
        return yogi_direction(h, g, mu, nu)
