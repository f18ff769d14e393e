"""SOAP: Adam in the eigenbasis of Shampoo's preconditioner (Vyas et al., 2024)."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from jaxtyping import Array, Float, Int, PyTree

from ..._core import _jax_api, _shards
from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import array_count, static_count
from ..._core._fields import (
    ScalarOrSchedule,
    axis_name_field,
    checked_field,
    choice_field,
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
from ..._core._shards import (
    AxisName,
    Layout,
    gather_whole,
    global_shape,
    leaf_layouts,
    local_block,
)
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

# One entry per axis of a parameter: a (d, d) matrix, or None for an axis that is
# not preconditioned (longer than max_precond_dim, or a 1-D leaf).
AxisMatrices = tuple[Float[Array, "d d"] | None, ...]


# Its eigenbases are of real symmetric G G^T statistics, as the authors' code.
_WHY = "its preconditioner eigenbases are real"


class SOAPState(eqx.Module):
    """State of `SOAP`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done (the first one only builds
      the preconditioner).
    - `mu`: first moment, in the rotated (eigen)basis, shaped like params.
    - `nu`: second moment, in the rotated basis, shaped like params.
    - `gg`: Shampoo's statistics: for each float leaf a tuple with, per axis of
      size `d`, the `(d, d)` exponential average of the gradient's outer products
      over the other axes (float32 or wider), or `None` for an axis that is not
      preconditioned. `None` at non-float leaves.
    - `q`: the eigenbases, shaped as `gg`.
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]
    gg: PyTree[Any]
    q: PyTree[Any]


def _axis_sizes_preconditioned(
    shape: tuple[int, ...], max_precond_dim: int, precondition_1d: bool
) -> list[bool]:
    if len(shape) == 1 and not precondition_1d:
        return [False]
    return [d <= max_precond_dim for d in shape]


def _outer(g: Array, axis: int) -> Array:
    others = [i for i in range(g.ndim) if i != axis]
    return jnp.tensordot(g, g.conj(), axes=(others, others))


def _project(x: Array, q: AxisMatrices) -> Array:
    """`x` rotated into the eigenbasis, axis by axis (`x x_i Q_i`)."""
    for m in q:
        x = jnp.moveaxis(x, 0, -1) if m is None else jnp.tensordot(x, m, axes=(0, 0))
    return x


def _project_back(x: Array, q: AxisMatrices) -> Array:
    for m in q:
        x = jnp.moveaxis(x, 0, -1) if m is None else jnp.tensordot(x, m, axes=(0, 1))
    return x


def _kl_statistics(
    g: Array, gg: tuple[Array, Array], q: tuple[Array, Array], beta: Array, eps: Array
) -> tuple[Array, Array]:
    """KL-Shampoo's two-sided update of a matrix's statistics `(L, R)` (Lin et al.,
    2025): each factor's new term is the gradient weighted by the inverse of the
    other factor, that inverse taken in the last eigenbasis `q` with the
    eigenvalues estimated as `diag(Q^T F Q)` and floored at `eps`, divided by the
    other side's size."""
    (lhs, rhs), (q_l, q_r) = gg, q
    m, n = g.shape
    d_l = jnp.maximum(jnp.einsum("ji,jk,ki->i", q_l, lhs, q_l), eps)
    d_r = jnp.maximum(jnp.einsum("ji,jk,ki->i", q_r, rhs, q_r), eps)
    a, b = g @ q_r, g.T @ q_l
    lhs = beta * lhs + (1 - beta) * (a / (n * d_r)) @ a.T
    rhs = beta * rhs + (1 - beta) * (b / (m * d_l)) @ b.T
    return lhs, rhs


def _eigenbasis(gg: Array) -> Array:
    """Eigenvectors of `gg`, by decreasing eigenvalue."""
    eye = jnp.eye(gg.shape[0], dtype=gg.dtype)
    _, vectors = jnp.linalg.eigh(gg + 1e-30 * eye)
    return vectors[:, ::-1]


