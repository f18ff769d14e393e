"""Adafactor: factored second moments, relative step sizes, update clipping."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import float_dtype_or_none, static_count
from ..._core._fields import (
    MaskLike,
    ScalarOrSchedule,
    axis_name_field,
    checked_field,
    count_field,
    flag_field,
    hyper,
    learning_rate_field,
    mask_field,
    param_specs_field,
    values_at,
    weight_decay_field,
)
from ..._core._leafwise import map_leaves
from ..._core._masks import decay_flags
from ..._core._shards import (
    AxisName,
    Layout,
    drop_dim,
    global_shape,
    leaf_layouts,
    shard_mean,
    shard_sum_dims,
)
from ..._core._structure import FrozenTree
from ..._core._tree import (
    abs_sq,
    align_grads,
    float_leaves_like,
    full_like_leaf,
    increment,
    is_float_leaf,
    reduced_like_leaf,
    zero_step,
)

_MIN_PARAM_SCALE = 1e-3  # the paper's eps_2; optax.scale_by_param_block_rms's floor


def _relative_step(step: Int[Array, ""]) -> Float[Array, ""]:
    """The paper's relative step size `rho(s) = min(1e-2, 1 / sqrt(s + 1))`."""
    s = jnp.asarray(step).astype(jnp.float32)
    return jnp.minimum(jnp.float32(1e-2), jax.lax.rsqrt(s + 1.0))


def factored_axes(
    shape: tuple[int, ...], factored: bool, min_dim_size_to_factor: int
) -> tuple[int, int] | None:
    """`(b, a)`: the second-largest and largest axis of a leaf of this shape, if
    it is factored; `None` if it keeps a full second moment."""
    if not factored or len(shape) < 2:
        return None
    order = np.argsort(shape)
    if shape[order[-2]] < min_dim_size_to_factor:
        return None
    return int(order[-2]), int(order[-1])


def factored_stats(params: Params, axes: list[Any]) -> tuple[PyTree, PyTree, PyTree]:
    """The zero second-moment statistics `(v_row, v_col, v)` at `init`, for the
    factored axes of each leaf of `params` (`axes`, in leaf order, from
    `factored_axes`; `None` where a leaf is not factored)."""

    def stats(p, leaf_axes):
        if not is_float_leaf(p):
            return None, None, None
        if leaf_axes is None:
            return None, None, full_like_leaf(p)
        b, a = leaf_axes
        return reduced_like_leaf(p, a), reduced_like_leaf(p, b), None

    leaves, treedef = jax.tree.flatten(params)
    rows, cols, full = zip(*map(stats, leaves, axes)) if leaves else ((), (), ())
    return treedef.unflatten(rows), treedef.unflatten(cols), treedef.unflatten(full)


def factored_rms(
    grads: Grads,
    params: Params,
    stats: tuple[PyTree, PyTree, PyTree],
    axes: list[Any],
    layouts: list[Layout | None],
    beta: Array,
    eps: Array,
) -> tuple[Updates, tuple[PyTree, PyTree, PyTree]]:
    """Gradients divided by the factored estimate of their RMS, and the new
    statistics `(v_row, v_col, v)` (decayed by `beta`, `eps` added to `g**2`); each
    leaf's `axes` as in `factored_stats`, `layouts` its split on a mesh.
    `Adafactor` and `ScaleByFactoredRms`."""
    treedef = jax.tree.structure(params)
    aligned = align_grads(grads, params)
    factored_grads = treedef.unflatten(
        [g if a is not None else None for g, a in zip(aligned, axes)]
    )
    full_grads = treedef.unflatten(
        [g if a is None else None for g, a in zip(aligned, axes)]
    )

    def factored_rule(g, p, row, col, flag):
        (b, a), layout = flag
        whole = global_shape(p, layout)
        sq = abs_sq(g) + eps
        row_mean = shard_sum_dims(sq, a, layout) / whole[a]
        col_mean = shard_sum_dims(sq, b, layout) / whole[b]
        row = beta * row + (1.0 - beta) * row_mean
        col = beta * col + (1.0 - beta) * col_mean
        row_b = b - 1 if b > a else b  # axis b of the row statistics
        # The row statistics keep the leaf's splits but along axis a.
        row_total = shard_sum_dims(row, row_b, drop_dim(layout, a), keepdims=True)
        row_factor = (row / (row_total / whole[b])) ** -0.5
        col_factor = col**-0.5
        u = g * jnp.expand_dims(row_factor, a) * jnp.expand_dims(col_factor, b)
        return u, row, col

    def full_rule(g, p, v):
        v = beta * v + (1.0 - beta) * (abs_sq(g) + eps)
        return g * v**-0.5, v

    factored_u, (v_row, v_col) = map_leaves(
        factored_rule,
        factored_grads,
        params,
        stats[:2],
        elementwise=False,
        flags=[(a, lay) for a, lay in zip(axes, layouts)],
    )
    full_u, (v,) = map_leaves(
        full_rule, full_grads, params, stats[2:], elementwise=False
    )
    scaled = jax.tree.map(
        lambda x, y: y if x is None else x,
        factored_u,
        full_u,
        is_leaf=lambda x: x is None,
    )
    return scaled, (v_row, v_col, v)


