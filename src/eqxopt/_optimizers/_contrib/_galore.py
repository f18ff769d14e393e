"""GaLore (Zhao et al., 2024): Adam on a low-rank projection of each matrix's
gradient (`optax.contrib.galore`)."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core import _shards
from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import static_count
from ..._core._fields import (
    DTypeLike,
    MaskLike,
    ScalarOrSchedule,
    checked_field,
    count_field,
    dtype_field,
    hyper,
    learning_rate_field,
    mask_field,
    values_at,
    weight_decay_field,
)
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


class GaLoreState(eqx.Module):
    """State of `GaLore`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`, `nu`: Adam's moments: for a matrix of shape `(m, n)`, of the projected
      gradient (`(r, n)` when `m >= n`, else `(m, r)`, with `r = min(rank, m, n)`);
      shaped like the parameter for every other leaf; `None` at non-float leaves.
    - `projector`: for each matrix, its orthonormal projector (`(m, r)` or
      `(n, r)`, in at least float32); `None` at every other leaf.
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]
    projector: PyTree[Float[Array, "_ _"] | None]


class GaLore(AbstractTransform):
    """GaLore (Zhao et al., 2024, "GaLore: Memory-Efficient LLM Training by
    Gradient Low-Rank Projection"): Adam whose moments live in a rank-`r` subspace
    of each matrix's gradient, refreshed from the gradient's SVD every
    `update_proj_gap` steps.

    For a matrix `G` of shape `(m, n)` with `m >= n` (else the same from the right,
    with `P` from `V`), `r = min(rank, m, n)` and `t = step + 1`:

    ```
    P  = U[:, :r]  where G = U S V^T         (at steps 0, k, 2k, ...; else kept)
    R  = P^T G
    mu = b1 * mu + (1 - b1) * R;   nu = b2 * nu + (1 - b2) * R**2
    N  = (mu / (1 - b1**t)) / (sqrt(nu / (1 - b2**t)) + eps)
    p  = p - lr * (scale * P N + weight_decay * p)     (decay only where `mask`)
    ```

    Leaves that are not matrices (vectors, scalars, 3-D arrays) get plain Adam
    (`p = p - lr * (N + weight_decay * p)` with `R = G`, no `scale`). The moments
    are kept when the projector is refreshed, as in the paper and optax. The same
    as `optax.contrib.galore` with its default base optimizer (`scale_by_adam`)
    and default dimension numbers (every 2-D leaf projected). The SVD runs in at
    least float32. Real parameters only (the projection uses transposes, not
    conjugate transposes, as optax does). On a mesh, a matrix split over mesh
    axes has its projector and low-rank moments split over the same axes (each
    along a dimension they divide), so each device holds about `1/N` of them; a
    step gathers them where the projection needs them whole (within the step
    only).

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `rank`: the rank `r` of the projection, an int `>= 1` (capped at each
      matrix's smaller side).
    - `update_proj_gap`: steps between refreshes of the projectors, an int `>= 1`
      (an array field: a new value does not recompile).
    - `scale`: the factor on the projected-back update of matrices.
    - `b1`: decay of the first moment, in `[0, 1)`.
    - `b2`: decay of the second moment, in `[0, 1)`.
    - `eps`: added to the root of the second moment, `>= 0`.
    - `weight_decay`: decoupled decay coefficient, `>= 0` (applied in the full
      parameter space).
    - `mask`: which leaves get weight decay: `None` (all), a tree of bools (or a
      prefix of params' structure), or a function of params returning one.
    - `mu_dtype`: dtype to store `mu` in; `None` keeps each parameter's dtype.
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule = learning_rate_field()
    rank: int = checked_field(static_count, 128, static=True)
    update_proj_gap: Int[Array, ""] = count_field(200)
    scale: ScalarOrSchedule = hyper(1.0)
    b1: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True, kw_only=True)
    b2: ScalarOrSchedule = hyper(0.999, low=0.0, high=1.0, high_open=True, kw_only=True)
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0, kw_only=True)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    mask: MaskLike = mask_field()
    mu_dtype: DTypeLike = dtype_field()

    real_only = RealOnly("its projection transposes", trees=("params", "grads"))

    def init(self, params: Params) -> GaLoreState:
        decay_flags(self.mask, params)  # a bad mask fails here

        def moment(p, dtype):
            plan = matrix_plan(p, self.rank)
            if not is_float_leaf(p):
                return None
            if plan is None:
                return full_like_leaf(p, 0.0, dtype)
            # From the left (`R = P^T G`) where the rows are the long side.
            left, r = plan
            return low_rank_zeros(p, not left, r, dtype)

        def projector(p):
            plan = matrix_plan(p, self.rank)
            if plan is None:
                return None
            left, r = plan
            rows = p.shape[0] if left else p.shape[1]
            dims = (0, None) if left else (1, None)  # its rows are p's rows or columns
            return split_like(jnp.zeros((rows, r), compute_dtype(p.dtype)), p, dims)

        return GaLoreState(
            step=zero_step(),
            mu=jax.tree.map(lambda p: moment(p, self.mu_dtype), params),
            nu=jax.tree.map(lambda p: moment(p, None), params),
            projector=jax.tree.map(projector, params),
        )

    def transform(
        self, grads: Grads, state: GaLoreState, params: Params
    ) -> tuple[Updates, GaLoreState]:
        h = values_at(self, state.step)
        t = increment(state.step)
        t_ = t.astype(jnp.float32)
        refresh = state.step % self.update_proj_gap == 0
        param_leaves, treedef = jax.tree.flatten(params)
        columns = [
            align_grads(grads, params),
            treedef.flatten_up_to(state.mu),
            treedef.flatten_up_to(state.nu),
            treedef.flatten_up_to(state.projector),
        ]
        flags = decay_flags(self.mask, params)
        updates, new_mu, new_nu, new_proj = [], [], [], []
        for p, g, mu, nu, proj, decayed in zip(param_leaves, *columns, flags):
            if g is None or not is_float_leaf(p):
                updates.append(None)
                new_mu.append(mu)
                new_nu.append(nu)
                new_proj.append(proj)
                continue
            dtype = compute_dtype(p.dtype)
            g_ = g.astype(dtype)
            plan = matrix_plan(p, self.rank)
            if plan is not None:
                left, r = plan

                def fresh(g_=g_, left=left, r=r):
                    u, _, vh = jnp.linalg.svd(g_, full_matrices=False)
                    return u[:, :r] if left else vh[:r, :].T

                proj_ = _shards.cond(refresh, fresh, lambda proj=proj: proj)
                low = proj_.T @ g_ if left else g_ @ proj_
            else:
                proj_, low = None, g_
            m_ = h.b1 * mu.astype(dtype) + (1 - h.b1) * low
            v_ = h.b2 * nu.astype(dtype) + (1 - h.b2) * low * low
            n_ = (m_ / (1 - h.b1**t_)) / (jnp.sqrt(v_ / (1 - h.b2**t_)) + h.eps)
            if plan is not None:
                assert proj_ is not None
                n_ = h.scale * (proj_ @ n_ if plan[0] else n_ @ proj_.T)
            if decayed:
                n_ = n_ + h.weight_decay * p.astype(dtype)
            updates.append(-h.learning_rate * n_)
            new_mu.append(m_.astype(mu.dtype))
            new_nu.append(v_.astype(nu.dtype))
            new_proj.append(proj_ if proj_ is None else proj_.astype(proj.dtype))
        return treedef.unflatten(updates), GaLoreState(
            step=t,
            mu=treedef.unflatten(new_mu),
            nu=treedef.unflatten(new_nu),
            projector=treedef.unflatten(new_proj),
        )
