"""Gradient clipping: by value, by global norm, by block RMS, adaptive (unit-wise)."""

import abc
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from .._core._base import AbstractTransform, Grads, Params, Updates
from .._core._fields import (
    ScalarOrSchedule,
    axis_name_field,
    checked_field,
    hyper,
    param_specs_field,
    values_at,
)
from .._core._leafwise import map_leaves
from .._core._norms import norm, reduction_dtype
from .._core._real import RealOnly
from .._core._shards import (
    AxisName,
    Layout,
    checked_axis_name,
    global_shape,
    leaf_layouts,
    shard_mean,
    shard_sum_dims,
)
from .._core._structure import FrozenTree
from .._core._tree import (
    abs_sq,
    align_grads,
    increment,
    is_float_leaf,
    leaf_paths,
    zero_step,
)
from ._state import StepState

_NO_ORDER = "complex numbers have no order to clip by"


def global_norm(tree: PyTree, axis_name: Any = None) -> Float[Array, ""]:
    """The L2 norm of all float array leaves of `tree` together:
    `sqrt(sum_leaves sum(|x|**2))`, computed in at least float32 (float64 where a
    leaf is float64, under `jax_enable_x64`).

    `None` and non-float leaves are skipped; an empty tree has norm 0, and the
    gradient of the norm at all-zero leaves is 0 (not NaN). A NaN in any leaf
    gives NaN and an infinity gives infinity, as `optax.global_norm` and
    `eqxopt.tree_norm` do.

    **Arguments:**

    - `tree`: any pytree.
    - `axis_name`: inside `jax.shard_map`, a mesh axis name (or tuple of them): the
      norm of the whole tree, each leaf's square summed over the named axes it is
      split over (varies over) and counted once where it is replicated. `None`
      (default): this device's values only.
    """
    return norm(
        jax.tree.leaves(tree), checked_axis_name("axis_name", axis_name), "global_norm"
    )


def _float_grads(grads: Grads, params: Params) -> list[Any]:
    # The gradients of the float parameters (`None` where absent).
    aligned = align_grads(grads, params)
    return [g for g, p in zip(aligned, jax.tree.leaves(params)) if is_float_leaf(p)]


class AbstractLeafClip(AbstractTransform):
    """A clipping transform that keeps only its step count (its hyperparameters may
    be schedules) and clips each leaf by itself: a subclass declares `elementwise`
    (whether its rule reads only elements) and `leaf_rule`, and may add checks of
    the inputs in `check`."""

    reads_params = None  # the parameters are not read (`params_needed`)

    elementwise: eqx.AbstractClassVar[bool]

    @abc.abstractmethod
    def leaf_rule(self, h: Any) -> Callable[..., tuple[Any]]:
        """`rule(g, p) -> (u,)` for one leaf (`rule(g, p, flag)` with
        `leaf_flags`), from the hyperparameters `h` at the step."""

    def check(self, grads: Grads, params: Params) -> None:
        """Raises on inputs the rule cannot take (before any state changes)."""

    def leaf_flags(self, params: Params) -> list[Any] | None:
        """Per leaf of `params`, a hashable value passed to the rule as its last
        argument; `None` (default): the rule takes `(g, p)` only."""
        return None

    def init(self, params: Params) -> StepState:
        return StepState(step=zero_step())

    def transform(
        self, grads: Grads, state: StepState, params: Params
    ) -> tuple[Updates, StepState]:
        self.check(grads, params)
        rule = self.leaf_rule(values_at(self, state.step))
        updates, _ = map_leaves(
            rule,
            grads,
            params,
            elementwise=self.elementwise,
            flags=self.leaf_flags(params),
        )
        return updates, StepState(step=increment(state.step))