class AdafactorState(eqx.Module):
    """State of `Adafactor`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `v_row`: for each factored leaf, the moving average of squared gradients
      averaged over the leaf's largest axis (its shape is the leaf's without that
      axis); `None` at leaves that are not factored.
    - `v_col`: for each factored leaf, the same averaged over the second-largest
      axis; `None` at leaves that are not factored.
    - `v`: for each float leaf that is not factored, the full moving average of
      squared gradients (shaped like the leaf); `None` at factored leaves.
    - `momentum`: the moving average of updates, shaped like params, or `None` when
      the optimizer has no momentum.

    Non-float leaves have `None` in every tree.
    """

    step: Int[Array, ""]
    v_row: PyTree[Float[Array, "..."] | None]
    v_col: PyTree[Float[Array, "..."] | None]
    v: PyTree[Float[Array, "..."] | None]
    momentum: PyTree[Float[Array, "..."] | None] | None


class Adafactor(AbstractTransform):
    r"""Adafactor (Shazeer & Stern, 2018), as `optax.adafactor`.

    A leaf of rank `>= 2` whose second-largest axis has at least
    `min_dim_size_to_factor` entries is *factored*: its second moment is stored as
    two vectors (more generally, two arrays with one axis fewer), averages over its
    largest axis `a` and its second-largest axis `b`. Other leaves keep a full
    second moment. With `lr` the learning rate at `step` $s$, $G = g^2 + \epsilon$
    and $\beta = 1 - (\max(s - o, 0) + 1)^{-d}$ ($o$ = `decay_offset`, $d$ =
    `decay_rate`):

    $$
    \begin{aligned}
    r &\leftarrow \beta r + (1 - \beta) \operatorname{mean}_a(G)
        && \text{(factored: v\_row)} \\
    c &\leftarrow \beta c + (1 - \beta) \operatorname{mean}_b(G)
        && \text{(factored: v\_col)} \\
    u &= g \big/ \left( \sqrt{r / \operatorname{mean}_b(r)} \, \sqrt{c} \right)
        && \text{(factored, broadcast back)} \\
    v &\leftarrow \beta v + (1 - \beta)\, G, \quad u = g / \sqrt{v}
        && \text{(otherwise)} \\
    u &\leftarrow u \big/
        \max\left(1, \operatorname{rms}(u) / \mathrm{clipping\_threshold}\right)
        && \text{(if clipping\_threshold)} \\
    u &\leftarrow \mathrm{lr} \cdot u \\
    u &\leftarrow u \cdot \max(\operatorname{rms}(p), 10^{-3})
        && \text{(if multiply\_by\_parameter\_scale)} \\
    m &\leftarrow \mathrm{momentum} \cdot m + (1 - \mathrm{momentum})\, u
        && \text{(if momentum)} \\
    u &\leftarrow m && \text{(if momentum)} \\
    p &\leftarrow p - (u + \mathrm{weight\_decay\_rate} \cdot p)
        && \text{(decay where the mask says)}
    \end{aligned}
    $$

    `rms` is the root mean square over the whole leaf. Differences from optax:

    - `learning_rate=None` (the default) is the paper's relative step size
      `min(1e-2, 1 / sqrt(step + 1))`; with `multiply_by_parameter_scale` this is
      the paper's step `max(1e-3, rms(p)) * rho_t`. (optax's `None` means a step of
      1; pass `learning_rate=1.0` for that.)
    - Steps before `decay_offset` use `beta = 0` (optax takes a negative power
      there and gives NaN, so `decay_offset` only works in optax on a state whose
      count is already past it).
    - As in optax, the weight decay is *not* multiplied by the learning rate, and
      the axes factored are the two largest (not necessarily the last two).

    **Arguments:**

    - `learning_rate`: `None`, a float `>= 0`, a scalar array, or a schedule module.
    - `min_dim_size_to_factor`: factor a leaf only if its second-largest axis has at
      least this many entries (an int `>= 1`).
    - `decay_rate`: exponent of the second-moment decay schedule, `>= 0`.
    - `decay_offset`: step at which the decay schedule restarts (for fine-tuning),
      an int `>= 0`.
    - `multiply_by_parameter_scale`: scale steps by `max(rms(p), 1e-3)`.
    - `clipping_threshold`: `> 0`, or `None` for no update clipping.
    - `momentum`: in `[0, 1)`, or `None` for no momentum (and no momentum state).
    - `dtype_momentum`: dtype of the momentum buffer.
    - `weight_decay_rate`: `>= 0`, subtracted as `weight_decay_rate * p` per step.
    - `eps`: added to squared gradients, `> 0`.
    - `factored`: `False` keeps a full second moment for every leaf.
    - `weight_decay_mask`: which leaves get weight decay: `None` (all), a tree of
      bools (or a prefix of params), or a function of params returning one.
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: the
      statistics of whole leaves, as the unsharded run: the axes to factor are
      chosen from the whole leaf's shape, a row or column statistic that spans a
      split dimension is summed over its axes, and the update clipping and
      parameter scale use whole-leaf RMS. `None` (default): this device's block
      of each leaf.
    - `param_specs`: with `axis_name`, which dimension of each leaf is split over
      which axes: the `jax.sharding.PartitionSpec` of each parameter leaf inside
      `shard_map` (what its `in_specs` say), or a pytree prefix of params of them.
      `None` (default): a leaf that varies over a named axis is taken to be split
      along its leading dimension (FSDP's convention); a leaf split along another
      dimension then needs its spec here, since inside `shard_map` nothing else
      says which dimension is split. A spec that disagrees with the axes a leaf
      varies over is an error naming the leaf.

    **Example:**

    ```python
    import jax
    import jax.numpy as jnp
    import eqxopt

    params = {"w": jnp.ones((256, 128)), "b": jnp.zeros(128)}
    opt = eqxopt.Adafactor(learning_rate=1e-2)
    state = opt.init(params)
    # the matrix keeps a row and a column of statistics (256 + 128 numbers), not
    # 256 * 128; the vector keeps a full second moment
    assert sum(leaf.size for leaf in jax.tree.leaves(state)) < 1000
    grads = jax.tree.map(jnp.ones_like, params)
    params, state = opt.step(grads, state, params)
    ```
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule | None = learning_rate_field(None, optional=True)
    # Static: it decides which leaves are factored, so the state's shapes.
    min_dim_size_to_factor: int = checked_field(static_count, 128, static=True)
    decay_rate: ScalarOrSchedule = hyper(0.8, low=0.0)
    decay_offset: Int[Array, ""] = count_field(0, at_least_one=False)
    multiply_by_parameter_scale: bool = flag_field(
        True, kw_only=False, reads_params=True
    )
    clipping_threshold: ScalarOrSchedule | None = hyper(
        1.0, low=0.0, low_open=True, optional=True
    )
    momentum: ScalarOrSchedule | None = hyper(
        None, low=0.0, high=1.0, high_open=True, optional=True
    )
    dtype_momentum: Any = checked_field(float_dtype_or_none, jnp.float32, static=True)
    weight_decay_rate: ScalarOrSchedule = weight_decay_field(0.0, kw_only=False)
    eps: ScalarOrSchedule = hyper(1e-30, low=0.0, low_open=True)
    factored: bool = flag_field(True, kw_only=False)
    weight_decay_mask: MaskLike = mask_field(kw_only=False)
    axis_name: AxisName = axis_name_field()
    param_specs: FrozenTree | None = param_specs_field()

    def factored_axes(self, shape: tuple[int, ...]) -> tuple[int, int] | None:
        """`(b, a)`: the second-largest and largest axis of a leaf of this shape, if
        it is factored; `None` if it keeps a full second moment."""
        return factored_axes(shape, self.factored, self.min_dim_size_to_factor)

    def _layouts(self, params: Params) -> list[Layout | None]:
        return leaf_layouts(params, self.axis_name, "Adafactor", self.param_specs)

    def _leaf_axes(self, p: Array, layout: Layout | None) -> tuple[int, int] | None:
        # The whole leaf's shape decides, not the block's inside shard_map.
        if not is_float_leaf(p) or layout is None:
            return None
        return self.factored_axes(global_shape(p, layout))

    def init(self, params: Params) -> AdafactorState:
        decay_flags(self.weight_decay_mask, params, "weight_decay_mask")  # checked
        layouts = self._layouts(params)
        leaves = jax.tree.leaves(params)
        axes = [self._leaf_axes(p, lay) for p, lay in zip(leaves, layouts)]
        rows, cols, full = factored_stats(params, axes)
        momentum = None
        if self.momentum is not None:
            # dtype_momentum=None: the default float dtype, as it always was.
            dtype = self.dtype_momentum
            if dtype is None:
                dtype = jnp.result_type(float)
            momentum = float_leaves_like(params, dtype)
        return AdafactorState(
            step=zero_step(),
            v_row=rows,
            v_col=cols,
            v=full,
            momentum=momentum,
        )

    def transform(
        self, grads: Grads, state: AdafactorState, params: Params
    ) -> tuple[Updates, AdafactorState]:
        h = values_at(self, state.step)
        lr = _relative_step(state.step) if h.learning_rate is None else h.learning_rate
        eps = h.eps
        # Steps before the offset count as the first (optax gives NaN there).
        # `+ 1` in float32: in int32 it wraps at the saturated step (2**31 - 1).
        since = jnp.maximum(state.step - self.decay_offset, 0)
        t = since.astype(jnp.float32) + 1.0
        beta = 1.0 - t ** (-h.decay_rate)

        layouts = self._layouts(params)
        leaves = jax.tree.leaves(params)
        axes = [self._leaf_axes(p, lay) for p, lay in zip(leaves, layouts)]
        scaled, (v_row, v_col, v) = factored_rms(
            grads, params, (state.v_row, state.v_col, state.v), axes, layouts, beta, eps
        )

        threshold, momentum = h.clipping_threshold, h.momentum
        weight_decay = h.weight_decay_rate

        def finish_rule(u, p, *rest):
            *m, decay = rest
            if threshold is not None:
                u = u / jnp.maximum(1.0, self._rms(u) / threshold)
            u = lr * u
            if self.multiply_by_parameter_scale:
                u = u * jnp.maximum(self._rms(p), _MIN_PARAM_SCALE)
            if momentum is not None:
                u = momentum * m[0] + (1.0 - momentum) * u
                m = [u]
            if decay:
                u = u + weight_decay * p
            return (-u, *m)

        moments = () if state.momentum is None else (state.momentum,)
        updates, new_moments = map_leaves(
            finish_rule,
            scaled,
            params,
            moments,
            elementwise=False,
            flags=decay_flags(self.weight_decay_mask, params, "weight_decay_mask"),
        )
        return updates, AdafactorState(
            step=increment(state.step),
            v_row=v_row,
            v_col=v_col,
            v=v,
            momentum=new_moments[0] if new_moments else None,
        )

    def _rms(self, x: Array) -> Array:
        """The root-mean-square of the whole leaf whose block here is `x`."""
        return jnp.sqrt(shard_mean(abs_sq(x), self.axis_name, "Adafactor"))
