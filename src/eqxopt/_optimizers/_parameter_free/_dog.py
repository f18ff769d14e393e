"""DoG and DoWG: SGD with a step size from the distance travelled from the start."""

import abc
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int, PyTree

from ..._core._base import Grads, Params, Updates
from ..._core._checks import renames
from ..._core._fields import (
    MaskLike,
    ScalarOrSchedule,
    axis_name_field,
    choice_field,
    hyper,
    learning_rate_field,
    mask_field,
    values_at,
    weight_decay_field,
)
from ..._core._leafwise import AbstractEngineTransform, map_leaves
from ..._core._masks import decay_flags
from ..._core._norms import root, statistic_like, sum_of_squares
from ..._core._shards import AxisName
from ..._core._tree import abs_sq, increment, zero_step
from ._sums import copy_params, real_dtype, tree_sums


def _norm(params: PyTree, axis_name: AxisName) -> Float[Array, ""]:
    return root(sum_of_squares(jax.tree.leaves(params), axis_name, "DoG"))


def dog_step_size(
    max_dist: Array, sum_sq: Array, moved_sq: Array, grad_sq: Array, eps: Array
) -> tuple[Array, Array, Array]:
    """`(eta, max_dist, sum_sq)`: DoG's step size `max_dist / sqrt(sum_sq + eps)`
    and its two statistics advanced by the squared distance `moved_sq` from the
    start and the squared gradient norm `grad_sq` (whole-tree ones for `DoG`, one
    leaf's for `ScaleByDistanceOverGradients`)."""
    max_dist = jnp.maximum(max_dist, jnp.sqrt(moved_sq))
    sum_sq = sum_sq + grad_sq
    return max_dist / jnp.sqrt(sum_sq + eps), max_dist, sum_sq


class AbstractDistanceOverGradients(AbstractEngineTransform):
    """DoG and DoWG: SGD (with coupled decay where `mask`) at a step size from two
    scalars of the state, a distance estimate and a sum of squared gradient
    norms, advanced each step from the whole-tree sums `|p - p0|**2` and `|g|**2`.

    A subclass declares `state_type` (fields `step`, `params0`, the distance, the
    sum, in that order), `start` (the distance estimate at `init`) and `advance`
    (the step size and the two new scalars).
    """

    reads_params = "distance from the initial parameters"

    weight_decay: eqx.AbstractVar[ScalarOrSchedule]
    mask: eqx.AbstractVar[MaskLike]
    axis_name: eqx.AbstractVar[AxisName]
    state_type: eqx.AbstractClassVar[type[Any]]

    @abc.abstractmethod
    def start(self, params: Params) -> ArrayLike:
        """The distance estimate the state starts at."""

    @abc.abstractmethod
    def advance(self, h: Any, state: Any, total: Array) -> tuple[Array, Array, Array]:
        """`(scale, distance, sum)`: the step size and the state's new scalars,
        from the hyperparameters `h` at the step and `total = [|p - p0|**2,
        |g|**2]`."""

    def init(self, params: Params) -> Any:
        decay_flags(self.mask, params)  # a bad mask fails here
        return self.state_type(
            zero_step(),
            copy_params(params),
            statistic_like(params, self.start(params)),
            statistic_like(params),
        )

    def run(
        self, grads: Grads, state: Any, params: Params, *, apply: bool
    ) -> tuple[Updates, Any]:
        h = values_at(self, state.step)
        flags = decay_flags(self.mask, params)
        wd = h.weight_decay
        total, params0 = _sums(
            grads, params, state.params0, flags, wd, self.axis_name, type(self).__name__
        )
        scale, distance, sums = self.advance(h, state, total)
        updates = _step(grads, params, flags, wd, scale, apply)
        return updates, self.state_type(
            increment(state.step),
            params0,
            distance.astype(total.dtype),
            sums.astype(total.dtype),
        )


