"""Muon: momentum orthogonalised by Newton-Schulz, with an AdamW fallback."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from jaxtyping import Array, Float, Int, PyTree

from ..._core import _jax_api
from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import static_count
from ..._core._fields import (
    MaskLike,
    ScalarOrSchedule,
    StorageLike,
    checked_field,
    choice_field,
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
from ._orthogonal import (
    DEFAULT_NS_COEFFS,
    PRECONDITIONINGS,
    axis_size,
    check_coeffs,
    coefficient_rows,
    fans,
    keeps_split,
    leaf_axes,
    matrix_mask,
    newton_schulz_matrices,
    ns_coeffs as ns_coeffs_field,
    to_matrices,
)


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
    *,
    preconditioning: str = "frobenius",
    gram: bool = False,
) -> Float[Array, "*batch m n"]:
    """Approximately orthogonalises the matrices in the last two axes of `x`.

    `x` is divided by its Frobenius norm plus `eps` (or scaled as
    `preconditioning` says: see `Muon`), transposed if it has more rows than
    columns, and then each row `(a, b, c)` of `coeffs` applies one quintic step
    `x <- a x + (b A + c A A) x` with `A = x x^T` (the iteration of Jordan's Muon
    and `optax.contrib.orthogonalize_via_newton_schulz`); `gram=True` runs the same
    steps on the Gram matrix (Gram Newton-Schulz).
    """
    return newton_schulz_matrices(
        x, coeffs, eps, preconditioning=preconditioning, gram=gram
    )


def _orthogonalise_rows(
    x: Array,
    coeffs: Array,
    eps: Array | float,
    axis_name: tuple[str, ...],
    **how: Any,
) -> Array:
    """`newton_schulz` inside `shard_map` of the matrices whose rows (axis -2) are
    split over `axis_name`, `x` this shard's block: kept split where the rows are the
    long side and `keeps_split` says so (the Gram matrix over the rows is summed),
    else gathered once (tiled along the rows) and this shard's rows taken back."""
    k = axis_size(axis_name)
    rows, n = x.shape[-2], x.shape[-1]
    m = rows * k
    if m > n and keeps_split(m, n, coeffs.shape[0]):
        return newton_schulz_matrices(
            x, coeffs, eps, axis_name=axis_name, transposed=True, **how
        )
    whole = jax.lax.all_gather(x, axis_name, axis=x.ndim - 2, tiled=True)
    out = newton_schulz_matrices(whole, coeffs, eps, **how)
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


def _orthogonalise(x: Array, coeffs: Array, eps: Array | float, **how: Any) -> Array:
    """`newton_schulz` of a leaf that may be sharded over a mesh, returned with the
    leaf's sharding and with at most one gather of it.

    A matrix split along its long dimension stays split when that moves fewer bytes
    than gathering it (`keeps_split`): each step's small Gram matrix is all-reduced.
    Otherwise the matrix's two dimensions are gathered once (a dimension of a stack
    of matrices stays split) and the result sliced back. A sharding constraint
    leaves the compiler that choice (it never gathers a matrix already whole on
    each device); on Explicit axes the entry runs this with them made Auto
    (`_core._placement.on_auto_axes`).
    """
    placed = _jax_api.mesh_and_spec(x)
    if placed is None:
        return newton_schulz_matrices(x, coeffs, eps, **how)
    mesh, _ = placed
    if "manual" in _jax_api.axis_kinds(mesh).values():
        # inside shard_map: a local block
        return newton_schulz_matrices(x, coeffs, eps, **how)
    m, n = x.shape[-2:]
    keep = keeps_split(m, n, coeffs.shape[0])
    summed = -1 if m <= n else -2  # the dimension x x^T sums over
    batch = x.ndim - 2
    free = P.UNCONSTRAINED
    inner = [free] * batch + [None, None]
    if keep:
        inner[summed] = free
    if m > n:  # as `newton_schulz_matrices` holds it, transposed
        inner[-2:] = inner[-1], inner[-2]
    pinned = (
        NamedSharding(mesh, P(*inner)),
        NamedSharding(mesh, P(*[free] * batch, None, None)),
    )
    return newton_schulz_matrices(x, coeffs, eps, pinned=pinned, **how)


def _muon_flags(mask: Any, params: Params) -> list[bool]:
    """Which leaves NorMuon orthogonalises (the others get AdamW); checked."""
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


