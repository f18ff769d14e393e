"""Building blocks whose state is shaped otherwise than one moment per element, or
that read the parameters or the loss: optax's `scale_by_rprop`, `scale_by_sm3`,
`scale_by_stddev`, `scale_by_factored_rms`, `scale_by_param_block_norm`,
`scale_by_param_block_rms`, `scale_by_optimistic_gradient`, `scale_by_polyak`,
`scale_by_distance_over_gradients` and `scale_by_lbfgs`.

Where eqxopt has the fused optimizer (Rprop, SM3, Adafactor, OptimisticGradient-
Descent, PolyakSGD, DoG, LBFGS), the block calls the same function of the maths that
optimizer does, so the two cannot drift apart."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int, PyTree

from .._core._base import AbstractTransform, Grads, Params, Supplied, Updates, supplies
from .._core._checks import static_count
from .._core._fields import (
    DTypeLike,
    ScalarOrSchedule,
    StepValue,
    axis_name_field,
    checked_field,
    choice_field,
    count_field,
    dtype_field,
    flag_field,
    hyper,
    replace,
    step_value,
    values_at,
)
from .._core._leafwise import AbstractEngineTransform, map_leaves
from .._core._moments import Moment
from .._core._real import RealOnly
from .._core._shards import AxisName, leaf_layouts, leaf_norm, shard_mean
from .._core._tree import (
    abs_sq,
    compute_dtype,
    float_leaves_like,
    increment,
    is_float_leaf,
    real_compute_dtype,
    zero_step,
)
from .._optimizers._parameter_free._dog import dog_step_size
from .._optimizers._preconditioned._adafactor import (
    factored_axes,
    factored_rms,
    factored_stats,
)
from .._optimizers._preconditioned._lbfgs import LBFGS, LBFGSState
from .._optimizers._preconditioned._sm3 import sm3_accumulators, sm3_direction
from .._optimizers._sgd._optimistic import optimistic_direction
from .._optimizers._sgd._polyak import polyak_rate
from .._optimizers._sgd._rprop import check_step_sizes, rprop_direction
from ._blocks import AbstractBlock, _initial_scale, _t_as
from ._state import StepState


class ScaleByRpropState(eqx.Module):
    """State of `ScaleByRprop`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `step_sizes`: the current step size of every element, shaped like params
      (`None` at non-float leaves); starts at `learning_rate`.
    - `prev_grad`: the previous update, zeroed where its sign flipped.
    """

    step: Int[Array, ""]
    step_sizes: PyTree[Float[Array, "..."] | None]
    prev_grad: PyTree[Float[Array, "..."] | None]


class ScaleByRprop(AbstractBlock):
    r"""Rprop's direction (Riedmiller & Braun, 1993; iRprop-), the maths of
    `Rprop`: for each element, with $q = u \cdot u_\mathrm{prev}$,

    $$
    \begin{aligned}
    f &= \begin{cases} \eta_+ & q > 0 \\ \eta_- & q < 0 \\ 1 & q = 0 \end{cases} \\
    \mathrm{size} &\leftarrow \operatorname{clip}(\mathrm{size} \cdot f,
        \mathrm{min\_step\_size}, \mathrm{max\_step\_size}) \\
    u &\leftarrow 0 \text{ where } q < 0 \\
    u_\mathrm{prev} &\leftarrow u \\
    u &\leftarrow \mathrm{size} \cdot \operatorname{sign}(u)
    \end{aligned}
    $$

    `Chain(ScaleByRprop(lr), ScaleByLearningRate(1.0))` is `Rprop(lr)`.

    **Differs from optax 0.2.8** as `Rprop` does: `optax.scale_by_rprop` returns
    each step's update one call late (its first update is zero, and the update at
    call `k` is the one computed at call `k - 1`, zeroed where the sign flips at
    `k`); here each step's update is returned when it is computed, as torch and
    the paper do. The step sizes are optax's.

    **Arguments:**

    - `learning_rate`: the initial step size of every element, `> 0` (the state's
      starting value, so not a schedule).
    - `eta_minus`: step-size factor after a sign flip, in `(0, 1)`.
    - `eta_plus`: step-size factor while the sign holds, `> 1`.
    - `min_step_size`, `max_step_size`: bounds of the step size,
      `0 <= min_step_size <= max_step_size`, `max_step_size > 0`.
    """

    # The state's starting step size, used at `init`: not a schedule.
    learning_rate: ScalarOrSchedule = hyper(low=0.0, low_open=True, schedule=False)
    eta_minus: ScalarOrSchedule = hyper(
        0.5, low=0.0, high=1.0, low_open=True, high_open=True
    )
    eta_plus: ScalarOrSchedule = hyper(1.2, low=1.0, low_open=True)
    min_step_size: ScalarOrSchedule = hyper(1e-6, low=0.0)
    max_step_size: ScalarOrSchedule = hyper(50.0, low=0.0, low_open=True)

    real_only = RealOnly("the sign of u * u_prev decides the step")

    state_type = ScaleByRpropState
    moments = (
        Moment("step_sizes", nonnegative=True, fill=learning_rate),
        Moment("prev_grad"),
    )
    elementwise = True

    def __check_init__(self):
        check_step_sizes(self)

    def leaf(self, h, t, g, p, size, prev):
        return rprop_direction(h, g, size, prev)


class ScaleBySm3State(eqx.Module):
    """State of `ScaleBySm3`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `accumulators`: one vector per float leaf holding its per-axis
      accumulators end to end, as `SM3State.accumulators` (optax's `mu`).
    - `momentum`: the moving average of the preconditioned updates, shaped like
      params (optax's `nu`).
    """

    step: Int[Array, ""]
    accumulators: PyTree[Float[Array, " n"] | None]
    momentum: PyTree[Float[Array, "..."] | None]


class ScaleBySm3(AbstractBlock):
    r"""SM3-II's direction (Anil et al., 2019), the maths of `SM3`: for a leaf of
    rank `>= 2`, each axis `i` keeps one accumulator per index along it, $a_i$;

    $$
    \begin{aligned}
    \mathrm{acc} &= b_2 \min_i a_i + c\, u^2
        && \text{($c = 1 - b_2$, or $1$ for $b_2 = 1$)} \\
    a_i &\leftarrow \text{max of acc over all axes but } i \\
    m &\leftarrow b_1 m + (1 - b_1)\, u / \sqrt{\mathrm{acc} + \epsilon}
        && \text{($0$ where acc $= 0$)} \\
    u &\leftarrow m
    \end{aligned}
    $$

    Vectors and scalars keep a full accumulator. The same as
    `optax.scale_by_sm3` (which fails on scalar leaves);
    `Chain(ScaleBySm3(momentum), ScaleByLearningRate(lr))` is `SM3(lr, momentum)`.
    Real parameters only.

    **Arguments:**

    - `b1`: decay of the momentum, in `[0, 1)`.
    - `b2`: decay of the accumulators, in `[0, 1]`; `1` (default) sums, as SM3.
    - `eps`: added to the accumulator inside the root, `>= 0`.
    """

    b1: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True)
    b2: ScalarOrSchedule = hyper(1.0, low=0.0, high=1.0)
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0)

    real_only = RealOnly("its accumulators take the max of squared updates over axes")

    state_type = ScaleBySm3State
    moments = (Moment("accumulators", nonnegative=True), Moment("momentum"))
    elementwise = False

    def init(self, params: Params) -> ScaleBySm3State:
        return ScaleBySm3State(
            step=zero_step(),
            accumulators=sm3_accumulators(params),
            momentum=float_leaves_like(params),
        )

    def leaf(self, h, t, g, p, a, m):
        m, a = sm3_direction(g, a, m, h.b1, h.b2, h.eps)
        return m, a, m


class ScaleByStddevState(eqx.Module):
    """State of `ScaleByStddev`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: moving average of the updates, shaped like params (`None` at
      non-float leaves).
    - `nu`: moving average of squared updates, shaped like params.
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]


class ScaleByStddev(AbstractBlock):
    r"""Divides by the root of the centered moving average of squared updates
    (centered RMSProp's scaling, Graves 2013), with `t = step + 1`:

    $$
    \begin{aligned}
    \mu &\leftarrow \mathrm{decay} \cdot \mu + (1 - \mathrm{decay})\, u \\
    \nu &\leftarrow \mathrm{decay} \cdot \nu + (1 - \mathrm{decay})\, u^2 \\
    \hat\mu, \hat\nu &= \begin{cases} \mu / (1 - \mathrm{decay}^t),\ \nu / (1 -
        \mathrm{decay}^t) & \text{\texttt{bias\_correction}} \\
        \mu,\ \nu & \text{otherwise} \end{cases} \\
    u &\leftarrow \begin{cases} u / \sqrt{\hat\nu - \hat\mu^2 + \epsilon} &
        \text{\texttt{eps\_in\_sqrt}} \\
        u / (\sqrt{\hat\nu - \hat\mu^2} + \epsilon) & \text{otherwise}
        \end{cases}
    \end{aligned}
    $$

    The same as `optax.scale_by_stddev`.

    **Arguments:**

    - `decay`: decay of the averages, in `[0, 1)`.
    - `eps`: added to the variance (or its root), `> 0`.
    - `initial_scale`: the value the average of squares starts at, a float `>= 0`
      (the state's initial value, so a Python number).
    - `eps_in_sqrt`: add `eps` inside the root (a bool).
    - `bias_correction`: divide both averages by `1 - decay**t` (a bool).
    - `mu_dtype`, `nu_dtype`: dtypes to store the averages in; `None` keeps each
      parameter's (optax has no such options).
    """

    # Computed once per step (`step_values`).
    bias: StepValue = step_value()

    decay: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True)
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0, low_open=True)
    # The fill of the state at `init`, so it cannot be a schedule or an array.
    initial_scale: float = checked_field(_initial_scale, 0.0, static=True)
    eps_in_sqrt: bool = flag_field(True, kw_only=False)
    bias_correction: bool = flag_field(False, kw_only=False)
    mu_dtype: DTypeLike = dtype_field(storage=True)
    nu_dtype: DTypeLike = dtype_field(storage=True)

    state_type = ScaleByStddevState
    moments = (
        Moment("mu", dtype=mu_dtype),
        Moment("nu", dtype=nu_dtype, nonnegative=True, fill=initial_scale),
    )
    elementwise = True

    def step_values(self, step: Int[Array, ""]):
        h = super().step_values(step)
        h = replace(h, bias=1 - h.decay ** _t_as(increment(step), h.decay))
        return h

    def leaf(self, h, t, g, p, mu, nu):
        del t, p
        mu = h.decay * mu + (1 - h.decay) * g
        nu = h.decay * nu + (1 - h.decay) * abs_sq(g)
        mu_hat, nu_hat = (
            (mu / h.bias, nu / h.bias) if self.bias_correction else (mu, nu)
        )
        variance = nu_hat - abs_sq(mu_hat)
        if self.eps_in_sqrt:
            return g * jax.lax.rsqrt(variance + h.eps), mu, nu
        return g / (jnp.sqrt(variance) + h.eps), mu, nu