class ClipByValue(AbstractLeafClip):
    r"""Clips every gradient element to `[-max_delta, max_delta]`:

    $$
    u = \operatorname{clip}(g, -\mathrm{max\_delta}, \mathrm{max\_delta})
    $$

    The same as `optax.clip` and `torch.nn.utils.clip_grad_value_`.

    **Arguments:**

    - `max_delta`: the bound, `>= 0` (or a schedule, read at the step).
    """

    max_delta: ScalarOrSchedule = hyper(low=0.0)

    real_only = RealOnly(_NO_ORDER, trees=("grads",))

    elementwise = True

    def leaf_rule(self, h: Any) -> Callable[[Any, Any], tuple[Any]]:
        bound = h.max_delta

        def rule(g, p):
            return (jnp.clip(g, -bound, bound),)

        return rule


class GlobalNormState(eqx.Module):
    """State of `ClipByGlobalNorm`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `norm`: scalar, the global norm of the last gradients, before clipping (0
      before the first update; NaN after gradients holding a NaN). float32, or
      float64 for float64 parameters under `jax_enable_x64`. Handy for logging.
    """

    step: Int[Array, ""]
    norm: Float[Array, ""]


class ClipByGlobalNorm(AbstractTransform):
    r"""Scales all gradients together so their global norm is at most `max_norm`:

    $$
    n = \sqrt{\textstyle\sum_\text{leaves} \sum g^2}, \qquad
    u = \begin{cases}
    g & n < \mathrm{max\_norm} \\
    (g / n) \cdot \mathrm{max\_norm} & \text{otherwise}
    \end{cases}
    $$

    The same as `optax.clip_by_global_norm` and `torch.nn.utils.clip_grad_norm_`
    (torch divides by `n + 1e-6`), except that all-zero gradients give zeros and
    never NaN, also in the gradient of this function (optax 0.2.8 gives NaN there,
    and for `max_norm=0`; optax PR 1752). Leaves with a `None` gradient are left
    out of the norm. Gradients holding a NaN have a NaN norm and give NaN updates
    (as in optax and torch), never unclipped ones.

    **Arguments:**

    - `max_norm`: the largest global norm let through, `> 0` (or a schedule, read
      at the step).
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: the
      norm of the whole model, each leaf summed over the named axes it is split
      over (and counted once where replicated), so every device clips alike, as
      the unsharded run. `None` (default): this device's gradients only.

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxopt

    clip = eqxopt.ClipByGlobalNorm(max_norm=1.0)
    grads = {"a": jnp.array([3.0]), "b": jnp.array([4.0])}  # global norm 5
    updates, _ = clip.update(grads, clip.init(grads), grads)
    assert jnp.allclose(eqxopt.global_norm(updates), 1.0)
    assert jnp.allclose(updates["a"], 0.6) and jnp.allclose(updates["b"], 0.8)
    ```
    """

    reduces_over = "tree"

    reads_params = None  # the parameters are not read (`params_needed`)

    max_norm: ScalarOrSchedule = hyper(low=0.0, low_open=True)
    axis_name: AxisName = axis_name_field()

    def init(self, params: Params) -> GlobalNormState:
        dtype = reduction_dtype(jax.tree.leaves(params))
        return GlobalNormState(step=zero_step(), norm=jnp.zeros((), dtype))

    def transform(
        self, grads: Grads, state: GlobalNormState, params: Params
    ) -> tuple[Updates, GlobalNormState]:
        # In the dtype `init` chose from the parameters (grads have their dtypes).
        grad_norm = norm(
            _float_grads(grads, params), self.axis_name, "ClipByGlobalNorm"
        ).astype(state.norm.dtype)
        max_norm = values_at(self, state.step).max_norm.astype(grad_norm.dtype)
        keep = grad_norm < max_norm
        # The divisor is never 0, so neither branch (nor its gradient) makes NaN.
        safe = jnp.where(keep, jnp.ones_like(grad_norm), grad_norm)

        def rule(g, p):
            scaled = (g / safe.astype(g.dtype)) * max_norm.astype(g.dtype)
            return (jnp.where(keep, g, scaled),)

        updates, _ = map_leaves(rule, grads, params, elementwise=True)
        return updates, GlobalNormState(step=increment(state.step), norm=grad_norm)


