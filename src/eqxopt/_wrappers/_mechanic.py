"""Mechanic (Cutkosky et al., 2023): a learned scale for any optimizer's steps
(`optax.contrib.mechanize`)."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from .._core._base import AbstractTransform, Grads, Params, Updates
from .._core._checks import renames, static_count
from .._core._fields import (
    ScalarOrSchedule,
    axis_name_field,
    checked_field,
    hyper,
    values_at,
    weight_decay_field,
)
from .._core._norms import root, statistic_like, sum_of_squares
from .._core._shards import AxisName, shard_total
from .._core._tree import (
    align_grads,
    compute_dtype,
    increment,
    is_float_leaf,
    zero_step,
)
from ._wrapper import AbstractSingleWrapper, inner_field, leaves_of


class MechanicState(eqx.Module):
    """State of `Mechanic`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `r`, `m`, `v`: arrays of shape `(num_betas,)`: per decay `beta`, the
      discounted reward, the running maximum of `|h|` and the discounted sum of
      `h**2`.
    - `s`: array of shape `(num_betas,)`: the scales, whose sum multiplies the
      inner optimizer's accumulated steps.

    `r`, `m`, `v` and `s` are float32, or float64 for float64 parameters under
    `jax_enable_x64`.
    - `x0`: the parameters at the first update (the reference point), shaped like
      params (`None` at non-float leaves).
    - `inner`: the inner optimizer's state.
    """

    step: Int[Array, ""]
    r: Float[Array, " n"]
    m: Float[Array, " n"]
    v: Float[Array, " n"]
    s: Float[Array, " n"]
    x0: PyTree[Float[Array, "..."] | None]
    inner: Any


class Mechanic(AbstractSingleWrapper):
    r"""Mechanic (Cutkosky, Defazio & Mehta, 2023, "Mechanic: A Learning Rate
    Tuner"): learns the scale of `inner`'s steps online, so that `inner` can run
    with learning rate 1 (or a schedule peaking at 1).

    The parameters are `x = x0 + sum(s) * delta`, where `delta` accumulates
    `inner`'s updates `u` and `x0` is the parameters at the first update. With
    $\beta = 1 - 0.1^i$ for $i = 1, \ldots,$ `num_betas` (one scale $s$ for each,
    computed side by side) and $S = \sum s$:

    $$
    \begin{aligned}
    g' &= g + \mathrm{weight\_decay} \cdot S\, \frac{\|g\|}{\|x\| + \epsilon}\, x
        && \text{($\|\cdot\|$: norm over the tree)} \\
    \delta &= (x_0 - x) / (S + \epsilon) && \text{(the accumulated steps)} \\
    h &= \langle g', \delta \rangle \\
    m &\leftarrow \max(\beta\, m, |h| + \epsilon) \\
    v &\leftarrow \beta^2 v + h^2 \\
    r &\leftarrow \beta\, r
        + \operatorname{clip}(h, -m_\mathrm{old}, m_\mathrm{old})\, s \\
    s &\leftarrow
        \frac{s_\mathrm{init} / \mathrm{num\_betas} \cdot m + \max(r, 0)}{\sqrt{v} +
            \epsilon} \\
    x' &= x_0 - \textstyle\sum s \cdot (\delta - u)
    \end{aligned}
    $$

    The same as `optax.contrib.mechanize(inner)`, which this matches. The inner
    optimizer sees the raw gradients; its learning rate should be about 1 (the
    scale `s` starts at `s_init` and grows as fast as the steps prove useful).
    Inner products and norms of complex leaves take real parts
    (`Re(conj(g) * delta)`). A leaf whose gradient is `None` (or which `inner`
    leaves alone) keeps its value and its `x0`, and counts in no norm.

    **Arguments:**

    - `inner`: the optimizer whose steps are scaled (typically `SGD(1.0)`,
      `Adam(1.0)` or `Lion(1.0)`).
    - `weight_decay`: Mechanic's own decay added to the gradient, `>= 0` (not the
      inner optimizer's).
    - `eps`: the small constant of the formulas, `> 0`.
    - `s_init`: the initial scale, `> 0` (a number: it sets the state at `init`).
    - `num_betas`: the number of decays `beta` run side by side, an int `>= 1`.
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: the
      norms and inner product over the tree cover the whole model (each leaf
      summed over the named axes it is split over), as the unsharded run. `None`
      (default): this device's blocks only.
    """

    reduces_over = "tree"

    reads_params = "scale of the change from the initial parameters"

    # optax's spellings (`_checks.refuse_renamed`)
    renamed_arguments = renames(base_optimizer=("inner",))

    inner: AbstractTransform = inner_field()
    weight_decay: ScalarOrSchedule = weight_decay_field(1e-2, kw_only=False)
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0, low_open=True)
    # Not a schedule: it is the scale the state starts from (at `init`).
    s_init: Float[Array, ""] = hyper(1e-6, low=0.0, low_open=True, schedule=False)
    num_betas: int = checked_field(static_count, 6, static=True)
    axis_name: AxisName = axis_name_field()

    def init(self, params: Params) -> MechanicState:
        def copy(p):
            return jnp.array(p, copy=True) if is_float_leaf(p) else None

        def zeros():  # one buffer each: a donated step may overwrite them
            return statistic_like(params, 0.0, (self.num_betas,))

        return MechanicState(
            step=zero_step(),
            r=zeros(),
            m=zeros(),
            v=zeros(),
            s=statistic_like(params, self.s_init, (self.num_betas,)),
            x0=jax.tree.map(copy, params),
            inner=self.inner.init(params),
        )

    def transform(
        self, grads: Grads, state: MechanicState, params: Params, **extra: Any
    ) -> tuple[Updates, MechanicState]:
        h_ = values_at(self, state.step)
        updates, inner_state = self.run_inner(grads, state.inner, params, extra)
        param_leaves, treedef = jax.tree.flatten(params)
        grad_leaves = align_grads(grads, params)
        x0_leaves = treedef.flatten_up_to(state.x0)
        first = state.step == 0
        # The leaves Mechanic moves: a gradient and an update from `inner`.
        active = []
        for g, u, p, x0 in zip(
            grad_leaves, leaves_of(updates, params), param_leaves, x0_leaves
        ):
            if g is None or u is None or x0 is None or not is_float_leaf(p):
                active.append(None)
                continue
            dtype = compute_dtype(p.dtype)
            p_ = p.astype(dtype)
            # optax restarts from the parameters of the first update (a model
            # loaded after `init` starts there).
            x0_ = jnp.where(first, p_, x0.astype(dtype))
            active.append((g.astype(dtype), u.astype(dtype), p_, x0_))

        dtype = state.s.dtype  # that of sums over the parameters

        def total(values):
            return shard_total(values, self.axis_name, "Mechanic", dtype)

        def norm(leaves):
            return root(sum_of_squares(leaves, self.axis_name, "Mechanic", dtype))

        s_sum = jnp.sum(state.s)
        grad_norm = norm([a[0] for a in active if a])
        param_norm = norm([a[2] for a in active if a])
        decay = h_.weight_decay * s_sum * grad_norm / (param_norm + h_.eps)
        h = total(
            [
                jnp.sum(jnp.real(jnp.conj(g + decay * p) * (x0 - p) / (s_sum + h_.eps)))
                for g, _, p, x0 in filter(None, active)
            ]
        )
        betas = jnp.asarray([1.0 - 0.1**i for i in range(1, self.num_betas + 1)], dtype)
        clipped = jnp.clip(h, -state.m, state.m)
        m = jnp.maximum(betas * state.m, jnp.abs(h) + h_.eps)
        v = betas**2 * state.v + h**2
        r = betas * state.r + clipped * state.s
        wealth = (self.s_init / self.num_betas) * m + jnp.maximum(r, 0.0)
        s = (wealth / (jnp.sqrt(v) + h_.eps)).astype(dtype)
        new_s_sum = jnp.sum(s)

        new_updates, new_x0 = [], []
        for a, old_x0 in zip(active, x0_leaves):
            if a is None:
                new_updates.append(None)
                new_x0.append(old_x0)
                continue
            _, u_, p_, x0_ = a
            delta = (x0_ - p_) / (s_sum + h_.eps) - u_
            new_updates.append(x0_ - new_s_sum * delta - p_)
            new_x0.append(x0_.astype(old_x0.dtype))
        return treedef.unflatten(new_updates), MechanicState(
            step=increment(state.step),
            r=r.astype(dtype),
            m=m.astype(dtype),
            v=v.astype(dtype),
            s=s,
            x0=treedef.unflatten(new_x0),
            inner=inner_state,
        )