class ScaleByParamBlockNorm(AbstractBlock):
    r"""Scales each leaf's update by the norm of its parameter (a weight matrix or
    vector is a block), $\|\cdot\|$ the leaf's Euclidean norm:

    $$
    u \leftarrow u \cdot \max(\|p\|, \mathrm{min\_scale})
    $$

    The same as `optax.scale_by_param_block_norm`.

    **Arguments:**

    - `min_scale`: the least factor, `>= 0`.
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: the
      norm is that of the whole leaf, summed over the named axes it is split
      over, as the unsharded run. `None` (default): this device's block.
    """

    reads_params = "the norm of each parameter"

    min_scale: ScalarOrSchedule = hyper(1e-3, low=0.0)
    axis_name: AxisName = axis_name_field()

    state_type = StepState
    moments = ()
    elementwise = False  # the norm reduces over the leaf

    def leaf(self, h, t, g, p):
        norm = leaf_norm(p, self.axis_name, "ScaleByParamBlockNorm")
        return (g * jnp.maximum(norm, h.min_scale).astype(g.dtype),)


class ScaleByParamBlockRms(AbstractBlock):
    r"""Scales each leaf's update by the root mean square of its parameter (a
    weight matrix or vector is a block), as Adafactor's parameter scale:

    $$
    u \leftarrow u \cdot \max\left(\sqrt{\operatorname{mean}(p^2)},
        \mathrm{min\_scale}\right)
    $$

    The same as `optax.scale_by_param_block_rms`.

    **Arguments:**

    - `min_scale`: the least factor, `>= 0`.
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: the
      mean is over the whole leaf, split over the named axes, as the unsharded
      run. `None` (default): this device's block.
    """

    reads_params = "the root mean square of each parameter"

    min_scale: ScalarOrSchedule = hyper(1e-3, low=0.0)
    axis_name: AxisName = axis_name_field()

    state_type = StepState
    moments = ()
    elementwise = False  # the mean reduces over the leaf

    def leaf(self, h, t, g, p):
        mean = shard_mean(abs_sq(p), self.axis_name, "ScaleByParamBlockRms")
        return (g * jnp.maximum(jnp.sqrt(mean), h.min_scale).astype(g.dtype),)


