"""Muon: momentum orthogonalised by Newton-Schulz, with an AdamW fallback."""

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from jaxtyping import Array, ArrayLike, Float, Int, PyTree

from ..._core import _jax_api
from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import is_concrete, static_count
from ..._core._fields import (
    DTypeLike,
    MaskLike,
    ScalarOrSchedule,
    checked_field,
    dtype_field,
    flag_field,
    hyper,
    learning_rate_field,
    mask_field,
    values_at,
    weight_decay_field,
)
from ..._core._leafwise import map_leaves
from ..._core._masks import decay_flags
from ..._core._moments import Moment, moment_like
from ..._core._tree import (
    abs_sq,
    align_grads,
    increment,
    is_float_leaf,
    step_power,
    zero_step,
)

_DEFAULT_NS_COEFFS = (3.4445, -4.7750, 2.0315)


class MuonState(eqx.Module):
    """State of `Muon`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: the momentum of every float leaf (Muon and AdamW leaves alike), shaped
      like params.
    - `nu`: AdamW's second moment, shaped like params at the AdamW leaves and
      `None` at the Muon leaves (which need none).
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]


def newton_schulz(
    x: Float[Array, "*batch m n"],
    coeffs: Float[Array, "k 3"],
    eps: Float[Array, ""] | float = 1e-8,
) -> Float[Array, "*batch m n"]:
    """Approximately orthogonalises the matrices in the last two axes of `x`.

    `x` is divided by its Frobenius norm plus `eps`, transposed if it has more rows
    than columns, and then each row `(a, b, c)` of `coeffs` applies one quintic step
    `x <- a x + (b A + c A A) x` with `A = x x^T` (the iteration of Jordan's Muon
    and `optax.contrib.orthogonalize_via_newton_schulz`).
    """
    return _newton_schulz(x, coeffs, eps)


def _newton_schulz(
    x: Array,
    coeffs: Array,
    eps: Array | float,
    *,
    pinned: tuple[Any, Any] | None = None,
    axis_name: Any = None,
    transposed: bool | None = None,
) -> Array:
    """`newton_schulz` on a stack of matrices, one of which may be split over mesh
    axes along the dimension its Gram matrix `x x^T` sums over: `pinned` the
    shardings of each iterate and Gram matrix on Auto axes (sharding
    constraints, else the compiler carries the parameter's sharding back into the
    loop from its output and gathers at every product); `axis_name` the axes to sum
    the Gram matrix over inside `shard_map` (there `transposed` says whether the
    whole matrix has more rows than columns; the block's shape cannot tell)."""

    def pin(v, which):
        if pinned is None:
            return v
        return jax.lax.with_sharding_constraint(v, pinned[which])

    if transposed is None:
        transposed = x.shape[-2] > x.shape[-1]
    if transposed:
        x = jnp.swapaxes(x, -1, -2)
    sq = jnp.sum(abs_sq(x), axis=(-2, -1), keepdims=True)
    if axis_name is not None:
        sq = jax.lax.psum(sq, axis_name)
    x = pin(x / (jnp.sqrt(sq) + eps), 0)
    for i in range(coeffs.shape[0]):
        a = x @ jnp.swapaxes(x, -1, -2).conj()
        if axis_name is not None:
            a = jax.lax.psum(a, axis_name)
        a = pin(a, 1)
        b = coeffs[i, 1] * a + coeffs[i, 2] * a @ a
        x = pin(coeffs[i, 0] * x + b @ x, 0)
    return jnp.swapaxes(x, -1, -2) if transposed else x


def _keeps_split(m: int, n: int, ns_steps: int) -> bool:
    """Whether a matrix split along its long dimension (the one `x x^T` sums over)
    is orthogonalised in place, all-reducing each step's Gram matrix, rather than
    gathered once: per device, ring all-reduces of the `(short, short)` Gram matrix
    move `2 (k-1)/k short**2` elements each, the gather `(k-1)/k short long`."""
    short, long = min(m, n), max(m, n)
    return long > 2 * ns_steps * short


def _axis_size(axis_name: tuple[str, ...]) -> int:
    """The number of shards over `axis_name` inside `shard_map` (a Python int)."""
    return int(jax.lax.psum(1, axis_name))


def _orthogonalise_rows(
    x: Array, coeffs: Array, eps: Array | float, axis_name: tuple[str, ...]
) -> Array:
    """`newton_schulz` inside `shard_map` of the matrices whose rows (axis -2) are
    split over `axis_name`, `x` this shard's block: kept split where the rows are the
    long side and `_keeps_split` says so (the Gram matrix over the rows is summed),
    else gathered once (tiled along the rows) and this shard's rows taken back."""
    k = _axis_size(axis_name)
    rows, n = x.shape[-2], x.shape[-1]
    m = rows * k
    if m > n and _keeps_split(m, n, coeffs.shape[0]):
        return _newton_schulz(x, coeffs, eps, axis_name=axis_name, transposed=True)
    whole = jax.lax.all_gather(x, axis_name, axis=x.ndim - 2, tiled=True)
    out = _newton_schulz(whole, coeffs, eps)
    start = jax.lax.axis_index(axis_name) * rows
    return jax.lax.dynamic_slice_in_dim(out, start, rows, axis=x.ndim - 2)


def _axis_names(
    name: str, value: str | tuple[str, ...] | None
) -> tuple[str, ...] | None:
    # A private copy of the `axis_name` check of the transforms that reduce over
    # parameters (one shared helper in `_core` is planned).
    if value is None:
        return None
    names = (value,) if isinstance(value, str) else value
    if (
        not isinstance(names, tuple)
        or not names
        or not all(isinstance(n, str) and n for n in names)
    ):
        raise TypeError(
            f"{name} must be None, a mesh axis name or a tuple of them, got {value!r}"
        )
    return names


def _orthogonalise(x: Array, coeffs: Array, eps: Array | float) -> Array:
    """`newton_schulz` of a leaf that may be sharded over a mesh, returned with the
    leaf's sharding and with at most one gather of it.

    A matrix split along its long dimension stays split when that moves fewer bytes
    than gathering it (`_keeps_split`): each step's small Gram matrix is all-reduced.
    Otherwise the matrix's two dimensions are gathered once (a dimension of a stack
    of matrices stays split) and the result sliced back. A sharding constraint
    leaves the compiler that choice (it never gathers a matrix already whole on
    each device); on Explicit axes the entry runs this with them made Auto
    (`_core._placement.on_auto_axes`).
    """
    placed = _jax_api.mesh_and_spec(x)
    if placed is None:
        return _newton_schulz(x, coeffs, eps)
    mesh, _ = placed
    if "manual" in _jax_api.axis_kinds(mesh).values():
        return _newton_schulz(x, coeffs, eps)  # inside shard_map: a local block
    m, n = x.shape[-2:]
    keep = _keeps_split(m, n, coeffs.shape[0])
    summed = -1 if m <= n else -2  # the dimension x x^T sums over
    batch = x.ndim - 2
    free = P.UNCONSTRAINED
    inner = [free] * batch + [None, None]
    if keep:
        inner[summed] = free
    if m > n:  # as `_newton_schulz` holds it, transposed
        inner[-2:] = inner[-1], inner[-2]
    pinned = (
        NamedSharding(mesh, P(*inner)),
        NamedSharding(mesh, P(*[free] * batch, None, None)),
    )
    return _newton_schulz(x, coeffs, eps, pinned=pinned)


def _muon_flags(mask: Any, params: Params) -> list[bool]:
    """Which leaves Muon orthogonalises (the others get AdamW); checked."""
    leaves_with_paths = jax.tree.leaves_with_path(params)
    if mask is None:
        return [is_float_leaf(p) and p.ndim == 2 for _, p in leaves_with_paths]
    flags = decay_flags(mask, params, "muon_mask")
    for (path, p), flag in zip(leaves_with_paths, flags):
        if flag and is_float_leaf(p) and p.ndim < 2:
            raise ValueError(
                f"muon_mask selects params{jax.tree_util.keystr(path)}, which has "
                f"shape {p.shape}; Muon needs leaves with at least 2 dimensions "
                "(the last two form the matrix)"
            )
    return [flag and is_float_leaf(p) for (_, p), flag in zip(leaves_with_paths, flags)]


def _select(
    tree: PyTree, params: Params, keep: list[bool], *, grads: bool = False
) -> PyTree:
    treedef = jax.tree.structure(params)
    # Up to params' leaves: a quantized moment (`Blockwise8bit`) is a module there;
    # gradients may hold `None` in place of a whole subtree.
    leaves = align_grads(tree, params) if grads else treedef.flatten_up_to(tree)
    return treedef.unflatten([x if k else None for x, k in zip(leaves, keep)])


def _ns_coeffs(name: str, value: ArrayLike | Sequence[Sequence[float]]) -> Array:
    # The shape is checked against ns_steps in `Muon.__check_init__`.
    try:
        coeffs = jnp.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(
            f"{name} must be 3 numbers or an (ns_steps, 3) array, got {value!r}"
        ) from None
    if is_concrete(coeffs) and not bool(jnp.all(jnp.isfinite(coeffs))):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return coeffs


class Muon(AbstractTransform):
    r"""Muon (Jordan et al., 2024): Newton-Schulz orthogonalised momentum for matrix
    weights, AdamW for every other leaf.

    For a Muon leaf (by default every float leaf with `ndim == 2`; a leaf with more
    dimensions that `muon_mask` selects is a stack of matrices in its last two axes),
    with $t = \mathrm{step} + 1$, `lr` and `wd` the learning rate and weight decay at
    `step`, $\mu$ the momentum and shape `(..., m, n)`:

    $$
    \begin{aligned}
    \mu &\leftarrow \beta \mu + (1 - \beta)\, g \\
    \hat\mu &= \frac{\beta \mu}{1 - \beta^{t+1}} + \frac{(1 - \beta)\, g}{1 - \beta^t}
        && \text{(nesterov)} \\
    \hat\mu &= \mu / (1 - \beta^t) && \text{(otherwise)} \\
    O &= \operatorname{NewtonSchulz}(\hat\mu)
        && \text{(ns\_steps quintic steps, coefficients ns\_coeffs)} \\
    p &\leftarrow p - \mathrm{lr} \left( s \, O + \mathrm{wd} \cdot p \right) \\
    s &= \sqrt{\max(1, n / m)} && \text{(consistent\_rms=None)} \\
    s &= \sqrt{\max(m, n)} \cdot \mathrm{consistent\_rms} && \text{(otherwise)}
    \end{aligned}
    $$

    Every other float leaf gets AdamW (`optax.adamw` with the same `nesterov`) with
    `adam_b1`, `adam_b2`, `eps`, `adam_eps_root`, `adam_weight_decay` and
    `adam_learning_rate` (written $b_1$, $b_2$, $\epsilon$, $\epsilon_\mathrm{root}$,
    $\mathrm{wd}_A$, $\mathrm{lr}_A$ here; $\hat\mu$ is the first moment's estimate, as
    above with $b_1$ for $\beta$):

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, g,
        \qquad \nu \leftarrow b_2 \nu + (1 - b_2)\, g^2 \\
    p &\leftarrow p - \mathrm{lr}_A \left(
        \frac{\hat\mu}{\sqrt{\nu / (1 - b_2^t) + \epsilon_\mathrm{root}} + \epsilon}
        + \mathrm{wd}_A \cdot p \right)
    \end{aligned}
    $$

    The same as `optax.contrib.muon` with its default `'frobenius'`
    preconditioning. Differences: `weight_decay_mask`
    applies to both branches (optax applies it to the Muon leaves only), and which
    leaves get Muon is a mask of bools (optax: a tree of dimension numbers).

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `beta`: momentum, in `[0, 1)`.
    - `ns_steps`: the number of Newton-Schulz steps (static int `>= 1`).
    - `ns_coeffs`: the quintic's coefficients `(a, b, c)`, shape `(3,)` (used for
      every step) or `(ns_steps, 3)` (one row per step).
    - `eps`: added to the Frobenius norm before Newton-Schulz and to AdamW's
      denominator, `> 0`.
    - `weight_decay`: decoupled decay of the Muon leaves, `>= 0`.
    - `weight_decay_mask`: which leaves decay: `None` (all), a tree of bools (or a
      prefix of params) or a function of params returning one.
    - `nesterov`: Nesterov momentum, for both branches (default `True`, as optax).
    - `muon_mask`: which leaves get Muon: `None` (every leaf with `ndim == 2`), a
      tree of bools (an Equinox module is always read as a tree, never called) or a
      function of params returning one. Selected leaves need `ndim >= 2`.
    - `consistent_rms`: `None` for Jordan's width scaling, or a float `> 0` for
      the RMS-matching scaling of Liu et al. (2025) (`0.2` matches AdamW's update
      RMS).
    - `adam_b1`, `adam_b2`: AdamW's decays, in `[0, 1)` and `(0, 1)`.
    - `adam_eps_root`: added inside AdamW's root, `>= 0`.
    - `adam_weight_decay`: AdamW's decoupled decay, `>= 0`.
    - `adam_learning_rate`: AdamW's learning rate; `None` uses `learning_rate`.
    - `mu_dtype`, `nu_dtype`: dtypes to store the moments in (`None`: the
      parameter's).
    - `axis_name`: inside `shard_map`, the mesh axis name (or tuple of names) whose
      shards each hold a block of rows (axis -2) of every Muon matrix, as FSDP splits
      a weight's first dimension; `None` (default) where each device holds whole
      matrices, or outside `shard_map`. The norms and Gram matrices are then summed
      over those axes, so the result equals the unsplit run.

    On a mesh (outside `shard_map`; Explicit or Auto axes) a Muon matrix split over
    devices is gathered at most once a step, or not at all when it is split along
    its long side and that side is over `2 * ns_steps` times the short one (then
    each step's small Gram matrix is all-reduced instead, fewer bytes); updates and
    state keep the parameter's sharding.

    **Example:**

    ```python
    import jax
    import jax.numpy as jnp
    import eqxopt

    params = {"w": jax.random.normal(jax.random.key(0), (4, 3)), "b": jnp.zeros(3)}
    grads = {"w": jax.random.normal(jax.random.key(1), (4, 3)), "b": jnp.ones(3)}
    # Muon for the matrix, AdamW for the vector
    opt = eqxopt.Muon(learning_rate=0.02)
    state = opt.init(params)
    new, state = opt.step(grads, state, params)
    # the matrix's step is orthogonalised: its singular values are close together
    singular_values = jnp.linalg.svd(new["w"] - params["w"], compute_uv=False)
    assert singular_values.max() / singular_values.min() < 2
    assert bool((new["b"] < 0).all())  # AdamW moves against the gradient
    ```
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule = learning_rate_field()
    beta: ScalarOrSchedule = hyper(
        0.95, low=0.0, high=1.0, high_open=True, kw_only=True
    )
    # Static: the number of Newton-Schulz steps unrolled in the compiled step.
    ns_steps: int = checked_field(static_count, 5, static=True, kw_only=True)
    ns_coeffs: Float[Array, "*k 3"] = checked_field(
        _ns_coeffs, _DEFAULT_NS_COEFFS, kw_only=True
    )
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0, low_open=True, kw_only=True)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    weight_decay_mask: MaskLike = mask_field()
    nesterov: bool = flag_field(True)
    muon_mask: MaskLike = mask_field()
    consistent_rms: ScalarOrSchedule | None = hyper(
        None, low=0.0, low_open=True, optional=True, kw_only=True
    )
    adam_b1: ScalarOrSchedule = hyper(
        0.9, low=0.0, high=1.0, high_open=True, kw_only=True
    )
    adam_b2: ScalarOrSchedule = hyper(
        0.999, low=0.0, high=1.0, low_open=True, high_open=True, kw_only=True
    )
    adam_eps_root: ScalarOrSchedule = hyper(0.0, low=0.0, kw_only=True)
    adam_weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    adam_learning_rate: ScalarOrSchedule | None = learning_rate_field(
        None, optional=True, kw_only=True
    )
    mu_dtype: DTypeLike = dtype_field(storage=True)
    nu_dtype: DTypeLike = dtype_field(storage=True)
    # Static: mesh axis names, read while tracing.
    axis_name: tuple[str, ...] | None = checked_field(
        _axis_names, None, static=True, kw_only=True
    )

    moments = (
        Moment("mu", dtype=mu_dtype),
        Moment("nu", dtype=nu_dtype, nonnegative=True),
    )

    def __check_init__(self):
        k = self.ns_steps
        if self.ns_coeffs.shape not in ((3,), (k, 3)):
            raise ValueError(
                f"ns_coeffs must have shape (3,) or (ns_steps, 3) = ({k}, 3), "
                f"got shape {self.ns_coeffs.shape}"
            )

    def init(self, params: Params) -> MuonState:
        flags = _muon_flags(self.muon_mask, params)
        decay_flags(self.weight_decay_mask, params, "weight_decay_mask")  # checked
        nu = moment_like(self, params, "nu")
        return MuonState(
            step=zero_step(),
            mu=moment_like(self, params, "mu"),
            nu=_select(nu, params, [not f for f in flags]),
        )

    def transform(
        self, grads: Grads, state: MuonState, params: Params
    ) -> tuple[Updates, MuonState]:
        is_muon = _muon_flags(self.muon_mask, params)
        decays = decay_flags(self.weight_decay_mask, params, "weight_decay_mask")
        t = increment(state.step)
        nesterov = self.nesterov
        h = values_at(self, state.step)

        lr, beta, eps, wd = h.learning_rate, h.beta, h.eps, h.weight_decay
        coeffs = jnp.broadcast_to(self.ns_coeffs, (self.ns_steps, 3))
        rms = h.consistent_rms
        axis_name = self.axis_name

        def muon_rule(g, p, mu, decay):
            mu = beta * mu + (1 - beta) * g
            if p.size == 0:  # an empty matrix: nothing to orthogonalise or scale
                return jnp.zeros_like(g), mu
            if nesterov:
                mu_hat = beta * mu / (1 - step_power(beta, increment(t))) + (
                    1 - beta
                ) * g / (1 - step_power(beta, t))
            else:
                mu_hat = mu / (1 - step_power(beta, t))
            m, n = p.shape[-2:]
            if axis_name is None:
                orthogonal = _orthogonalise(mu_hat, coeffs, eps)
            else:  # this shard's rows of the matrices
                m = m * _axis_size(axis_name)
                orthogonal = _orthogonalise_rows(mu_hat, coeffs, eps, axis_name)
            # Jordan's width scaling, or Liu et al.'s RMS matching.
            scale = max(1.0, n / m) ** 0.5 if rms is None else max(m, n) ** 0.5 * rms
            direction = scale * orthogonal
            if decay:
                direction = direction + wd * p
            return -lr * direction, mu

        adam_rule = adamw_rule(h, t, nesterov)
        not_muon = [not f for f in is_muon]
        muon_updates, (muon_mu,) = map_leaves(
            muon_rule,
            _select(grads, params, is_muon, grads=True),
            params,
            (_select(state.mu, params, is_muon),),
            flags=decays,
        )
        adam_updates, (adam_mu, nu) = map_leaves(
            adam_rule,
            _select(grads, params, not_muon, grads=True),
            params,
            (_select(state.mu, params, not_muon), state.nu),
            elementwise=True,
            flags=decays,
        )
        updates = _merge(muon_updates, adam_updates, params, is_muon)
        mu = _merge(muon_mu, adam_mu, params, is_muon)
        return updates, MuonState(step=t, mu=mu, nu=nu)


def adamw_rule(h: Any, t: Int[Array, ""], nesterov: bool) -> Any:
    """The AdamW rule of `Muon`'s other leaves (and `NorMuon`'s), `map_leaves`'s
    `rule(g, p, mu, nu, decay)`, with the values `h` at this step (`adam_b1`,
    `adam_b2`, `eps`, `adam_eps_root`, `adam_weight_decay`, `adam_learning_rate`
    or else `learning_rate`) and `t = step + 1`."""
    lr = h.learning_rate if h.adam_learning_rate is None else h.adam_learning_rate
    b1, b2, eps = h.adam_b1, h.adam_b2, h.eps
    eps_root, wd = h.adam_eps_root, h.adam_weight_decay

    def rule(g, p, mu, nu, decay):
        mu = b1 * mu + (1 - b1) * g
        nu = b2 * nu + (1 - b2) * abs_sq(g)
        if nesterov:
            mu_hat = b1 * mu / (1 - step_power(b1, increment(t))) + (1 - b1) * g / (
                1 - step_power(b1, t)
            )
        else:
            mu_hat = mu / (1 - step_power(b1, t))
        direction = mu_hat / (jnp.sqrt(nu / (1 - step_power(b2, t)) + eps_root) + eps)
        if decay:
            direction = direction + wd * p
        return -lr * direction, mu, nu

    return rule


def _merge(a: PyTree, b: PyTree, params: Params, take_a: list[bool]) -> PyTree:
    treedef = jax.tree.structure(params)
    a_leaves = treedef.flatten_up_to(a)  # as in `_select`
    b_leaves = treedef.flatten_up_to(b)
    return treedef.unflatten(
        [x if k else y for x, y, k in zip(a_leaves, b_leaves, take_a)]
    )
