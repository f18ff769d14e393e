"""KL-Shampoo: Shampoo's Kronecker factors fitted by a KL-divergence criterion,
applied through their eigenbases (Lin et al., 2025)."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core import _shards
from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import array_count, static_count
from ..._core._fields import (
    ScalarOrSchedule,
    axis_name_field,
    checked_field,
    flag_field,
    hyper,
    learning_rate_field,
    param_specs_field,
    values_at,
    weight_decay_field,
)
from ..._core._param_sharding import split_like
from ..._core._real import RealOnly
from ..._core._round_robin import map_round_robin, work_mesh
from ..._core._shards import AxisName, Layout, global_shape, leaf_layouts
from ..._core._structure import FrozenTree
from ..._core._tree import (
    align_grads,
    compute_dtype,
    float_leaves_like,
    increment,
    is_float_leaf,
    step_power,
    zero_step,
)
from ._soap import (
    _gathering,
    _kl_statistics,
    _like_inputs,
    _outer,
    _project,
    _project_back,
    _refreshed,
)

_WHY = "its Kronecker factors and their eigenbases are real"


class KLShampooState(eqx.Module):
    """State of `KLShampoo`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done (the first one changes
      nothing, as heavyball's).
    - `mu`: the exponential average of the gradients, shaped like params.
    - `gg`: the Kronecker factors: for each float leaf a tuple with, per axis of
      size `1 < d <= max_precond_dim`, a `(d, d)` matrix (float32 or wider), or
      `None` for an axis that is not preconditioned. `None` at non-float leaves.
    - `q`: the factors' eigenbases, shaped as `gg`.
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    gg: PyTree[Any]
    q: PyTree[Any]


class KLShampoo(AbstractTransform):
    r"""KL-Shampoo (Lin et al., 2025, "Understanding and Improving Shampoo and SOAP
    via Kullback-Leibler Minimization"), as heavyball 3.2.1's `KLShampoo`:
    Shampoo's Kronecker factors fitted by a KL-divergence criterion (each side's
    update weighs the gradient by the other side's inverse), and applied through
    their eigenbases $Q_i$, refreshed by one power-iteration step and a QR, with
    their eigenvalues $d_i$ estimated in those bases. No grafting and no Adam: the
    factors' own scale sets the step's.

    For a leaf $G$ with axes $i$ of size $1 < d_i \le$ `max_precond_dim` (1-D
    leaves only if `precondition_1d`), the factor $F_i$ starts at
    `init_factor` $\cdot I$ and $Q_i$ at $I$. The first update only counts (as
    heavyball's, whose first step builds the state). Then, with $k \ge 1$ the
    number of updates before this one, $\beta_1$ = `b1`, $\beta$ = `shampoo_beta`,
    $\times_i$ the product along axis $i$, and `lr`, `wd` the learning rate and
    weight decay at the step:

    $$
    \begin{aligned}
    \mu &\leftarrow \beta_1 \mu + (1 - \beta_1)\, G \\
    d_i &= \max\left(\operatorname{diag}(Q_i^\top F_i Q_i), \epsilon\right) \\
    U &= \Big(\big(\mu \times_i Q_i^\top\big)
        \textstyle\prod_i \operatorname{diag}(d_i)^{-1/2}\Big) \times_i Q_i \\
    p &\leftarrow p - \mathrm{lr}\, U - \mathrm{lr} \cdot \mathrm{wd} \cdot p \\
    s &= 1 - (1 - \beta) / (1 - \beta^{k + 1}) \\
    F_1 &\leftarrow s F_1 + \tfrac{1 - s}{n}\, (G Q_2)
        \operatorname{diag}(d_2)^{-1} (G Q_2)^\top
        && \text{(a matrix, $m \times n$, both axes preconditioned)} \\
    F_2 &\leftarrow s F_2 + \tfrac{1 - s}{m}\, (G^\top Q_1)
        \operatorname{diag}(d_1)^{-1} (G^\top Q_1)^\top \\
    F_i &\leftarrow s F_i + (1 - s)\, G_{(i)} G_{(i)}^\top
        && \text{(any other leaf)} \\
    Q_i &\leftarrow \operatorname{qr}(F_i Q_i)
        && \text{(if $(k + 1) \bmod$ precondition\_frequency $= 0$)} \\
    F_i &\leftarrow F_i \cdot g / \max|F_i|
        && \text{($g$: geometric mean of the leaf's $\max|F_j|$)}
    \end{aligned}
    $$

    ($Q_i$'s columns are sorted by $\operatorname{diag}(Q_i^\top F_i Q_i)$
    before the QR. The last line, for a leaf with two factors or more, keeps
    their scales together and changes neither the preconditioner nor the next
    update.)

    A leaf with no preconditioned axis gets `p - lr * mu` (and the decay).
    heavyball also adds random normal noise, scaled by `dampening + 2**-23 * |G|`
    (`dampening=1e-9` by default), to the gradient that fits the factors, and
    lifts each QR's input by `eps` times its largest eigenvalue; neither is done
    here.

    On a mesh (Explicit or Auto axes) and inside `jax.shard_map` with
    `axis_name`, a split leaf is handled as by `SOAP`: its factors and bases
    split like it, its gradient, value and momentum gathered where a step uses
    them, each QR on one device in turn; the same numbers as on one device.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: decay of the gradient average, in `[0, 1)`.
    - `shampoo_beta`: decay of the factors, in `[0, 1)`.
    - `eps`: floor of the factors' estimated eigenvalues, `> 0`.
    - `weight_decay`: decoupled decay coefficient, `>= 0`.
    - `init_factor`: the factors' start, `init_factor * I`, `> 0`.
    - `precondition_frequency`: refresh the eigenbases every this many steps
      (an int `>= 1`; an array field, so changing it does not recompile).
    - `max_precond_dim`: axes longer than this are not preconditioned (static
      int).
    - `precondition_1d`: also precondition 1-D leaves (static bool).
    - `axis_name`, `param_specs`: inside `jax.shard_map`, as `SOAP`'s.
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule = learning_rate_field(3e-3)
    b1: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True)
    shampoo_beta: ScalarOrSchedule = hyper(0.95, low=0.0, high=1.0, high_open=True)
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0, low_open=True)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.01, kw_only=False)
    init_factor: ScalarOrSchedule = hyper(0.1, low=0.0, low_open=True)
    precondition_frequency: Int[Array, ""] = checked_field(array_count, 2)
    # Static: they decide the shapes of the state.
    max_precond_dim: int = checked_field(static_count, 2048, static=True, kw_only=True)
    precondition_1d: bool = flag_field(False)
    axis_name: AxisName = axis_name_field()
    param_specs: FrozenTree | None = param_specs_field()

    real_only = RealOnly(_WHY)

    def _axes(self, shape: tuple[int, ...]) -> list[bool]:
        if len(shape) == 1 and not self.precondition_1d:
            return [False]
        return [1 < d <= self.max_precond_dim for d in shape]

    def _layouts(self, params: Params) -> list[Layout | None]:
        return leaf_layouts(params, self.axis_name, "KLShampoo", self.param_specs)

    def init(self, params: Params) -> KLShampooState:
        h = values_at(self, zero_step())

        def matrices(p, layout, eye):
            if not is_float_leaf(p):
                return None
            dtype = compute_dtype(p.dtype)
            shape = global_shape(p, layout)
            scale = 1.0 if eye else h.init_factor.astype(dtype)
            return tuple(
                split_like(scale * jnp.eye(d, dtype=dtype), p, (i, None))
                if on
                else None
                for i, (d, on) in enumerate(zip(shape, self._axes(shape)))
            )

        leaves, treedef = jax.tree.flatten(params)
        layouts = self._layouts(params)
        return KLShampooState(
            step=zero_step(),
            mu=float_leaves_like(params),
            gg=treedef.unflatten(
                [matrices(p, lay, False) for p, lay in zip(leaves, layouts)]
            ),
            q=treedef.unflatten(
                [matrices(p, lay, True) for p, lay in zip(leaves, layouts)]
            ),
        )

    def transform(
        self, grads: Grads, state: KLShampooState, params: Params
    ) -> tuple[Updates, KLShampooState]:
        h = values_at(self, state.step)
        lr, b1, eps, wd = h.learning_rate, h.b1, h.eps, h.weight_decay
        k = state.step
        sb = 1 - (1 - h.shampoo_beta) / (1 - step_power(h.shampoo_beta, k + 1))
        refresh = (k > 0) & (((k + 1) % self.precondition_frequency) == 0)

        def first(g, p, mu, gg, q):
            return jnp.zeros_like(p), mu, gg

        def later(g, p, mu, gg, q):
            mu = b1 * mu + (1 - b1) * g
            x = _project(mu, q)
            for i, (f, b) in enumerate(zip(gg, q)):
                if f is not None:
                    d = jnp.maximum(jnp.einsum("ji,jk,ki->i", b, f, b), eps)
                    shape = [1] * x.ndim
                    shape[i] = -1
                    x = x * jax.lax.rsqrt(d).reshape(shape)
            u = -lr * _project_back(x, q) - lr * wd * p
            if g.ndim == 2 and None not in gg:
                return u, mu, _kl_statistics(g, gg, q, sb, eps)
            gg = tuple(
                None if f is None else sb * f + (1 - sb) * _outer(g, i)
                for i, f in enumerate(gg)
            )
            return u, mu, gg

        param_leaves, param_def = jax.tree.flatten(params)
        grad_leaves = align_grads(grads, params)
        mu_leaves = param_def.flatten_up_to(state.mu)
        gg_leaves = param_def.flatten_up_to(state.gg)
        q_leaves = param_def.flatten_up_to(state.q)
        layouts = self._layouts(params)
        out: list[list[Any]] = [[], [], [], []]
        stepped = []
        for g, p, mu, gg, q, layout in zip(
            grad_leaves, param_leaves, mu_leaves, gg_leaves, q_leaves, layouts
        ):
            if g is None or not is_float_leaf(p):
                for column, value in zip(out, (None, mu, gg, q)):
                    column.append(value)
                continue
            dtype = compute_dtype(p.dtype)
            whole, back = _gathering(p, layout, self._axes(global_shape(p, layout)))
            u, new_mu, new_gg = _shards.cond(
                k == 0,
                _like_inputs(first, skip=1),
                _like_inputs(later, skip=1),
                whole(g.astype(dtype)),
                whole(p.astype(dtype)),
                whole(mu.astype(dtype)),
                gg,
                q,
            )
            stepped.append(len(out[0]))
            out[0].append(back(u))
            out[1].append(back(new_mu.astype(mu.dtype)))
            out[2].append(new_gg)
            out[3].append(q)

        def matrices(column):
            return [m for place in stepped for m in out[column][place] if m is not None]

        def per_leaf(found):
            found = iter(found)
            return {
                place: tuple(None if m is None else next(found) for m in out[2][place])
                for place in stepped
            }

        mesh = work_mesh((grads, params))

        def refreshed(statistics, bases):
            found = map_round_robin(
                lambda pair: _refreshed(*pair)[0],
                [(m[None], b[None]) for m, b in zip(statistics, bases)],
                mesh,
            )
            return [q[0].astype(b.dtype) for q, b in zip(found, bases)]

        new_bases = per_leaf(
            _shards.cond(refresh, refreshed, lambda s, b: b, matrices(2), matrices(3))
        )
        for place in stepped:
            out[3][place] = new_bases[place]
            out[2][place] = _balanced(out[2][place])
        updates, mu, gg, q = (param_def.unflatten(column) for column in out)
        return updates, KLShampooState(step=increment(state.step), mu=mu, gg=gg, q=q)


def _balanced(gg: tuple[Array | None, ...]) -> tuple[Array | None, ...]:
    """A leaf's factors rescaled to a common largest entry (the geometric mean of
    theirs; their Kronecker product unchanged), as heavyball's `psgd_balance_Q`."""
    factors = [f for f in gg if f is not None]
    if len(factors) < 2:
        return gg
    logs = [jnp.log(jnp.max(jnp.abs(f))) for f in factors]
    mean = sum(logs) / len(logs)
    scales = iter(jnp.exp(mean - log) for log in logs)
    return tuple(None if f is None else f * next(scales) for f in gg)