class ScaleByOptimisticGradientState(eqx.Module):
    """State of `ScaleByOptimisticGradient`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `prev_grad`: the previous update, shaped like params (`None` at non-float
      leaves).
    """

    step: Int[Array, ""]
    prev_grad: PyTree[Float[Array, "..."] | None]


class ScaleByOptimisticGradient(AbstractBlock):
    r"""The optimistic direction (Mokhtari et al., 2019), the maths of
    `OptimisticGradientDescent`:

    $$
    u \leftarrow (\alpha + \beta)\, u - \beta\, u_\mathrm{prev}
    $$

    with $u_\mathrm{prev}$ the previous step's update, and $u$ itself on the
    first step. The same as `optax.scale_by_optimistic_gradient`;
    `Chain(ScaleByOptimisticGradient(alpha, beta), ScaleByLearningRate(lr))` is
    `OptimisticGradientDescent(lr, alpha, beta)`.

    **Arguments:**

    - `alpha`: weight of the current update, `>= 0`.
    - `beta`: weight of the extrapolation (negative momentum), `>= 0`.
    """

    alpha: ScalarOrSchedule = hyper(1.0, low=0.0)
    beta: ScalarOrSchedule = hyper(1.0, low=0.0)

    state_type = ScaleByOptimisticGradientState
    moments = (Moment("prev_grad"),)
    elementwise = True

    def leaf(self, h, t, g, p, prev):
        return optimistic_direction(h, t, g, prev)


