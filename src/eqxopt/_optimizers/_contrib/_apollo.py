"""APOLLO and APOLLO-Mini (Zhu et al., 2025): an SGD step on each matrix, scaled
channel by channel (or as a whole) by the ratio that Adam's update has to the
gradient in a small random projection of it."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree, UInt32

from ..._core import _shards
from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import static_count
from ..._core._fields import (
    DTypeLike,
    MaskLike,
    ScalarOrSchedule,
    checked_field,
    choice_field,
    count_field,
    dtype_field,
    flag_field,
    hyper,
    learning_rate_field,
    mask_field,
    values_at,
    weight_decay_field,
)
from ..._core._keys import key_data
from ..._core._masks import decay_flags
from ..._core._param_sharding import split_like
from ..._core._real import RealOnly
from ..._core._tree import (
    align_grads,
    compute_dtype,
    full_like_leaf,
    increment,
    is_float_leaf,
    zero_step,
)
from ._low_rank import low_rank_zeros, matrix_plan

# As the authors' code: added to the norms the ratios divide by.
_TINY = 1e-8


def _projection(key: Array, p: Any, right: bool, r: int) -> Array:
    """A Gaussian random projection with entries of variance `1 / r`, as the
    authors draw it."""
    m, n = p.shape
    shape = (r, n) if right else (m, r)
    dtype = compute_dtype(p.dtype)
    return jax.random.normal(key, shape, dtype) / jnp.sqrt(jnp.asarray(r, dtype))


class APOLLOState(eqx.Module):
    """State of `APOLLO` and `APOLLOMini`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`, `nu`: Adam's moments: for a matrix of shape `(m, n)`, of its projected
      gradient (`(m, r)` when `m >= n`, else `(r, n)`); shaped like the parameter
      for every other leaf; `None` at non-float leaves.
    - `projection`: for each matrix, its random projection (`(r, n)` or `(m, r)`,
      in at least float32); `None` at every other leaf.
    - `scaled_norm`: for each matrix, the norm of its last scaled gradient (the
      norm-growth limiter's memory), `-1` before its first step; `None` at every
      other leaf.
    - `key`: the PRNG key the projections are drawn from, as raw `uint32` key data.
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]
    projection: PyTree[Float[Array, "_ _"] | None]
    scaled_norm: PyTree[Float[Array, ""] | None]
    key: UInt32[Array, "..."]


class AbstractAPOLLO(AbstractTransform):
    """What `APOLLO` and `APOLLOMini` share: the rule, written once; the two differ
    only in their fields' defaults (and APOLLO-Mini's rank and scaling are fixed)."""

    reads_params = None  # the parameters are not read (`params_needed`)
    real_only = RealOnly("its projection transposes", trees=("params", "grads"))

    learning_rate: eqx.AbstractVar[Any]
    rank: eqx.AbstractVar[int]
    scale_type: eqx.AbstractVar[str]
    update_proj_gap: eqx.AbstractVar[Any]
    scale: eqx.AbstractVar[Any]
    b1: eqx.AbstractVar[Any]
    b2: eqx.AbstractVar[Any]
    eps: eqx.AbstractVar[Any]
    weight_decay: eqx.AbstractVar[Any]
    mask: eqx.AbstractVar[Any]
    norm_growth_limit: eqx.AbstractVar[Any]
    scale_front: eqx.AbstractVar[bool]
    mu_dtype: eqx.AbstractVar[Any]
    nu_dtype: eqx.AbstractVar[Any]
    key: eqx.AbstractVar[Any]
    key_impl: eqx.AbstractVar[str]

    def _key(self, key: Array, drawn_at: Any, index: int) -> Array:
        key = jax.random.wrap_key_data(key, impl=self.key_impl)
        return jax.random.fold_in(jax.random.fold_in(key, drawn_at), index)

    def init(self, params: Params) -> APOLLOState:
        decay_flags(self.mask, params)  # a bad mask fails here
        leaves, treedef = jax.tree.flatten(params)
        mu, nu, projection, scaled = [], [], [], []
        for i, p in enumerate(leaves):
            plan = matrix_plan(p, self.rank)
            if not is_float_leaf(p):
                mu.append(None)
                nu.append(None)
                projection.append(None)
                scaled.append(None)
                continue
            if plan is None:
                mu.append(full_like_leaf(p, 0.0, self.mu_dtype))
                nu.append(full_like_leaf(p, 0.0, self.nu_dtype))
                projection.append(None)
                scaled.append(None)
                continue
            # From the right (`R = G P^T`, one scale per row) where the rows are
            # the long side, else from the left (`R = P^T G`, one per column).
            right, r = plan
            mu.append(low_rank_zeros(p, right, r, self.mu_dtype))
            nu.append(low_rank_zeros(p, right, r, self.nu_dtype))
            drawn = _projection(self._key(self.key, 0, i), p, right, r)
            projection.append(split_like(drawn, p, (None, 1) if right else (0, None)))
            scaled.append(jnp.full((), -1.0, jnp.float32))
        return APOLLOState(
            step=zero_step(),
            mu=treedef.unflatten(mu),
            nu=treedef.unflatten(nu),
            projection=treedef.unflatten(projection),
            scaled_norm=treedef.unflatten(scaled),
            key=jnp.array(self.key, copy=True),
        )

    def transform(
        self, grads: Grads, state: APOLLOState, params: Params
    ) -> tuple[Updates, APOLLOState]:
        h = values_at(self, state.step)
        t = increment(state.step)
        t_ = t.astype(jnp.float32)
        step_size = h.learning_rate * jnp.sqrt(1 - h.b2**t_) / (1 - h.b1**t_)
        # New projections every `update_proj_gap` steps (the first from `init`).
        redraw = (state.step > 0) & (state.step % self.update_proj_gap == 0)
        sqrt_scale = jnp.sqrt(h.scale)
        param_leaves, treedef = jax.tree.flatten(params)
        columns = [
            align_grads(grads, params),
            treedef.flatten_up_to(state.mu),
            treedef.flatten_up_to(state.nu),
            treedef.flatten_up_to(state.projection),
            treedef.flatten_up_to(state.scaled_norm),
        ]
        flags = decay_flags(self.mask, params)
        updates, new_mu, new_nu, new_proj, new_scaled = [], [], [], [], []
        for i, (p, g, mu, nu, proj, prev, decayed) in enumerate(
            zip(param_leaves, *columns, flags)
        ):
            if g is None or not is_float_leaf(p):
                updates.append(None)
                new_mu.append(mu)
                new_nu.append(nu)
                new_proj.append(proj)
                new_scaled.append(prev)
                continue
            dtype = compute_dtype(p.dtype)
            g_ = g.astype(dtype)
            plan = matrix_plan(p, self.rank)
            if plan is None:
                low = g_
            else:
                right, r = plan

                def fresh(i=i, p=p, right=right, r=r, proj=proj):
                    key = self._key(state.key, state.step, i)
                    return _projection(key, p, right, r).astype(proj.dtype)

                proj = _shards.cond(redraw, fresh, lambda proj=proj: proj)
                proj_ = proj.astype(dtype)
                low = g_ @ proj_.T if right else proj_.T @ g_
            m_ = h.b1 * mu.astype(dtype) + (1 - h.b1) * low
            v_ = h.b2 * nu.astype(dtype) + (1 - h.b2) * low * low
            direction = m_ / (jnp.sqrt(v_) + h.eps)
            if plan is not None:
                right, _ = plan
                if self.scale_type == "channel":
                    # One scale per row (right) or column (left) of the matrix.
                    axis = 1 if right else 0
                    ratio = jnp.linalg.norm(direction, axis=axis, keepdims=True) / (
                        jnp.linalg.norm(low, axis=axis, keepdims=True) + _TINY
                    )
                else:
                    ratio = jnp.linalg.norm(direction) / (jnp.linalg.norm(low) + _TINY)
                scaled = g_ * ratio
                if self.scale_front:
                    scaled = scaled * sqrt_scale
                norm = jnp.linalg.norm(scaled)
                if self.norm_growth_limit is not None:
                    gamma = h.norm_growth_limit
                    limiter = jnp.where(
                        prev < 0,
                        jnp.ones((), dtype),
                        jnp.maximum(norm / (prev + _TINY), gamma) / gamma,
                    )
                    scaled = scaled / limiter
                    norm = norm / limiter
                if not self.scale_front:
                    scaled = scaled * sqrt_scale
                direction = scaled
                prev = norm.astype(prev.dtype)
            u = -step_size * direction
            if decayed:
                # As the authors: the stepped parameter times 1 - lr * decay.
                u = u - h.learning_rate * h.weight_decay * (p.astype(dtype) + u)
            updates.append(u)
            new_mu.append(m_.astype(mu.dtype))
            new_nu.append(v_.astype(nu.dtype))
            new_proj.append(proj)
            new_scaled.append(prev)
        return treedef.unflatten(updates), APOLLOState(
            step=t,
            mu=treedef.unflatten(new_mu),
            nu=treedef.unflatten(new_nu),
            projection=treedef.unflatten(new_proj),
            scaled_norm=treedef.unflatten(new_scaled),
            key=state.key,
        )


class APOLLO(AbstractAPOLLO):
    r"""APOLLO (Zhu et al., 2025, "APOLLO: SGD-like Memory, AdamW-level
    Performance", arXiv:2412.05270): each matrix takes a step along its own
    gradient, scaled per channel by how much Adam would rescale that channel,
    which Adam's moments kept for a rank-`r` random projection of the gradient
    estimate. The moments take `2 r` numbers per row (or column) instead of
    Adam's two per element, and the projection needs no SVD (unlike GaLore's).

    For a matrix `G` of shape `(m, n)` (the gradient of a 2-D parameter), with a
    random projection `P` whose entries are drawn from $N(0, 1/r)$ (shape `(r, n)`
    when $m \geq n$, projecting each row; else `(m, r)`, projecting each column),
    redrawn every `update_proj_gap` steps, and $t$ the step count after this
    update:

    $$
    \begin{aligned}
    R_t &= G_t P^\top \quad (\text{or } P^\top G_t) \\
    M_t &= \beta_1 M_{t-1} + (1 - \beta_1) R_t, \qquad
    V_t = \beta_2 V_{t-1} + (1 - \beta_2) R_t^2 \\
    s_j &= \frac{\lVert (M_t / (\sqrt{V_t} + \epsilon))_j \rVert}
        {\lVert (R_t)_j \rVert + 10^{-8}}
        \quad \text{(channel $j$: a row, or a column; tensor-wise: one $s$)} \\
    \tilde G_t &= G_t \operatorname{diag}(s) \ \text{(rows: } \operatorname{diag}(s)
        G_t\text{)}, \qquad
    \tilde G_t \leftarrow \tilde G_t \,/\, \max\!\left(\frac{\lVert \tilde G_t
        \rVert}{\gamma \lVert \tilde G_{t-1} \rVert}, 1\right) \\
    p_t &= \left(p_{t-1} - \eta \frac{\sqrt{1 - \beta_2^t}}{1 - \beta_1^t}
        \sqrt{\alpha}\, \tilde G_t\right) (1 - \eta \lambda)
    \end{aligned}
    $$

    where $\alpha$ is `scale`, $\gamma$ the norm-growth limit (Fira's limiter; the
    first step is not limited) and $\lambda$ the weight decay (applied, as the
    authors do, to the stepped parameter, at the leaves `mask` selects). Every
    other leaf (vectors, scalars, 3-D and 4-D arrays) gets Adam in the same form:
    $p_t = (p_{t-1} - \eta \frac{\sqrt{1 - \beta_2^t}}{1 - \beta_1^t}
    \frac{m_t}{\sqrt{v_t} + \epsilon})(1 - \eta\lambda)$.

    The update of a matrix is its full gradient scaled (the authors' code,
    `apollo_torch`); pytorch-optimizer 4.1.0's `APOLLO` instead projects the
    scaled projected gradient back through `P` (with `scale` applied as
    $\alpha^{3/2}$), which is the same step only where `P` is square and
    orthogonal (tested so), and decays with the bias-corrected step size rather
    than $\eta$. Real parameters only. On a mesh, each matrix's projection and
    low-rank moments are split over the mesh axes that split the matrix, as
    `GaLore`'s are.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `rank`: the rank `r` of the projection, an int `>= 1` (capped at each
      matrix's smaller side; the authors use a quarter of the model's width).
    - `scale_type`: `"channel"` (one scale per row or column) or `"tensor"`
      (one per matrix, as APOLLO-Mini).
    - `update_proj_gap`: steps between new projections, an int `>= 1` (an array
      field: a new value does not recompile).
    - `scale`: $\alpha$, the update of matrices is multiplied by
      $\sqrt{\alpha}$ (it makes up for the norms of a low-rank projection
      being smaller; the authors try 1 to 3 for APOLLO, 128 for APOLLO-Mini).
    - `b1`, `b2`: decays of the first and second moment, in `[0, 1)`.
    - `eps`: added to the root of the second moment, `>= 0`.
    - `weight_decay`: decoupled decay, `>= 0`.
    - `mask`: which leaves decay: `None` (all), a tree of bools (or a prefix of
      params' structure), or a function of params returning one.
    - `norm_growth_limit`: $\gamma \geq 1$: a matrix's scaled gradient may grow
      by at most this factor per step; `None` turns the limiter off.
    - `scale_front`: apply $\sqrt{\alpha}$ before the limiter rather than after
      (the authors' `--scale_front`, for runs with few warm-up steps).
    - `mu_dtype`, `nu_dtype`: dtypes to store the moments in; `None` keeps each
      parameter's dtype.
    - `key`: keyword-only: an integer seed or a JAX PRNG key the projections are
      drawn from (each leaf's from its index and the step).

    **Example:**

    ```python
    import jax
    import jax.numpy as jnp
    import eqxopt

    w = jax.random.normal(jax.random.key(0), (64, 32))
    params = {"w": w, "b": jnp.zeros(32)}
    opt = eqxopt.APOLLO(1e-2, rank=8)
    state = opt.init(params)
    assert state.mu["w"].shape == (64, 8)  # low-rank moments for the matrix
    grads = jax.tree.map(jnp.ones_like, params)
    params, state = opt.step(grads, state, params)
    ```
    """

    learning_rate: ScalarOrSchedule = learning_rate_field()
    rank: int = checked_field(static_count, 128, static=True)
    scale_type: str = choice_field("channel", ("channel", "tensor"))
    update_proj_gap: Int[Array, ""] = count_field(200, kw_only=True)
    scale: ScalarOrSchedule = hyper(1.0, low=0.0, low_open=True, kw_only=True)
    b1: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True, kw_only=True)
    b2: ScalarOrSchedule = hyper(0.999, low=0.0, high=1.0, high_open=True, kw_only=True)
    eps: ScalarOrSchedule = hyper(1e-6, low=0.0, kw_only=True)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    mask: MaskLike = mask_field()
    norm_growth_limit: ScalarOrSchedule = hyper(
        1.01, low=1.0, optional=True, kw_only=True
    )
    scale_front: bool = flag_field(False)
    mu_dtype: DTypeLike = dtype_field()
    nu_dtype: DTypeLike = dtype_field()
    key: UInt32[Array, "..."] = eqx.field(default=0, kw_only=True)
    key_impl: str = eqx.field(static=True, init=False)

    def __post_init__(self):
        self.key, self.key_impl = key_data("key", self.key)


class APOLLOMini(AbstractAPOLLO):
    r"""APOLLO-Mini (Zhu et al., 2025, arXiv:2412.05270): `APOLLO` with a rank-1
    projection and one scale per matrix, so its state for a matrix of shape
    `(m, n)` is two vectors of `max(m, n)` numbers and a projection of
    `min(m, n)`: SGD's memory, not Adam's.

    Its rule is `APOLLO`'s (see the formula there) with the rank fixed at $r = 1$
    and one scale per matrix (`APOLLO`'s `scale_type="tensor"`), from the whole
    projected gradient $R_t$ rather than channel by channel:

    $$
    s = \frac{\lVert M_t / (\sqrt{V_t} + \epsilon) \rVert}{\lVert R_t \rVert + 10^{-8}},
    \qquad \tilde G_t = s\, G_t
    $$

    Of the options the two share, only the default of `scale` differs.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `update_proj_gap`: steps between new projections, an int `>= 1`.
    - `scale`: $\alpha$ (128 by default, as the authors: the update is
      multiplied by $\sqrt{128}$).
    - `b1`, `b2`, `eps`, `weight_decay`, `mask`, `norm_growth_limit`,
      `scale_front`, `mu_dtype`, `nu_dtype`, `key`: as `APOLLO`'s.
    """

    learning_rate: ScalarOrSchedule = learning_rate_field()
    update_proj_gap: Int[Array, ""] = count_field(200, kw_only=True)
    scale: ScalarOrSchedule = hyper(128.0, low=0.0, low_open=True, kw_only=True)
    b1: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True, kw_only=True)
    b2: ScalarOrSchedule = hyper(0.999, low=0.0, high=1.0, high_open=True, kw_only=True)
    eps: ScalarOrSchedule = hyper(1e-6, low=0.0, kw_only=True)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    mask: MaskLike = mask_field()
    norm_growth_limit: ScalarOrSchedule = hyper(
        1.01, low=1.0, optional=True, kw_only=True
    )
    scale_front: bool = flag_field(False)
    mu_dtype: DTypeLike = dtype_field()
    nu_dtype: DTypeLike = dtype_field()
    key: UInt32[Array, "..."] = eqx.field(default=0, kw_only=True)
    key_impl: str = eqx.field(static=True, init=False)
    rank = 1
    scale_type = "tensor"

    def __post_init__(self):
        self.key, self.key_impl = key_data("key", self.key)