class DoGState(eqx.Module):
    """State of `DoG`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `params0`: the parameters at `init`, shaped like params (`None` at
      non-float leaves).
    - `max_dist`: scalar, the largest distance `|p - params0|` seen so
      far (starting at the initial distance `r_eps`).
    - `sum_sq_norm_grads`: scalar, the sum over steps of `|g|**2`.

    The float scalars are float32, or float64 for float64 parameters under
    `jax_enable_x64` (the dtype of sums over the parameters).
    """

    step: Int[Array, ""]
    params0: PyTree[Float[Array, "..."] | None]
    max_dist: Float[Array, ""]
    sum_sq_norm_grads: Float[Array, ""]


class DoG(AbstractDistanceOverGradients):
    r"""DoG, "Distance over Gradients" (Ivgi et al., 2023): SGD whose step size is
    the largest distance travelled from the start over the root of the summed
    squared gradient norms.

    With norms over the whole tree, `g` the gradient plus `weight_decay * p`
    (where `mask`) and `lr` the learning rate at the current step ($\eta$ is
    `init_value` at the first step if `init_step="learning_rate"`):

    $$
    \begin{aligned}
    r &\leftarrow \max(r, \|p - p_0\|) && \text{($r$ starts at \texttt{r\_eps})} \\
    G &\leftarrow G + \|g\|^2 \\
    \eta &= r / \sqrt{G + \epsilon} \\
    p &\leftarrow p - \mathrm{lr} \cdot \eta\, g
    \end{aligned}
    $$

    `r_eps` is `init_value` (`init_step="distance"`), `init_value * (1 + |p0|)`
    (`"heuristic"`; `init` must then get the real parameters), or `0`
    (`"learning_rate"`). The same as `optax.contrib.dog` (`init_step=(kind,
    value)` there), except that only leaves with a gradient count towards the
    norms. The authors recommend averaging the iterates (such as with
    `eqxopt.ParamEMA`). Complex leaves use `|.|**2`.

    **Arguments:**

    - `learning_rate`: a multiplier of the step size (a float `>= 0`, a scalar
      array or a schedule module; default `1.0`).
    - `init_step`: how the first step is set: `"heuristic"`, `"distance"` or
      `"learning_rate"` (see above).
    - `init_value`: the value `init_step` uses, `> 0` (`1e-6`; the authors
      suggest `1e-4` for models with batch normalisation).
    - `eps`: added to the sum of squared gradient norms, `>= 0`.
    - `weight_decay`: coefficient of `p` added to the gradient, `>= 0`.
    - `mask`: which leaves get weight decay: `None` (all), a tree of bools (or a
      prefix of params' structure), or a function of params returning one.
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: the
      whole-tree sums its step size comes from cover the whole model (each leaf
      summed over the named axes it is split over), as the unsharded run. `None`
      (default): this device's blocks only.
    """

    reduces_over = "tree"

    # optax's spellings (`_checks.refuse_renamed`)
    renamed_arguments = renames(init_step=("init_step", "init_value"))

    learning_rate: ScalarOrSchedule = learning_rate_field(1.0)
    init_step: str = choice_field(
        "heuristic", ("heuristic", "distance", "learning_rate")
    )
    # Read at `init` (the starting distance), so not a schedule.
    init_value: ScalarOrSchedule = hyper(
        1e-6, low=0.0, low_open=True, schedule=False, kw_only=True
    )
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0, kw_only=True)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    mask: MaskLike = mask_field()
    axis_name: AxisName = axis_name_field()

    state_type = DoGState

    def start(self, params: Params) -> Any:  # a number or scalar array
        if self.init_step == "distance":
            return self.init_value
        if self.init_step == "heuristic":
            norm = _norm(params, self.axis_name)
            return jnp.asarray(self.init_value, norm.dtype) * (1 + norm)
        return jnp.zeros(())

    def advance(
        self, h: Any, state: DoGState, total: Array
    ) -> tuple[Array, Array, Array]:
        eta, max_dist, sum_sq = dog_step_size(
            state.max_dist, state.sum_sq_norm_grads, total[0], total[1], h.eps
        )
        if self.init_step == "learning_rate":
            eta = jnp.where(state.step == 0, h.init_value, eta)
        return h.learning_rate * eta, max_dist, sum_sq