class ScaleByPolyak(AbstractEngineTransform):
    r"""Scales the updates by the stochastic Polyak step size (Loizou et al., 2021),
    the maths of `PolyakSGD`: with `f` the loss at the current parameters (passed
    as `value=`) and $\|u\|^2$ the squared norm of the whole update tree,

    $$
    \begin{aligned}
    \mathrm{gap} &= \begin{cases} f - f_\mathrm{min} & \text{(\texttt{"sps"})} \\
        \max(f - f_\mathrm{min}, 0) & \text{(\texttt{"sps+"})} \end{cases} \\
    u &\leftarrow \min\left(\frac{\mathrm{gap}}{\|u\|^2 + \epsilon},
        \mathrm{max\_learning\_rate}\right) u
        && \text{($0$ if $\|u\|^2 + \epsilon \le 2.2 \cdot 10^{-16}$)}
    \end{aligned}
    $$

    The loss is a keyword of `update` and `step` (`update(grads, state, params,
    value=loss)`; `Chain` passes it on). The same as `optax.scale_by_polyak`;
    `Chain(ScaleByPolyak(), ScaleByLearningRate(s))` is `PolyakSGD(scaling=s)`.

    **Arguments:**

    - `f_min`: a lower bound on (a guess of) the minimum of the loss.
    - `max_learning_rate`: the largest step size, `> 0`.
    - `eps`: added to $\|u\|^2$, `>= 0`.
    - `variant`: `"sps"` or `"sps+"` (clip a negative gap to zero).
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them:
      $\|u\|^2$ covers the whole model, as the unsharded run. `None` (default):
      this device's blocks only.
    """

    reduces_over = "tree"

    reads_params = None  # the parameters are not read (`params_needed`)

    f_min: ScalarOrSchedule = hyper(0.0)
    max_learning_rate: ScalarOrSchedule = hyper(1.0, low=0.0, low_open=True)
    eps: ScalarOrSchedule = hyper(0.0, low=0.0)
    variant: str = choice_field("sps", ("sps", "sps+"), kw_only=False)
    axis_name: AxisName = axis_name_field()

    keywords = supplies(value=Supplied.LOSS)  # the loss

    def init(self, params: Params) -> StepState:
        return StepState(step=zero_step())

    def run(
        self,
        grads: Grads,
        state: StepState,
        params: Params,
        *,
        apply: bool,
        value: Any = None,
    ) -> tuple[Updates, StepState]:
        h = values_at(self, state.step)
        rate = polyak_rate(self, h, grads, params, value)

        def rule(g, p):
            return (rate * g,)

        out, _ = map_leaves(rule, grads, params, elementwise=True, apply=apply)
        return out, StepState(step=increment(state.step))