class SOAP(AbstractTransform):
    """SOAP (Vyas et al., 2024, "SOAP: Improving and Stabilizing Shampoo using
    Adam"): Adam run in the eigenbasis of Shampoo's preconditioner, which is
    refreshed every `precondition_frequency` steps.

    For a leaf `G` with axes `i` of size `d_i <= max_precond_dim` (1-D leaves only
    if `precondition_1d`), `L_i` the exponential average (decay `shampoo_beta`) of
    `G`'s outer product over all other axes and `Q_i` its eigenvectors; `rot(X)`
    multiplies axis `i` of `X` by `Q_i^T` (axes without a `Q_i` are left alone),
    `unrot` by `Q_i`. The first update only builds `L_i` and `Q_i = eigh(L_i)`
    and changes no parameter (as the authors' code). Then, with `k = step` and
    `lr` the learning rate at `step`:

    ```
    G' = rot(G)
    mu = b1 * mu + (1 - b1) * G';   nu = b2 * nu + (1 - b2) * G'**2
    p  = p - lr * sqrt(1 - b2**k) / (1 - b1**k) * unrot(mu / (sqrt(nu) + eps))
    p  = p - lr * weight_decay * p          (after the step, as the authors' code)
    L_i = shampoo_beta * L_i + (1 - shampoo_beta) * G G^T (over the other axes)
    every precondition_frequency steps: sort Q_i's columns (and nu's axis i) by
        the estimated eigenvalues diag(Q_i^T L_i Q_i), then Q_i = qr(L_i Q_i).Q,
        and re-express mu in the new basis.
    ```

    With `factor_update="kl"` (KL-SOAP: Lin et al., 2025, "Understanding and
    Improving Shampoo and SOAP via Kullback-Leibler Minimization"), a matrix leaf
    `G` of shape `(m, n)` whose two axes are both preconditioned fits its
    statistics `L` (`m x m`) and `R` (`n x n`) by KL-Shampoo's two-sided fixed
    point instead: each side's new term is the gradient weighted by the inverse of
    the other side, that inverse taken in the last eigenbasis with the
    eigenvalues estimated from it, and the averages are bias-corrected (their
    scale now matters):

    ```
    d_L = max(diag(Q_L^T L Q_L), eps);   d_R = max(diag(Q_R^T R Q_R), eps)
    s   = 1 - (1 - shampoo_beta) / (1 - shampoo_beta**(k + 1))   (0 at the first)
    L   = s * L + (1 - s) / n * (G Q_R) diag(1 / d_R) (G Q_R)^T
    R   = s * R + (1 - s) / m * (G^T Q_L) diag(1 / d_L) (G^T Q_L)^T
    ```

    (both from the statistics and bases before the step; the first update, with
    no basis yet, takes `L = G G^T`, `R = G^T G`). Other leaves keep SOAP's
    statistics (bias-corrected too, which changes no eigenbasis), as heavyball's
    `KLSOAP` does; everything else is SOAP's. The first statistics of a
    non-square matrix are rank-deficient: the larger side's null-space
    eigenvalues are rounding noise, floored at `eps`, and their inverses weigh
    the other side's update. Keep `eps` above that noise (about `1e-7` times the
    largest eigenvalue in float32) where runs must agree to rounding.

    A leaf with no preconditioned axis (a scalar, a 1-D leaf, every axis too long)
    gets plain Adam. On a mesh (Explicit or Auto axes) a split leaf with a
    preconditioned axis has its gradient, value and moments gathered (once each
    a step on Explicit axes), and its update and moments keep its sharding. Its
    statistics and eigenbases are split over the axes that split it (each axis'
    matrices along their rows, the leaf's other axes along their columns), so each
    device holds about `1/N` of them; a step gathers them where it uses them
    (within the step only) and computes each eigendecomposition and refresh on
    one device, the devices taking the matrices of every leaf in turn, the
    results shared by collectives: the same numbers as on one device. optax
    has no SOAP (optax issue 1580); this follows the authors' reference PyTorch
    implementation without its `merge_dims` and `normalize_grads` options.

    Inside `jax.shard_map`, without `axis_name` each device runs SOAP on its own
    block of each leaf (its own statistics and eigenbases, of the block's shape):
    a different optimizer from the unsharded one. With `axis_name`, a split leaf
    with a preconditioned axis is gathered whole on every device (one all-reduce
    each of its gradient, value and moments a step), stepped as the unsharded
    run, and each device keeps its block of the update and moments; the
    statistics and eigenbases are those of the whole leaf, the same on every
    device.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: decay of the first moment, in `[0, 1)`.
    - `b2`: decay of the second moment, in `(0, 1)`.
    - `shampoo_beta`: decay of the statistics `L_i`, in `[0, 1)`; `None` uses `b2`.
    - `eps`: added to the root of the second moment, `> 0`.
    - `weight_decay`: decoupled decay coefficient, `>= 0`.
    - `precondition_frequency`: refresh the eigenbases every this many steps
      (an int `>= 1`; an array field, so changing it does not recompile).
    - `max_precond_dim`: axes longer than this are not rotated (static int).
    - `precondition_1d`: also rotate 1-D leaves (static bool).
    - `factor_update`: how matrices fit their statistics (static): `"shampoo"`
      (default), each side's exponential average of `G G^T`; `"kl"`, KL-Shampoo's
      two-sided fixed point (above), which makes this KL-SOAP.
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: step
      whole leaves, as the unsharded run (above). `None` (default): each device's
      blocks.
    - `param_specs`: with `axis_name`, the `jax.sharding.PartitionSpec` of each
      parameter leaf inside `shard_map` (what its `in_specs` say), or a pytree
      prefix of params of them, to say which dimension is split. `None`
      (default): a leaf that varies over a named axis is taken to be split along
      its leading dimension (FSDP's convention). A spec that disagrees with the
      axes a leaf varies over is an error naming the leaf.
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule = learning_rate_field(3e-3)
    b1: ScalarOrSchedule = hyper(0.95, low=0.0, high=1.0, high_open=True)
    b2: ScalarOrSchedule = hyper(0.95, low=0.0, high=1.0, low_open=True, high_open=True)
    shampoo_beta: ScalarOrSchedule | None = hyper(
        None, low=0.0, high=1.0, high_open=True, optional=True
    )
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0, low_open=True)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.01, kw_only=False)
    precondition_frequency: Int[Array, ""] = checked_field(array_count, 10)
    # Static: they decide the shapes of the state.
    max_precond_dim: int = checked_field(static_count, 10000, static=True, kw_only=True)
    precondition_1d: bool = flag_field(False)
    factor_update: str = choice_field("shampoo", ("shampoo", "kl"))
    axis_name: AxisName = axis_name_field()
    param_specs: FrozenTree | None = param_specs_field()

    real_only = RealOnly(_WHY)

    def _axes(self, shape: tuple[int, ...]) -> list[bool]:
        return _axis_sizes_preconditioned(
            shape, self.max_precond_dim, self.precondition_1d
        )

    def _layouts(self, params: Params) -> list[Layout | None]:
        return leaf_layouts(params, self.axis_name, "SOAP", self.param_specs)

    def init(self, params: Params) -> SOAPState:
        def matrices(p, layout):
            if not is_float_leaf(p):
                return None
            dtype = compute_dtype(p.dtype)
            shape = global_shape(p, layout)  # the whole leaf's, in shard_map
            # Axis i's matrices split like the parameter along their rows, and
            # over its other axes along their columns: `split_like`.
            return tuple(
                split_like(jnp.zeros((d, d), dtype), p, (i, None)) if on else None
                for i, (d, on) in enumerate(zip(shape, self._axes(shape)))
            )

        leaves, treedef = jax.tree.flatten(params)
        gg = treedef.unflatten(list(map(matrices, leaves, self._layouts(params))))
        return SOAPState(
            step=zero_step(),
            mu=float_leaves_like(params),
            nu=float_leaves_like(params),
            gg=gg,
            q=jax.tree.map(jnp.copy, gg),  # buffers of its own (donation)
        )

    def transform(
        self, grads: Grads, state: SOAPState, params: Params
    ) -> tuple[Updates, SOAPState]:
        h = values_at(self, state.step)
        lr, b1, b2, eps, wd = h.learning_rate, h.b1, h.b2, h.eps, h.weight_decay
        sb = b2 if h.shampoo_beta is None else h.shampoo_beta
        k = state.step
        kl = self.factor_update == "kl"
        if kl:  # the statistics are bias-corrected averages (their scale matters)
            sb = 1 - (1 - sb) / (1 - step_power(sb, k + 1))
        refresh = (k % self.precondition_frequency) == 0
        step_size = lr * jnp.sqrt(1 - step_power(b2, k)) / (1 - step_power(b1, k))

        def first(g, p, mu, nu, gg, q):
            # Only the statistics (their eigenbases come next); no parameter change.
            gg = tuple(
                None if m is None else (1 - sb) * _outer(g, i) for i, m in enumerate(gg)
            )
            return jnp.zeros_like(p), mu, nu, gg

        def later(g, p, mu, nu, gg, q):
            g_rot = _project(g, q)
            mu = b1 * mu + (1 - b1) * g_rot
            nu = b2 * nu + (1 - b2) * g_rot * g_rot
            stepped = p - step_size * _project_back(mu / (jnp.sqrt(nu) + eps), q)
            stepped = stepped - lr * wd * stepped
            mu_plain = _project_back(mu, q)
            if kl and g.ndim == 2 and None not in gg:
                return stepped - p, mu_plain, nu, _kl_statistics(g, gg, q, sb, eps)
            gg = tuple(
                None if m is None else sb * m + (1 - sb) * _outer(g, i)
                for i, m in enumerate(gg)
            )
            return stepped - p, mu_plain, nu, gg

        def rotated(mu, nu, q, orders):
            # After a refresh: nu's entries follow their sorted eigenvectors, and
            # the first moment (`mu`, unrotated) is expressed in the new basis.
            def sort(nu):
                for i, order in enumerate(orders):
                    nu = nu if order is None else jnp.take(nu, order, axis=i)
                return nu

            nu = _shards.cond(refresh, sort, lambda nu: nu, nu)
            return _project(mu, q), nu

        param_leaves, param_def = jax.tree.flatten(params)
        grad_leaves = align_grads(grads, params)
        mu_leaves = param_def.flatten_up_to(state.mu)
        nu_leaves = param_def.flatten_up_to(state.nu)
        gg_leaves = param_def.flatten_up_to(state.gg)
        q_leaves = param_def.flatten_up_to(state.q)
        layouts = self._layouts(params)
        out: list[list[Any]] = [[], [], [], [], []]
        # The moments and statistics of every leaf first, then the eigenbases of
        # every statistic at once (on a mesh, each on one device:
        # `map_round_robin`), then each leaf's moments in its new basis.
        stepped = []
        for g, p, mu, nu, gg, q, layout in zip(
            grad_leaves,
            param_leaves,
            mu_leaves,
            nu_leaves,
            gg_leaves,
            q_leaves,
            layouts,
        ):
            if g is None or not is_float_leaf(p):
                for column, value in zip(out, (None, mu, nu, gg, q)):
                    column.append(value)
                continue
            dtype = compute_dtype(p.dtype)
            whole, back = _gathering(p, layout, self._axes(global_shape(p, layout)))
            args = (
                whole(g.astype(dtype)),
                whole(p.astype(dtype)),
                whole(mu.astype(dtype)),
                whole(nu.astype(dtype)),
            )
            u, new_mu, new_nu, new_gg = _shards.cond(
                k == 0,
                _like_inputs(first, skip=1),
                _like_inputs(later, skip=1),
                *args,
                gg,
                q,
            )
            place = len(out[0])
            out[0].append(back(u))
            out[1].append(None)  # the moments, once the eigenbases are known
            out[2].append(None)
            out[3].append(new_gg)
            out[4].append(q)
            stepped.append((place, mu, nu, new_mu, new_nu, back))

        def matrices(tree):
            return [m for place, *_ in stepped for m in tree[place] if m is not None]

        def per_leaf(found):
            found = iter(found)
            return [
                tuple(None if m is None else next(found) for m in out[3][place])
                for place, *_ in stepped
            ]

        mesh = work_mesh((grads, params))
        statistics, bases = matrices(out[3]), matrices(out[4])
        unsorted = [jnp.arange(m.shape[0]) for m in statistics]

        def eigenbases(statistics, bases):
            del bases
            found = map_round_robin(_eigenbasis, [m[None] for m in statistics], mesh)
            return [q[0].astype(m.dtype) for q, m in zip(found, statistics)], unsorted

        def refreshed(statistics, bases):
            found = map_round_robin(
                lambda pair: _refreshed(*pair),
                [(m[None], o[None]) for m, o in zip(statistics, bases)],
                mesh,
            )
            return (
                [q[0].astype(o.dtype) for (q, _), o in zip(found, bases)],
                [order[0] for _, order in found],
            )

        def kept(statistics, bases):
            return bases, unsorted

        new_bases, orders = _shards.cond(
            k == 0,
            eigenbases,
            lambda *a: _shards.cond(refresh, refreshed, kept, *a),
            statistics,
            bases,
        )
        for (place, mu, nu, new_mu, new_nu, back), q, order in zip(
            stepped, per_leaf(new_bases), per_leaf(orders)
        ):
            new_mu, new_nu = _shards.cond(
                k == 0,
                lambda mu, nu, q, order: (mu, nu),
                _like_inputs(rotated),
                new_mu,
                new_nu,
                q,
                order,
            )
            out[1][place] = back(new_mu.astype(mu.dtype))
            out[2][place] = back(new_nu.astype(nu.dtype))
            out[4][place] = q
        updates, mu, nu, gg, q = (param_def.unflatten(column) for column in out)
        return updates, SOAPState(step=increment(state.step), mu=mu, nu=nu, gg=gg, q=q)


def _refreshed(statistic: Array, basis: Array) -> tuple[Array, Array]:
    """A refreshed eigenbasis of `statistic` from the last one, `basis`: its
    columns sorted by the estimated eigenvalues `diag(basis^T statistic basis)`,
    then one step of power iteration and a QR; and that sorting order."""
    estimated = jnp.diag(basis.T @ statistic @ basis)
    order = jnp.argsort(-estimated, stable=True)
    return jnp.linalg.qr(statistic @ basis[:, order])[0], order


_NO_GATHER = (lambda x: x), (lambda x: x)


def _in_shard_map(p: Array, layout: Layout) -> tuple[Any, Any]:
    """Inside `shard_map` with `axis_name`: a function that makes a block shaped
    like `p` (split as `layout` says) whole on every device, and one that gives
    back this device's block of a whole result."""
    return (
        lambda x: gather_whole(x, layout),
        lambda x: local_block(x, p, layout),
    )