class DoWGState(eqx.Module):
    """State of `DoWG`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `params0`: the parameters at `init`, shaped like params (`None` at
      non-float leaves).
    - `estim_sq_dist`: scalar, the largest squared distance
      `|p - params0|**2` seen so far (starting at `init_estim_sq_dist`).
    - `weighted_sq_norm_grads`: scalar, the sum over steps of
      `estim_sq_dist * |g|**2`.

    The float scalars are float32, or float64 for float64 parameters under
    `jax_enable_x64` (the dtype of sums over the parameters).
    """

    step: Int[Array, ""]
    params0: PyTree[Float[Array, "..."] | None]
    estim_sq_dist: Float[Array, ""]
    weighted_sq_norm_grads: Float[Array, ""]


class DoWG(AbstractDistanceOverGradients):
    r"""DoWG, "Distance over Weighted Gradients" (Khaled et al., 2023): DoG with the
    squared gradient norms weighted by the squared distance estimate.

    With norms over the whole tree, `g` the gradient plus `weight_decay * p`
    (where `mask`) and `lr` the learning rate at the current step:

    $$
    \begin{aligned}
    r^2 &\leftarrow \max(r^2, \|p - p_0\|^2)
        && \text{($r^2$ starts at \texttt{init\_estim\_sq\_dist})} \\
    v &\leftarrow v + r^2 \|g\|^2 \\
    \eta &= r^2 / (\sqrt{v} + \epsilon) \\
    p &\leftarrow p - \mathrm{lr} \cdot \eta\, g
    \end{aligned}
    $$

    The same as `optax.contrib.dowg`, except that only leaves with a gradient
    count towards the norms. Complex leaves use `|.|**2`.

    **Arguments:**

    - `learning_rate`: a multiplier of the step size (a float `>= 0`, a scalar
      array or a schedule module; default `1.0`).
    - `init_estim_sq_dist`: the initial guess of the squared distance to the
      solution, `> 0`; `None` uses `eps`.
    - `eps`: added to the denominator of the step size, `> 0`.
    - `weight_decay`, `mask`, `axis_name`: as for `DoG`.
    """

    reduces_over = "tree"

    learning_rate: ScalarOrSchedule = learning_rate_field(1.0)
    # Read at `init` (the state starts at it), so not a schedule.
    init_estim_sq_dist: ScalarOrSchedule | None = hyper(
        None, low=0.0, low_open=True, schedule=False, optional=True
    )
    # Also the starting estimate when init_estim_sq_dist is None, so not a schedule.
    eps: ScalarOrSchedule = hyper(1e-4, low=0.0, low_open=True, schedule=False)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0, kw_only=False)
    mask: MaskLike = mask_field()
    axis_name: AxisName = axis_name_field()

    state_type = DoWGState

    def start(self, params: Params) -> Any:  # a number or scalar array
        return self.eps if self.init_estim_sq_dist is None else self.init_estim_sq_dist

    def advance(
        self, h: Any, state: DoWGState, total: Array
    ) -> tuple[Array, Array, Array]:
        estim = jnp.maximum(state.estim_sq_dist, total[0])
        weighted = state.weighted_sq_norm_grads + estim * total[1]
        return h.learning_rate * estim / (jnp.sqrt(weighted) + h.eps), estim, weighted


def _sums(grads, params, params0, flags, wd, axis_name, owner):
    # Both whole-tree sums in one pass: |p - p0|^2 and |g|^2 (g with the decay).
    def sums(g, p, p0, decayed):
        if decayed:
            g = g + wd.astype(real_dtype(p)) * p
        moved = jnp.sum(abs_sq(p - p0))
        return jnp.stack([moved, jnp.sum(abs_sq(g))]), p0

    total, (params0,) = tree_sums(
        sums, 2, grads, params, (params0,), flags, axis_name=axis_name, owner=owner
    )
    return total, params0


def _step(grads, params, flags, wd, scale, apply):
    # `-scale * (g + wd * p)`, the decay where `flags` says, element-wise.
    def step(g, p, decayed):
        dtype = real_dtype(p)
        if decayed:
            g = g + wd.astype(dtype) * p
        return (-scale.astype(dtype) * g,)

    updates, _ = map_leaves(
        step, grads, params, elementwise=True, flags=flags, apply=apply
    )
    return updates