class ScaleByDistanceOverGradientsState(eqx.Module):
    """State of `ScaleByDistanceOverGradients`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `max_dist`: per float leaf, a scalar: the largest distance
      `|p - init_params|` of that leaf seen so far (starting at
      `reps_rel * (1 + |p|)`).
    - `grad_sum_of_squares`: per float leaf, a scalar: the sum over steps of
      `|u|**2`.
    - `init_params`: the parameters at `init` (in `param_dtype`).

    `None` at non-float leaves.
    """

    step: Int[Array, ""]
    max_dist: PyTree[Float[Array, ""] | None]
    grad_sum_of_squares: PyTree[Float[Array, ""] | None]
    init_params: PyTree[Float[Array, "..."] | None]


class ScaleByDistanceOverGradients(AbstractBlock):
    r"""Layer-wise DoG (Ivgi et al., 2023: "LDoG"), the step size of `DoG` taken
    per leaf: with norms over each leaf,

    $$
    \begin{aligned}
    r &\leftarrow \max(r, \|p - p_0\|)
        && \text{($r$ starts at \texttt{reps\_rel}} \cdot (1 + \|p_0\|)) \\
    G &\leftarrow G + \|u\|^2 \\
    u &\leftarrow \mathrm{global\_scale} \cdot \frac{r}{\sqrt{G + \epsilon}}\, u
    \end{aligned}
    $$

    The same as `optax.scale_by_distance_over_gradients` (whose per-leaf sums are
    of shape `(1,)`; here scalars). On a one-leaf model,
    `Chain(ScaleByDistanceOverGradients(r), ScaleByLearningRate(lr))` is
    `DoG(lr, init_step="heuristic", init_value=r)`. `init` must get the real
    parameters.

    **Arguments:**

    - `reps_rel`: sets the first distance, `> 0` (`1e-6`; the authors suggest
      `1e-4` for models with batch normalisation). Read at `init`, so not a
      schedule.
    - `eps`: added to the sum of squared norms, `>= 0`.
    - `param_dtype`: dtype to store the initial parameters in; `None` keeps each
      parameter's (optax's default is float32).
    - `global_scale`: a factor on every update (such as `-1.0`).
    """

    reads_params = "distance from the initial parameters"

    reps_rel: ScalarOrSchedule = hyper(1e-6, low=0.0, low_open=True, schedule=False)
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0)
    param_dtype: DTypeLike = dtype_field(kw_only=False)
    global_scale: ScalarOrSchedule = hyper(1.0)

    state_type = ScaleByDistanceOverGradientsState
    moments = (
        Moment("max_dist", nonnegative=True),
        Moment("grad_sum_of_squares", nonnegative=True),
        Moment("init_params", dtype=param_dtype),
    )
    elementwise = False  # the norms reduce over the leaf

    def init(self, params: Params) -> ScaleByDistanceOverGradientsState:
        def start(p):
            if not is_float_leaf(p):
                return None
            # Real, as the distances and norms it is compared with.
            dtype = compute_dtype(p.dtype)
            norm = jnp.sqrt(jnp.sum(abs_sq(p.astype(dtype))))
            return jnp.asarray(self.reps_rel, norm.dtype) * (1 + norm)

        def zero(p):
            if not is_float_leaf(p):
                return None
            return jnp.zeros((), real_compute_dtype(p.dtype))

        def copy(p):
            if not is_float_leaf(p):
                return None
            return jnp.array(p, self.param_dtype or p.dtype, copy=True)

        return ScaleByDistanceOverGradientsState(
            step=zero_step(),
            max_dist=jax.tree.map(start, params),
            grad_sum_of_squares=jax.tree.map(zero, params),
            init_params=jax.tree.map(copy, params),
        )

    def leaf(self, h, t, g, p, max_dist, sum_sq, p0):
        moved = jnp.sum(abs_sq(p - p0))
        eta, max_dist, sum_sq = dog_step_size(
            max_dist, sum_sq, moved, jnp.sum(abs_sq(g)), h.eps
        )
        return (h.global_scale * eta).astype(g.dtype) * g, max_dist, sum_sq, p0