def _gather_once(p: Array) -> tuple[Any, Any]:
    """For a leaf on a mesh: a function that makes an array shaped like it whole on
    every device, and one that gives a result back the leaf's sharding. Every axis
    of a leaf may be rotated, so its gradient, moments and value are gathered once
    each, and the results are computed whole (held so by a sharding constraint,
    else the compiler splits some products by the leaf's sharding and gathers
    again at every rotation) and sliced back; the statistics and eigenbases are
    small and whole everywhere. On Explicit axes the entry runs this with them
    made Auto (`_core._placement.on_auto_axes`). Identities off a mesh."""
    placed = _jax_api.mesh_and_spec(p)
    if placed is None:
        return (lambda x: x), (lambda x: x)
    mesh, _ = placed
    if "manual" in _jax_api.axis_kinds(mesh).values():  # inside shard_map
        return (lambda x: x), (lambda x: x)
    whole = NamedSharding(mesh, P(*[None] * p.ndim))
    pin = lambda x: jax.lax.with_sharding_constraint(x, whole)  # noqa: E731
    return pin, (lambda x: _jax_api.shard_alike(pin(x), p))


def _gathering(p: Array, layout: Layout, axes: list[bool]) -> tuple[Any, Any]:
    """How a leaf `p` laid out as `layout` is made whole for its preconditioner and
    given back: identities where none of its axes is preconditioned (`axes`),
    else `_in_shard_map` inside `shard_map`, else `_gather_once`."""
    if not any(axes):
        return _NO_GATHER
    if any(layout):
        return _in_shard_map(p, layout)
    return _gather_once(p)


def _like_inputs(rule: Any, skip: int = 0) -> Any:
    """`rule`, its outputs (a tuple) cast to the dtypes of its inputs after the
    first `skip` (output `i` like input `skip + i`): the two branches of a cond
    must agree, and float64 hyperparameters (under jax_enable_x64) would
    otherwise widen float32 leaves in one of them."""

    def run(*args):
        out = rule(*args)
        like = args[skip : skip + len(out)]
        return jax.tree.map(lambda o, x: o.astype(x.dtype), out, like)

    return run