class NormalizeByUpdateNorm(AbstractTransform):
    r"""Divides all updates together by their global norm (plus `eps`) and
    multiplies them by `scale_factor`:

    $$
    n = \sqrt{\textstyle\sum_\text{leaves} \sum u^2}, \qquad
    u \leftarrow \mathrm{scale\_factor} \cdot \frac{u}{n + \epsilon}
    $$

    The same as `optax.normalize_by_update_norm`, and with `eps=0` as
    `optax.contrib.normalize` (which is this with no `eps` and a factor of 1).
    Leaves with a `None` update are left out of the norm. (With `eps=0`, all-zero
    updates give NaN, as in optax.)

    **Arguments:**

    - `scale_factor`: multiplies the normalised updates (`-lr` for a normalised
      descent step), a number or schedule (read at the step).
    - `eps`: added to the norm, `>= 0`.
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: the
      norm of the whole model, each leaf summed over the named axes it is split
      over, as the unsharded run. `None` (default): this device's updates only.
    """

    reduces_over = "tree"

    reads_params = None  # the parameters are not read (`params_needed`)

    scale_factor: ScalarOrSchedule = hyper(1.0)
    eps: ScalarOrSchedule = hyper(1e-6, low=0.0)
    axis_name: AxisName = axis_name_field()

    def init(self, params: Params) -> StepState:
        return StepState(step=zero_step())

    def transform(
        self, grads: Grads, state: StepState, params: Params
    ) -> tuple[Updates, StepState]:
        n = norm(_float_grads(grads, params), self.axis_name, "NormalizeByUpdateNorm")
        h = values_at(self, state.step)
        divisor = (n + h.eps.astype(n.dtype)) / h.scale_factor.astype(n.dtype)

        def rule(g, p):
            return (g / divisor.astype(g.dtype),)

        updates, _ = map_leaves(rule, grads, params, elementwise=True)
        return updates, StepState(step=increment(state.step))


class ClipByBlockRMS(AbstractLeafClip):
    r"""Clips each leaf ("block") so its root-mean-square is at most `threshold`:

    $$
    u = \frac{g}{\max\left(1, \sqrt{\operatorname{mean}(g^2)} /
        \mathrm{threshold}\right)}
    $$

    The same as `optax.clip_by_block_rms`.

    **Arguments:**

    - `threshold`: the largest RMS let through, `> 0` (or a schedule, read at the
      step).
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: the
      RMS of each whole leaf, summed over the named axes it is split over. `None`
      (default): this device's block of the leaf only.
    """

    threshold: ScalarOrSchedule = hyper(low=0.0, low_open=True)
    axis_name: AxisName = axis_name_field()

    elementwise = False

    def leaf_rule(self, h: Any) -> Callable[[Any, Any], tuple[Any]]:
        threshold = h.threshold
        axis_name = self.axis_name

        def rule(g, p):
            rms = jnp.sqrt(shard_mean(abs_sq(g), axis_name, "ClipByBlockRMS"))
            denom = jnp.maximum(1.0, rms / threshold)
            return (g / denom,)

        return rule