class Muon(AbstractTransform):
    r"""Muon (Jordan et al., 2024): Newton-Schulz orthogonalised momentum for matrix
    weights, AdamW for every other leaf.

    For a Muon leaf (by default every float leaf with `ndim == 2`; `muon_mask`
    selects others, and says which of their axes form the matrix), with
    $t = \mathrm{step} + 1$, `lr` and `wd` the learning rate and weight decay at
    `step`, $\mu$ the momentum and each matrix of shape `(m, n)` = `(fan_in,
    fan_out)`:

    $$
    \begin{aligned}
    \mu &\leftarrow \beta \mu + (1 - \beta)\, g \\
    \hat\mu &= \frac{\beta \mu}{1 - \beta^{t+1}} + \frac{(1 - \beta)\, g}{1 - \beta^t}
        && \text{(nesterov)} \\
    \hat\mu &= \mu / (1 - \beta^t) && \text{(otherwise)} \\
    O &= \operatorname{NewtonSchulz}(\hat\mu)
        && \text{(ns\_steps quintic steps, coefficients ns\_coeffs)} \\
    O &\leftarrow \langle \hat\mu, O \rangle \, O && \text{(adaptive)} \\
    p &\leftarrow p - \mathrm{lr} \left( s \, O + \mathrm{wd} \cdot p \right) \\
    s &= \sqrt{\max(1, n / m)} && \text{(consistent\_rms=None)} \\
    s &= \sqrt{\max(m, n)} \cdot \mathrm{consistent\_rms} && \text{(otherwise)}
    \end{aligned}
    $$

    Newton-Schulz transposes a matrix with more rows than columns, scales it as
    `preconditioning` says (by default $\hat\mu / (\|\hat\mu\|_F + \epsilon)$),
    and applies $X \leftarrow a X + (b A + c A^2) X$, $A = X X^\top$, once per row
    $(a, b, c)$ of the coefficients.

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

    Every option of `optax.contrib.muon` (0.2.8) is here and gives its numbers:
    `preconditioning`, `adaptive`, `consistent_rms`, the coefficient presets and
    per-step rows, and `optax.contrib.MuonDimensionNumbers` as `MatrixAxes` in
    `muon_mask`. Differences: `weight_decay_mask` applies to both branches (optax
    applies it to the Muon leaves only); `adaptive`'s inner product is taken per
    matrix of a stack (optax's over the whole leaf; the same for one matrix); and
    AOL's floor is `eps` (optax's is `1e-8` whatever `eps`).

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `beta`: momentum, in `[0, 1)`.
    - `ns_steps`: the number of Newton-Schulz steps (static int `>= 1`).
    - `ns_coeffs`: the quintic's coefficients `(a, b, c)`: shape `(3,)` (every
      step), `(k, 3)` with `k >= ns_steps` (one row per step, the first `ns_steps`
      used), or a preset's name: `"standard"` (Jordan's, the default), `"dion"`
      (optax's per-step rows from microsoft/dion) or `"polar_express"` (the five
      Polar Express steps of Amsel et al., 2025, their `1.02` safety factor in the
      first row).
    - `preconditioning`: how the matrix is scaled before Newton-Schulz:
      `"frobenius"` (by its Frobenius norm plus `eps`, the default),
      `"spectral"` (by its largest singular value plus `eps`), `"aol"` (row `i`
      of $X$ by $(\sum_j |A_{ij}|)^{-1/2}$, Turbo-Muon's almost-orthogonal
      scaling, Boissin et al., 2025, which usually saves a step) or `"schatten"`
      (by $\|A\|_F^{1/2}$, the Schatten-4 norm, Grishina et al., 2025); the
      first step reuses the Gram matrix the last three read.
    - `adaptive`: scale each orthogonalised matrix by its inner product with the
      momentum estimate, the dual norm of Bernstein & Newhouse (2024).
    - `gram_newton_schulz`: run the same steps on the Gram matrix $A$ alone
      (Gram Newton-Schulz, Dao AI Lab, 2026: $A \leftarrow h(A) A h(A)$,
      $Q \leftarrow h(A) Q$, $X \leftarrow Q X$ at the end and after step 2),
      cheaper for matrices much wider than tall; the same result in exact
      arithmetic.
    - `eps`: added to the norm before Newton-Schulz (the floor of `"aol"` and
      `"schatten"`'s) and to AdamW's denominator, `> 0`.
    - `weight_decay`: decoupled decay of the Muon leaves, `>= 0`.
    - `weight_decay_mask`: which leaves decay: `None` (all), a tree of bools (or a
      prefix of params) or a function of params returning one.
    - `nesterov`: Nesterov momentum, for both branches (default `True`, as optax).
    - `muon_mask`: which leaves get Muon: `None` (every leaf with `ndim == 2`), a
      tree (or prefix) whose entries are bools or `eqxopt.MatrixAxes` (which axes
      form the matrix: `True` is the last two, a stack of matrices for a leaf
      with more), or a function of params returning one; an Equinox module is
      read as a tree, never called. `eqxopt.matrix_axes(model)` gives one from
      an Equinox model's module types.
    - `consistent_rms`: `None` for Jordan's width scaling, or a float `> 0` for
      the RMS-matching scaling of Liu et al. (2025) (`0.2` matches AdamW's update
      RMS).
    - `adam_b1`, `adam_b2`: AdamW's decays, in `[0, 1)` and `(0, 1)`.
    - `adam_eps_root`: added inside AdamW's root, `>= 0`.
    - `adam_weight_decay`: AdamW's decoupled decay, `>= 0`.
    - `adam_learning_rate`: AdamW's learning rate; `None` uses `learning_rate`.
    - `mu_dtype`, `nu_dtype`: how to store the moments: a dtype (`None`: the
      parameter's) or a block-wise quantized storage (`eqxopt.Blockwise8bit()`:
      8-bit momentum, which the orthogonalisation tolerates well).
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
        ns_coeffs_field, DEFAULT_NS_COEFFS, kw_only=True
    )
    preconditioning: str = choice_field("frobenius", PRECONDITIONINGS)
    adaptive: bool = flag_field(False)
    gram_newton_schulz: bool = flag_field(False)
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0, low_open=True, kw_only=True)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    weight_decay_mask: MaskLike = mask_field()
    nesterov: bool = flag_field(True)
    muon_mask: Any = checked_field(matrix_mask, None, static=True, kw_only=True)
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
    mu_dtype: StorageLike = dtype_field(storage=True)
    nu_dtype: StorageLike = dtype_field(storage=True)
    # Static: mesh axis names, read while tracing.
    axis_name: tuple[str, ...] | None = checked_field(
        _axis_names, None, static=True, kw_only=True
    )

    moments = (
        Moment("mu", dtype=mu_dtype),
        Moment("nu", dtype=nu_dtype, nonnegative=True),
    )

    def __check_init__(self):
        check_coeffs(self.ns_coeffs, self.ns_steps)

    def matrices(self, params: Params) -> list[Any]:
        """Per leaf of `params` (in `jax.tree.leaves` order), the `MatrixAxes` of
        each leaf Muon orthogonalises, `None` at the others (checked)."""
        axes = leaf_axes(self.muon_mask, params)
        if self.axis_name is not None:
            for (path, p), a in zip(jax.tree.leaves_with_path(params), axes):
                if a is not None and not a.is_last_two(p.ndim):
                    raise ValueError(
                        f"muon_mask gives params{jax.tree_util.keystr(path)} {a}; "
                        "with axis_name, Muon's matrices are the last two axes "
                        "(rows split over the axis): give True there"
                    )
        return axes

    def init(self, params: Params) -> MuonState:
        flags = [a is not None for a in self.matrices(params)]
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
        axes = self.matrices(params)
        is_muon = [a is not None for a in axes]
        decays = decay_flags(self.weight_decay_mask, params, "weight_decay_mask")
        t = increment(state.step)
        h = values_at(self, state.step)
        direction = muon_direction(self, h, t)
        lr, wd = h.learning_rate, h.weight_decay

        def muon_rule(g, p, mu, flag):
            leaf_axes_, decay = flag
            update, mu = direction(g, mu, leaf_axes_)
            if decay:
                update = update + wd * p
            return -lr * update, mu

        updates, (mu,), _, (nu,) = map_matrices_and_rest(
            muon_rule,
            adamw_rule(h, t, self.nesterov),
            grads,
            params,
            is_muon,
            shared=(state.mu,),
            other_only=(state.nu,),
            matrix_flags=list(zip(axes, decays)),
            other_flags=decays,
        )
        return updates, MuonState(step=t, mu=mu, nu=nu)


def muon_direction(opt: Any, h: Any, t: Int[Array, ""]) -> Any:
    """Muon's step for one leaf before the learning rate and decay, as
    `direction(g, mu, axes) -> (s O, new mu)`, for an optimizer with `Muon`'s
    options (`opt`), `h` its values at this step and `t = step + 1`."""
    beta, eps, rms = h.beta, h.eps, h.consistent_rms
    coeffs = coefficient_rows(opt.ns_coeffs, opt.ns_steps)
    nesterov, adaptive, axis_name = opt.nesterov, opt.adaptive, opt.axis_name
    how = dict(preconditioning=opt.preconditioning, gram=opt.gram_newton_schulz)

    def direction(g, mu, axes):
        mu = beta * mu + (1 - beta) * g
        if g.size == 0:  # an empty matrix: nothing to orthogonalise or scale
            return jnp.zeros_like(g), mu
        if nesterov:
            mu_hat = beta * mu / (1 - step_power(beta, increment(t))) + (
                1 - beta
            ) * g / (1 - step_power(beta, t))
        else:
            mu_hat = mu / (1 - step_power(beta, t))
        m, n = fans(g.shape, axes)
        matrices, back = to_matrices(mu_hat, axes)
        if axis_name is None:
            orthogonal = _orthogonalise(matrices, coeffs, eps, **how)
        else:  # this shard's rows of the matrices
            m = m * axis_size(axis_name)
            orthogonal = _orthogonalise_rows(matrices, coeffs, eps, axis_name, **how)
        if adaptive:  # the dual norm of each matrix, <mu_hat, O>
            dual = jnp.sum(matrices.conj() * orthogonal, axis=(-2, -1), keepdims=True)
            if axis_name is not None:
                dual = jax.lax.psum(dual, axis_name)
            orthogonal = dual * orthogonal
        # Jordan's width scaling, or Liu et al.'s RMS matching.
        scale = max(1.0, n / m) ** 0.5 if rms is None else max(m, n) ** 0.5 * rms
        return scale * back(orthogonal), mu

    return direction


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


def map_matrices_and_rest(
    matrix_rule: Any,
    other_rule: Any,
    grads: Grads,
    params: Params,
    is_matrix: list[bool],
    *,
    shared: tuple[PyTree, ...],
    matrix_only: tuple[PyTree, ...] = (),
    other_only: tuple[PyTree, ...] = (),
    matrix_flags: list[Any],
    other_flags: list[Any],
) -> tuple[Updates, tuple[PyTree, ...], tuple[PyTree, ...], tuple[PyTree, ...]]:
    """The step of an optimizer that treats its matrix leaves with one rule and
    every other leaf with another (Muon's family: the matrices' own rule, AdamW
    for the rest): `map_leaves` of `matrix_rule(g, p, *shared, *matrix_only,
    flag)` on the leaves `is_matrix` selects and of `other_rule(g, p, *shared,
    *other_only, flag)` (element-wise) on the others.

    `shared` are state trees held at every leaf (a momentum), `matrix_only` and
    `other_only` those held at one side's leaves only (`None` at the other's).
    Returns the updates and the new `shared` (merged), `matrix_only` and
    `other_only` trees."""
    is_other = [not f for f in is_matrix]

    def run(rule, keep, own, flags, elementwise):
        picked = tuple(_select(tree, params, keep) for tree in shared)
        updates, moments = map_leaves(
            rule,
            _select(grads, params, keep, grads=True),
            params,
            (*picked, *own),
            elementwise=elementwise,
            flags=flags,
        )
        return updates, moments[: len(shared)], moments[len(shared) :]

    m_updates, m_shared, m_own = run(
        matrix_rule, is_matrix, matrix_only, matrix_flags, False
    )
    o_updates, o_shared, o_own = run(
        other_rule, is_other, other_only, other_flags, True
    )
    merged = tuple(_merge(a, b, params, is_matrix) for a, b in zip(m_shared, o_shared))
    return (
        _merge(m_updates, o_updates, params, is_matrix),
        merged,
        tuple(m_own),
        tuple(o_own),
    )
