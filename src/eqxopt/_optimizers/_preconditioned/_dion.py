"""Dion: orthonormal updates from a low-rank power iteration on the momentum, with
error feedback, and AdamW for every other leaf."""

import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
from jaxtyping import Array, Float, Int, PyTree, UInt32

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import static_count
from ..._core._fields import (
    MaskLike,
    ScalarOrSchedule,
    StorageLike,
    checked_field,
    choice_field,
    dtype_field,
    hyper,
    learning_rate_field,
    mask_field,
    values_at,
    weight_decay_field,
)
from ..._core._keys import key_data
from ..._core._masks import decay_flags
from ..._core._moments import Moment, moment_like
from ..._core._param_sharding import split_like
from ..._core._real import RealOnly
from ..._core._tree import increment, zero_step
from ._muon import _select, adamw_rule, map_matrices_and_rest
from ._orthogonal import MatrixAxes, fans, leaf_axes, matrix_mask, to_matrices


class DionState(eqx.Module):
    """State of `Dion`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: shaped like params: at the Dion leaves the momentum that keeps what
      the low-rank updates left out (error feedback), at the others AdamW's first
      moment.
    - `nu`: AdamW's second moment, shaped like params at the AdamW leaves and `None`
      at the Dion leaves.
    - `q`: at each Dion leaf, the right factor of the power iteration, of shape
      `(*batch, k, r)` for matrices `(fan_in, fan_out)` with `k = min(fan_in,
      fan_out)` and `r` the rank; `None` at the other leaves.
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]
    q: PyTree[Float[Array, "..."] | None]


def _rank_fraction(name: str, value: float) -> float:
    """A Python float in `(0, 1]` (static: it fixes the state's shapes)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise TypeError(f"{name} must be a float in (0, 1], got {value!r}")
    if not 0 < value <= 1:
        raise ValueError(f"{name} must be a float in (0, 1], got {value!r}")
    return float(value)


def dion_rank(fan_in: int, fan_out: int, fraction: float, multiple: int) -> int:
    """The rank of a `(fan_in, fan_out)` matrix's factors: `fraction` of its short
    side rounded up to a multiple of `multiple`, at most the short side."""
    short = min(fan_in, fan_out)
    return min(multiple * math.ceil(fraction * short / multiple), short)


def _cholesky_qr(p: Array) -> Array:
    """`p R^{-1}` for the Cholesky factor `R^T R = p^T p` of the small Gram matrix."""
    lower = jnp.linalg.cholesky(jnp.swapaxes(p, -1, -2) @ p)
    # p = Q L^T, so Q^T = L^{-1} p^T.
    return jnp.swapaxes(
        jsl.solve_triangular(lower, jnp.swapaxes(p, -1, -2), lower=True), -1, -2
    )


def _orthonormal_columns(p: Array, method: str) -> Array:
    """An orthonormal basis of the columns of each `(rows, r)` matrix `p` (`rows >=
    r`), in float32 or wider: Householder QR, or Cholesky QR applied twice (the
    second pass restores the orthogonality the first loses to rounding), with
    Householder QR where that is not finite (a Gram matrix too ill-conditioned)."""
    p = p.astype(jnp.promote_types(p.dtype, jnp.float32))
    householder = lambda: jnp.linalg.qr(p)[0]  # noqa: E731
    if method == "qr":
        return householder()
    q = _cholesky_qr(_cholesky_qr(p))
    return jax.lax.cond(jnp.isfinite(q).all(), lambda: q, householder)


def _power_iteration(
    tall: Array, q: Array, iterations: int, method: str
) -> tuple[Array, Array]:
    """`(P, R)` with `P = orth(B Q)` and `R = B^T P`, `iterations` times with `Q <- R`
    between, for `B = tall`."""
    left = _orthonormal_columns(tall @ q, method).astype(tall.dtype)
    right = jnp.swapaxes(tall, -1, -2) @ left
    for _ in range(iterations - 1):
        left = _orthonormal_columns(tall @ right, method).astype(tall.dtype)
        right = jnp.swapaxes(tall, -1, -2) @ left
    return left, right


class Dion(AbstractTransform):
    r"""Dion (Ahn et al., 2025, "Dion: Distributed Orthonormalized Updates",
    arXiv:2504.05295): an orthonormal update for each matrix, as Muon's, but of
    rank `r` and from one step of power iteration on the momentum, so that the
    work and, on a mesh, the traffic of a step grow with `r` rather than with the
    matrix; what the low-rank update leaves out stays in the momentum (error
    feedback). AdamW for every other leaf.

    For a Dion leaf (by default every float leaf with `ndim == 2`; `dion_mask`
    selects others, and which of their axes form the matrix), each matrix of shape
    `(m, n)` = `(fan_in, fan_out)` is oriented so that it has at least as many
    rows as columns: $B$ below is the momentum plus the gradient, transposed when
    $n \ge m$; $Q$ (state, `(min(m, n), r)`, drawn from a normal distribution at
    `init`) is the right factor. With `lr` and `wd` the learning rate and weight
    decay at `step`, and $\mu$ the momentum:

    $$
    \begin{aligned}
    B &= M + G \\
    P &= \operatorname{orth}(B Q), \qquad R = B^\top P
        && \text{(power\_iters times, } Q \leftarrow R \text{ between)} \\
    M &\leftarrow B - (1 - \mu)\, P R^\top \\
    Q &\leftarrow R \,/\, (\|R_{:,j}\|_2 + \epsilon) && \text{(column by column)} \\
    p &\leftarrow p - \mathrm{lr} \left( \sqrt{n / m}\; P Q^\top
        + \mathrm{wd} \cdot p \right)
    \end{aligned}
    $$

    where $\operatorname{orth}$ is a QR factorisation's orthonormal factor. A
    matrix whose $B$ is zero takes no step and keeps its $Q$. With `rank_fraction=1`
    and one power iteration each step is close to Muon's orthogonalised momentum;
    smaller ranks trade that for a step whose cost, and whose traffic when the
    matrix is split over devices, is that of the `r`-column factors.

    Every other float leaf gets AdamW (`optax.adamw`: $\hat\mu = \mu / (1 -
    b_1^t)$, $p \leftarrow p - \mathrm{lr}_A(\hat\mu / (\sqrt{\nu / (1 - b_2^t) +
    \epsilon_\mathrm{root}} + \epsilon) + \mathrm{wd}_A \cdot p)$), as microsoft/dion
    pairs Dion with AdamW.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `mu`: the error feedback's momentum, in `[0, 1)`.
    - `rank_fraction`: the rank as a fraction of each matrix's short side, in
      `(0, 1]` (static: it fixes the state's shapes).
    - `rank_multiple_of`: round the rank up to a multiple of this (static int
      `>= 1`), for even splits over a mesh; never above the short side.
    - `power_iters`: power iterations a step (static int `>= 1`).
    - `qr_method`: `"qr"` (Householder QR, the default) or `"cholesky"` (Cholesky
      QR twice: two Cholesky factors of `r x r` Gram matrices and triangular
      solves, the cheaper choice on accelerators, where Householder QR is slow,
      for low ranks; Householder QR where the Gram matrix is too ill-conditioned
      for it, as a full-rank square factor often is).
    - `eps`: added to the column norms of $R$ and to AdamW's denominator, `> 0`.
    - `weight_decay`: decoupled decay of the Dion leaves, `>= 0`.
    - `weight_decay_mask`: which leaves decay: `None` (all), a tree of bools (or a
      prefix of params) or a function of params returning one.
    - `dion_mask`: which leaves get Dion, as `Muon`'s `muon_mask`: `None` (every
      leaf with `ndim == 2`), a tree (or prefix) of bools and `eqxopt.MatrixAxes`,
      or a function of params returning one (`eqxopt.matrix_axes(model)` gives
      one from an Equinox model's module types).
    - `adam_b1`, `adam_b2`: AdamW's decays, in `[0, 1)` and `(0, 1)`.
    - `adam_eps_root`: added inside AdamW's root, `>= 0`.
    - `adam_weight_decay`: AdamW's decoupled decay, `>= 0`.
    - `adam_learning_rate`: AdamW's learning rate; `None` uses `learning_rate`.
    - `mu_dtype`, `nu_dtype`: how to store the momentum and AdamW's second moment:
      a dtype (`None`: the parameter's) or a block-wise quantized storage such as
      `eqxopt.Blockwise8bit()`.
    - `key`: keyword-only: an integer seed or a JAX PRNG key that `init` draws the
      initial factors from (every replica of a data-parallel run must use the
      same).

    On a mesh, the momentum keeps the parameter's split and each factor is split
    like the matrix side it spans, so a matrix split over devices exchanges only
    `r`-column products in a step; the result is the unsplit run's.

    **Example:**

    ```python
    import jax
    import jax.numpy as jnp
    import eqxopt

    params = {"w": jax.random.normal(jax.random.key(0), (16, 8)), "b": jnp.zeros(8)}
    grads = {"w": jax.random.normal(jax.random.key(1), (16, 8)), "b": jnp.ones(8)}
    opt = eqxopt.Dion(learning_rate=0.02, rank_fraction=0.5, weight_decay=0.0)
    state = opt.init(params)
    assert state.q["w"].shape == (8, 4)  # the right factor, of rank 4
    updates, state = opt.update(grads, state, params)
    assert jnp.linalg.matrix_rank(updates["w"]) == 4  # a rank-4 step
    new = eqxopt.apply_updates(params, updates)
    ```
    """

    reads_params = None  # the parameters are not read (`params_needed`)
    real_only = RealOnly("its factors transpose", trees=("params", "grads"))

    learning_rate: ScalarOrSchedule = learning_rate_field()
    mu: ScalarOrSchedule = hyper(0.95, low=0.0, high=1.0, high_open=True, kw_only=True)
    rank_fraction: float = checked_field(_rank_fraction, 1.0, static=True, kw_only=True)
    rank_multiple_of: int = checked_field(static_count, 1, static=True, kw_only=True)
    power_iters: int = checked_field(static_count, 1, static=True, kw_only=True)
    qr_method: str = choice_field("qr", ("qr", "cholesky"))
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0, low_open=True, kw_only=True)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.01)
    weight_decay_mask: MaskLike = mask_field()
    dion_mask: Any = checked_field(matrix_mask, None, static=True, kw_only=True)
    adam_b1: ScalarOrSchedule = hyper(
        0.9, low=0.0, high=1.0, high_open=True, kw_only=True
    )
    adam_b2: ScalarOrSchedule = hyper(
        0.95, low=0.0, high=1.0, low_open=True, high_open=True, kw_only=True
    )
    adam_eps_root: ScalarOrSchedule = hyper(0.0, low=0.0, kw_only=True)
    adam_weight_decay: ScalarOrSchedule = weight_decay_field(0.01)
    adam_learning_rate: ScalarOrSchedule | None = learning_rate_field(
        None, optional=True, kw_only=True
    )
    mu_dtype: StorageLike = dtype_field(storage=True)
    nu_dtype: StorageLike = dtype_field(storage=True)
    key: UInt32[Array, "..."] = eqx.field(default=0, kw_only=True)
    key_impl: str = eqx.field(static=True, init=False)

    moments = (
        Moment("mu", dtype=mu_dtype),
        Moment("nu", dtype=nu_dtype, nonnegative=True),
    )

    def __post_init__(self):
        self.key, self.key_impl = key_data("key", self.key)

    def matrices(self, params: Params) -> list[MatrixAxes | None]:
        """Per leaf of `params` (in `jax.tree.leaves` order), the `MatrixAxes` of
        each leaf Dion updates, `None` at the others (checked)."""
        return leaf_axes(self.dion_mask, params, "dion_mask")

    def _factor_shape(self, shape: tuple[int, ...], axes: MatrixAxes) -> tuple:
        batch, _, _ = axes.resolve(shape)
        m, n = fans(shape, axes)
        r = dion_rank(m, n, self.rank_fraction, self.rank_multiple_of)
        return (*(shape[a] for a in batch), min(m, n), r)

    def init(self, params: Params) -> DionState:
        axes = self.matrices(params)
        flags = [a is not None for a in axes]
        decay_flags(self.weight_decay_mask, params, "weight_decay_mask")  # checked
        key = jax.random.wrap_key_data(self.key, impl=self.key_impl)
        leaves, treedef = jax.tree.flatten(params)
        factors = []
        for i, (p, a) in enumerate(zip(leaves, axes)):
            if a is None:
                factors.append(None)
                continue
            shape = self._factor_shape(p.shape, a)
            q = jax.random.normal(jax.random.fold_in(key, i), shape, p.dtype)
            m, n = fans(p.shape, a)
            # Split like the side the factor spans (the rows, axis -2, when n >= m)
            # and the stack's axes; spread over the mesh for a reshaped leaf.
            dims: tuple[int | None, ...] = ()
            if a.is_last_two(p.ndim):
                side = p.ndim - 2 if n >= m else p.ndim - 1
                dims = (*range(p.ndim - 2), side, None)
            factors.append(split_like(q, p, dims))
        nu = moment_like(self, params, "nu")
        return DionState(
            step=zero_step(),
            mu=moment_like(self, params, "mu"),
            nu=_select(nu, params, [not f for f in flags]),
            q=treedef.unflatten(factors),
        )

    def transform(
        self, grads: Grads, state: DionState, params: Params
    ) -> tuple[Updates, DionState]:
        axes = self.matrices(params)
        is_dion = [a is not None for a in axes]
        decays = decay_flags(self.weight_decay_mask, params, "weight_decay_mask")
        t = increment(state.step)
        h = values_at(self, state.step)
        lr, wd, mu, eps = h.learning_rate, h.weight_decay, h.mu, h.eps
        power_iters, method = self.power_iters, self.qr_method

        def dion_rule(g, p, momentum, q, flag):
            leaf_axes_, decay = flag
            b = momentum + g
            if g.size == 0:  # an empty matrix: nothing to factor
                return jnp.zeros_like(g), b, q
            m, n = fans(g.shape, leaf_axes_)
            matrices, back = to_matrices(b, leaf_axes_)
            wide = n >= m
            tall = jnp.swapaxes(matrices, -1, -2) if wide else matrices
            left, right = _power_iteration(tall, q, power_iters, method)
            # A zero matrix gives no step and keeps its factor.
            zero = jnp.all(tall == 0, axis=(-2, -1), keepdims=True)
            left = jnp.where(zero, 0, jnp.nan_to_num(left))
            right = jnp.where(zero, q, jnp.nan_to_num(right))
            tall = tall - (1 - mu) * (left @ jnp.swapaxes(right, -1, -2))
            wide_r = right.astype(jnp.promote_types(right.dtype, jnp.float32))
            norms = jnp.linalg.norm(wide_r, axis=-2, keepdims=True)
            q = (wide_r / (norms + eps)).astype(right.dtype)
            step = left @ jnp.swapaxes(q, -1, -2)
            if wide:
                tall, step = jnp.swapaxes(tall, -1, -2), jnp.swapaxes(step, -1, -2)
            update = math.sqrt(n / m) * back(step)
            if decay:
                update = update + wd * p
            return -lr * update, back(tall), q

        updates, (momentum,), (q,), (nu,) = map_matrices_and_rest(
            dion_rule,
            adamw_rule(h, t, False),
            grads,
            params,
            is_dion,
            shared=(state.mu,),
            matrix_only=(state.q,),
            other_only=(state.nu,),
            matrix_flags=list(zip(axes, decays)),
            other_flags=decays,
        )
        return updates, DionState(step=t, mu=momentum, nu=nu, q=q)