def _unit_axes(ndim: int, axis: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """The axes `unitwise_norm` sums over (optax's defaults); `None`: all of them."""
    if axis is not None:
        return axis
    if ndim <= 1:
        return None
    if ndim in (2, 3):
        return (0,)
    if ndim in (4, 5):
        return tuple(range(ndim - 1))
    raise ValueError(ndim)


def _unitwise_norm(
    x: Array, axes: tuple[int, ...] | None, squeezed: bool, layout: Layout
) -> Array:
    sq = shard_sum_dims(abs_sq(x), None if squeezed else axes, layout, keepdims=True)
    return jnp.broadcast_to(jnp.sqrt(sq), x.shape)


def _axes(name: str, value: int | Sequence[int] | None) -> tuple[int, ...] | None:
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    if value is not None and not (
        isinstance(value, tuple)
        and all(isinstance(a, int) and not isinstance(a, bool) for a in value)
    ):
        raise TypeError(
            f"{name} must be None, an int or a tuple of ints, got {value!r}"
        )
    return value


class AdaptiveGradClip(AbstractLeafClip):
    r"""Adaptive gradient clipping (Brock et al., 2021, NFNets), unit-wise:

    $$
    \begin{aligned}
    u_\mathrm{max} &= \mathrm{clipping} \cdot \max(\|p\|_\mathrm{unit}, \epsilon) \\
    u &= \begin{cases} g & \|g\|_\mathrm{unit} < u_\mathrm{max} \\
        g \cdot u_\mathrm{max} / \max(\|g\|_\mathrm{unit}, 10^{-6}) & \text{otherwise}
            \end{cases}
    \end{aligned}
    $$

    A "unit" is a row of the parameter: norms are taken over axis 0 for 2-D and
    3-D leaves, axes 0-2 for 4-D (HWIO convolutions), 0-3 for 5-D, and over the whole
    leaf for scalars and vectors (optax's conventions for `(in, out)` weights; for
    Equinox `Linear` weights of shape `(out, in)` pass `axis=1`). The same as
    `optax.adaptive_grad_clip`.

    **Arguments:**

    - `clipping`: the largest ratio of gradient norm to parameter norm, `> 0`.
    - `eps`: the floor of the parameter norm (so zero-initialised parameters can
      move), `>= 0`.

    Both may be schedules, read at the step.
    - `axis`: an int or tuple of ints, the axes to take norms over for every leaf;
      `None` for the defaults above (which cover up to 5 dimensions).
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: unit
      norms over whole leaves: a unit that spans a split dimension is summed over
      its axes, shapes are those of the whole leaf. `None` (default): this
      device's block only.
    - `param_specs`: with `axis_name`, the `jax.sharding.PartitionSpec` of each
      parameter leaf inside `shard_map` (or a pytree prefix of params of them), as
      for `Adafactor`. `None` (default): a split leaf is split along its leading
      dimension.
    """

    reads_params = "clipping relative to each parameter's norm"

    clipping: ScalarOrSchedule = hyper(low=0.0, low_open=True)
    eps: ScalarOrSchedule = hyper(1e-3, low=0.0)
    axis: tuple[int, ...] | None = checked_field(_axes, None, static=True)
    axis_name: AxisName = axis_name_field()
    param_specs: FrozenTree | None = param_specs_field()

    elementwise = False

    def leaf_flags(self, params: Params) -> list[Any] | None:
        return leaf_layouts(
            params, self.axis_name, "AdaptiveGradClip", self.param_specs
        )

    def check(self, grads: Grads, params: Params) -> None:
        if self.axis is None:
            for path, p in zip(leaf_paths(params), jax.tree.leaves(params)):
                if is_float_leaf(p) and p.ndim > 5:
                    raise ValueError(
                        f"AdaptiveGradClip has no default unit for params{path} of "
                        f"shape {p.shape}; pass axis= to say which axes to take "
                        "norms over"
                    )

    def leaf_rule(self, h: Any) -> Callable[..., tuple[Any]]:
        clipping, eps, axis = h.clipping, h.eps, self.axis

        def rule(g, p, layout):
            # The unit is chosen from the whole leaf's shape, not the block's.
            whole = global_shape(p, layout)
            squeezed = axis is None and sum(d != 1 for d in whole) <= 1
            axes = None if squeezed else _unit_axes(p.ndim, axis)
            g_norm = _unitwise_norm(g, axes, squeezed, layout)
            p_norm = _unitwise_norm(p, axes, squeezed, layout)
            max_norm = clipping * jnp.maximum(p_norm, eps)
            clipped = g * (max_norm / jnp.maximum(g_norm, 1e-6))
            return (jnp.where(g_norm < max_norm, g, clipped),)

        return rule