class ScaleByFactoredRmsState(eqx.Module):
    """State of `ScaleByFactoredRms`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `v_row`: for each factored leaf, the moving average of squared updates
      averaged over its largest axis; `None` at leaves that are not factored.
    - `v_col`: for each factored leaf, the same averaged over its second-largest
      axis; `None` at leaves that are not factored.
    - `v`: for each float leaf that is not factored, the full moving average of
      squared updates; `None` at factored leaves.
    """

    step: Int[Array, ""]
    v_row: PyTree[Float[Array, "..."] | None]
    v_col: PyTree[Float[Array, "..."] | None]
    v: PyTree[Float[Array, "..."] | None]


def _decay_rate_function(
    name: str, value: Callable[[Int[Array, ""]], ArrayLike] | None
) -> Callable | None:
    if value is not None and (not callable(value) or isinstance(value, eqx.Module)):
        raise TypeError(
            f"{name} must be None or a function of (step, decay_rate), got "
            f"{type(value).__name__}"
        )
    return value


class ScaleByFactoredRms(AbstractTransform):
    r"""Divides by Adafactor's factored estimate of the updates' RMS (Shazeer &
    Stern, 2018), the maths of `Adafactor`: a leaf of rank `>= 2` whose
    second-largest axis has at least `min_dim_size_to_factor` entries keeps its
    second moment as averages over its largest axis `a` and second-largest `b`;
    other leaves keep a full one. With $G = u^2 + \epsilon$ and, at step $s$,
    $\beta = 1 - (\max(s - o, 0) + 1)^{-d}$ ($o$ = `step_offset`, $d$ =
    `decay_rate`):

    $$
    \begin{aligned}
    r &\leftarrow \beta r + (1 - \beta) \operatorname{mean}_a(G), \quad
    c \leftarrow \beta c + (1 - \beta) \operatorname{mean}_b(G)
        && \text{(factored)} \\
    u &\leftarrow u \big/ \left( \sqrt{r / \operatorname{mean}_b(r)} \, \sqrt{c}
        \right) && \text{(factored, broadcast back)} \\
    v &\leftarrow \beta v + (1 - \beta)\, G, \quad u \leftarrow u / \sqrt{v}
        && \text{(otherwise)}
    \end{aligned}
    $$

    The same as `optax.scale_by_factored_rms` (from `step_offset` on: optax gives
    NaN on the steps before it, here they count as the first).

    **Arguments:**

    - `factored`: `False` keeps a full second moment for every leaf.
    - `decay_rate`: exponent of the decay schedule, `>= 0`.
    - `step_offset`: the step the decay schedule restarts at (for fine-tuning),
      an int `>= 0`.
    - `min_dim_size_to_factor`: factor a leaf only if its second-largest axis has
      at least this many entries (an int `>= 1`).
    - `epsilon`: added to squared updates, `> 0`.
    - `decay_rate_fn`: `None` (the schedule above), or a function
      `(step - step_offset, decay_rate) -> beta` (static: pass the same function
      each time, not a new lambda, or each new block compiles anew).
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    factored: bool = flag_field(True, kw_only=False)
    decay_rate: ScalarOrSchedule = hyper(0.8, low=0.0)
    step_offset: Int[Array, ""] = count_field(0, at_least_one=False)
    # Static: it decides which leaves are factored, so the state's shapes.
    min_dim_size_to_factor: int = checked_field(static_count, 128, static=True)
    epsilon: ScalarOrSchedule = hyper(1e-30, low=0.0, low_open=True)
    decay_rate_fn: Callable | None = checked_field(
        _decay_rate_function, None, static=True
    )

    def _axes(self, params: Params) -> list[tuple[int, int] | None]:
        return [
            factored_axes(jnp.shape(p), self.factored, self.min_dim_size_to_factor)
            if is_float_leaf(p)
            else None
            for p in jax.tree.leaves(params)
        ]

    def init(self, params: Params) -> ScaleByFactoredRmsState:
        v_row, v_col, v = factored_stats(params, self._axes(params))
        return ScaleByFactoredRmsState(zero_step(), v_row, v_col, v)

    def transform(
        self, grads: Grads, state: ScaleByFactoredRmsState, params: Params
    ) -> tuple[Updates, ScaleByFactoredRmsState]:
        h = values_at(self, state.step)
        if self.decay_rate_fn is None:
            # `+ 1` in float32: in int32 it wraps at the saturated step.
            since = jnp.maximum(state.step - self.step_offset, 0)
            beta = 1.0 - (since.astype(jnp.float32) + 1.0) ** (-h.decay_rate)
        else:
            beta = self.decay_rate_fn(state.step - self.step_offset, h.decay_rate)
            beta = jnp.asarray(beta, jnp.float32)
        layouts = leaf_layouts(params, None, "ScaleByFactoredRms", None)
        scaled, (v_row, v_col, v) = factored_rms(
            grads,
            params,
            (state.v_row, state.v_col, state.v),
            self._axes(params),
            layouts,
            beta,
            h.epsilon,
        )
        return scaled, ScaleByFactoredRmsState(increment(state.step), v_row, v_col, v)


class ScaleByLBFGS(AbstractTransform):
    r"""The L-BFGS direction with optax's sign (`optax.scale_by_lbfgs`): the
    gradient preconditioned by the L-BFGS inverse-Hessian estimate $H$ of the last
    `memory_size` pairs (the two-loop recursion of `LBFGS`),

    $$
    u = +H g
    $$

    a direction of ascent, as a gradient is: follow it with
    `ScaleByLearningRate(lr)` (which negates it), or a linesearch, as optax's
    `chain(scale_by_lbfgs(), scale_by_learning_rate(lr))`. `LBFGS(lr,
    linesearch=False)` is that chain in one: its update is `-lr * H g`, to be
    added to the parameters.

    **Arguments:**

    - `memory_size`: the number of pairs kept (static int `>= 1`).
    - `scale_init_precond`: scale the initial inverse Hessian by `<s, y> / <y, y>`
      of the newest pair (`min(1, 1 / |g|)` at the first update), as `LBFGS`
      (static).
    - `axis_name`: inside `jax.shard_map`, as `LBFGS`'s.
    """

    reduces_over = "tree"

    reads_params = "memory of parameter differences"

    memory_size: int = checked_field(static_count, 10, static=True)
    scale_init_precond: bool = flag_field(True, kw_only=False)
    axis_name: AxisName = axis_name_field()

    def _lbfgs(self) -> LBFGS:
        # L-BFGS without linesearch at learning rate 1: `-H g`, the sign flipped
        # below (exactly).
        return LBFGS(  # pyright: ignore[reportCallIssue]
            1.0,
            self.memory_size,
            self.scale_init_precond,
            linesearch=False,
            axis_name=self.axis_name,
        )

    def init(self, params: Params) -> LBFGSState:
        state = self._lbfgs().init(params)
        # No linesearch evaluates the loss here: its slot holds 0, not "unknown".
        return eqx.tree_at(lambda s: s.value, state, jnp.zeros_like(state.value))

    def transform(
        self, grads: Grads, state: LBFGSState, params: Params
    ) -> tuple[Updates, LBFGSState]:
        descent, new_state = self._lbfgs().transform(grads, state, params)
        return jax.tree.map(jnp.negative, descent), new_state
