"""PolarGrad: the polar factor of the momentum, scaled by its nuclear norm, with an
AdamW fallback."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core import _jax_api
from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import optional_static_count, static_count
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
from ..._core._masks import decay_flags
from ..._core._moments import Moment, moment_like
from ..._core._tree import increment, zero_step
from ._muon import _orthogonalise, _select, adamw_rule, map_matrices_and_rest
from ._orthogonal import (
    DEFAULT_NS_COEFFS,
    check_coeffs,
    coefficient_rows,
    leaf_axes,
    matrix_mask,
    ns_coeffs as ns_coeffs_field,
    to_matrices,
)

POLAR_METHODS = ("qdwh", "svd", "newton_schulz")


class PolarGradState(eqx.Module):
    """State of `PolarGrad`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: the momentum of every float leaf, shaped like params: of the gradients
      (of their polar factors with `polar_first=True`) at the PolarGrad leaves,
      AdamW's first moment at the others.
    - `nu`: AdamW's second moment, shaped like params at the AdamW leaves and
      `None` at the PolarGrad leaves (which need none).
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]


def _swap(x: Array) -> Array:
    return jnp.swapaxes(x, -1, -2).conj()


def polar_factor(
    x: Float[Array, "*batch m n"],
    method: str,
    qdwh_steps: int | None,
    coeffs: Float[Array, "k 3"],
    eps: Float[Array, ""] | float,
) -> Float[Array, "*batch m n"]:
    """The orthogonal polar factor `U` (`x = U H`, `H` positive semidefinite) of
    each matrix in the last two axes of `x`.

    `"qdwh"` runs `jax.lax.linalg.qdwh` (at most `qdwh_steps` iterations; `None`:
    JAX's cap of 10, which converges in float32 and float64) on each matrix, or its
    conjugate transpose where it is wider than tall. `"svd"` forms `U_r V_r^H` from
    the singular vectors whose singular values are above `max(m, n)` machine
    epsilons of the largest (the partial isometry of a rank-deficient matrix, as
    QDWH and Newton-Schulz give: `0` for a matrix of zeros). `"newton_schulz"` is
    Muon's iteration (`coeffs`, `eps`), an approximation. Inside `jax.shard_map`,
    on a block that varies over its mesh axes, `"qdwh"` runs as `"svd"`.
    """
    if method == "newton_schulz":
        return _orthogonalise(x, coeffs, eps)
    m, n = x.shape[-2:]
    wide = m < n
    y = _swap(x) if wide else x
    flat = jnp.reshape(y, (-1, *y.shape[-2:]))
    if method == "qdwh" and _jax_api.varying_axes(x):
        # Inside `shard_map`, on a block that varies over its axes, the loop of
        # JAX's QDWH cannot trace: the SVD gives the same factor to rounding.
        method = "svd"
    if method == "qdwh":

        def one(a):
            return jax.lax.linalg.qdwh(a, max_iterations=qdwh_steps)[0]

        u = jax.vmap(one)(flat)
    else:
        left, s, right = jnp.linalg.svd(flat, full_matrices=False)
        floor = s[..., :1] * max(m, n) * jnp.finfo(s.dtype).eps
        kept = (s > floor).astype(left.dtype)
        u = (left * kept[..., None, :]) @ right
    u = jnp.reshape(u, y.shape)
    return _swap(u) if wide else u


class PolarGrad(AbstractTransform):
    r"""PolarGrad (Lau, Long & Su, 2025): the orthogonal polar factor of the
    momentum, scaled by its nuclear norm, for matrix weights; AdamW for every other
    leaf.

    For a PolarGrad leaf (by default every float leaf with `ndim == 2`;
    `polar_mask` selects others, and says which of their axes form the matrix),
    with `lr` and `wd` the learning rate and weight decay at `step`, $\mu$ the
    momentum, $\operatorname{polar}(M) = (U, H)$ the polar decomposition
    $M = U H$ of each matrix ($H$ positive semidefinite), and
    $\operatorname{tr} H = \|M\|_* = \langle M, U \rangle$ its nuclear norm:

    $$
    \begin{aligned}
    \mu &\leftarrow \beta \mu + (1 - \beta)\, g, \qquad
        (U, H) = \operatorname{polar}(\mu), \qquad
        D = \operatorname{tr}(H)\, U
        && \text{(momentum first, the default)} \\
    (U, H) &= \operatorname{polar}(g), \qquad
        \mu \leftarrow \beta \mu + (1 - \beta)\, U, \qquad
        D = \operatorname{tr}(H)\, \mu
        && \text{(polar\_first)} \\
    p &\leftarrow p - \mathrm{lr} \left( D + \mathrm{wd} \cdot p \right)
    \end{aligned}
    $$

    This is the update of the authors' reference code (`PolarGrad` in
    `polar_grad.py` of github.com/timlautk/polargrad, `polar_first` its option of
    the same name): with `beta=0` it is the paper's PolarGrad, with `beta > 0` its
    PolarGradM, momentum first or polar first. The momentum is not
    bias-corrected and there is no width scaling (the nuclear norm sets the step's
    size); `Muon(adaptive=True)` is close to the momentum-first variant with
    Newton-Schulz, but bias-corrects, applies Nesterov and scales by the width.
    The polar factor is exact to rounding with `polar_method="qdwh"` (QDWH,
    Nakatsukasa et al., 2010, as the paper; the default) or `"svd"`, and
    approximate with `"newton_schulz"` (Muon's iteration; the nuclear norm is then
    $\langle M, U \rangle$ of the approximate $U$, as the reference code takes
    it). The polar decomposition runs in float32 at least (bf16 parameters
    included). A matrix of zeros has the polar factor `0`, and no step. The
    polar factor of a rank-deficient matrix is not unique: `"svd"` takes the
    partial isometry $U_r V_r^\top$ (nothing on the null space, which Newton-Schulz
    nearly matches), while QDWH, as the reference's, fills the null space with
    orthonormal directions that rounding picks, each scaled by the nuclear norm.

    Every other float leaf gets AdamW without Nesterov with `adam_b1`, `adam_b2`,
    `eps`, `adam_eps_root`, `adam_weight_decay` and `adam_learning_rate`; see
    `Muon`. optax and torch.optim have no PolarGrad.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module. The
      step is the nuclear norm times an orthogonal matrix: it shrinks with the
      gradients, as gradient descent's does and Muon's does not, so tune the rate
      on gradient descent's scale rather than Muon's.
    - `beta`: momentum, in `[0, 1)`; `0` is PolarGrad without momentum.
    - `polar_first`: take the polar decomposition of the gradient and the momentum
      of its polar factors (the paper's polar-first PolarGradM), instead of the
      polar decomposition of the momentum (default `False`, as the reference).
    - `polar_method`: `"qdwh"` (the default), `"svd"` or `"newton_schulz"`.
      Inside `jax.shard_map`, on a block that varies over the mesh axes, `"qdwh"`
      runs as `"svd"` (JAX's QDWH loop does not trace there).
    - `qdwh_steps`: the most QDWH iterations (static int `>= 1`); `None` (default)
      runs to convergence (JAX's cap of 10). The reference code's default is 2.
    - `ns_steps`, `ns_coeffs`: the Newton-Schulz steps and coefficients, for
      `polar_method="newton_schulz"` (see `Muon`; `"polar_express"` gives Polar
      Express).
    - `eps`: added to the Frobenius norm before Newton-Schulz and to AdamW's
      denominator, `> 0`.
    - `weight_decay`: decoupled decay of the PolarGrad leaves, `>= 0`.
    - `weight_decay_mask`: which leaves decay (both branches): `None` (all), a
      tree of bools (or a prefix of params) or a function of params returning one.
    - `polar_mask`: which leaves get PolarGrad: `None` (every leaf with
      `ndim == 2`), a tree (or prefix) of bools or `eqxopt.MatrixAxes`, or a
      function of params returning one, as `Muon`'s `muon_mask`
      (`eqxopt.matrix_axes(model)` gives one).
    - `adam_b1`, `adam_b2`: AdamW's decays, in `[0, 1)` and `(0, 1)`.
    - `adam_eps_root`: added inside AdamW's root, `>= 0`.
    - `adam_weight_decay`: AdamW's decoupled decay, `>= 0`.
    - `adam_learning_rate`: AdamW's learning rate; `None` uses `learning_rate`.
    - `mu_dtype`, `nu_dtype`: how to store the moments: a dtype (`None`: the
      parameter's) or a block-wise quantized storage (`eqxopt.Blockwise8bit()`).

    On a mesh, QDWH and the SVD run on whole matrices (XLA gathers a split one);
    Newton-Schulz is Muon's sharding-aware code. There is no `axis_name` for
    matrices split inside `shard_map`.

    Reference: Lau, Long & Su, *PolarGrad: A Class of Matrix-Gradient Optimizers
    from a Unifying Preconditioning Perspective*, arXiv:2505.21799 (2025).

    **Example:**

    ```python
    import jax
    import jax.numpy as jnp
    import eqxopt

    params = {"w": jax.random.normal(jax.random.key(0), (4, 3)), "b": jnp.zeros(3)}
    grads = {"w": jax.random.normal(jax.random.key(1), (4, 3)), "b": jnp.ones(3)}
    opt = eqxopt.PolarGrad(learning_rate=0.01, beta=0.0)
    state = opt.init(params)
    new, state = opt.step(grads, state, params)
    # the matrix's step is the gradient's polar factor times its nuclear norm
    step = new["w"] - params["w"]
    nuclear = jnp.linalg.svd(grads["w"], compute_uv=False).sum()
    singular_values = jnp.linalg.svd(step, compute_uv=False)
    assert jnp.allclose(singular_values, 0.01 * nuclear, rtol=1e-4)
    assert bool((new["b"] < 0).all())  # AdamW moves against the gradient
    ```
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule = learning_rate_field()
    beta: ScalarOrSchedule = hyper(
        0.95, low=0.0, high=1.0, high_open=True, kw_only=True
    )
    polar_first: bool = flag_field(False)
    polar_method: str = choice_field("qdwh", POLAR_METHODS)
    # Static: the iterations unrolled (QDWH's cap, Newton-Schulz's steps).
    qdwh_steps: int | None = checked_field(
        optional_static_count, None, static=True, kw_only=True
    )
    ns_steps: int = checked_field(static_count, 5, static=True, kw_only=True)
    ns_coeffs: Float[Array, "*k 3"] = checked_field(
        ns_coeffs_field, DEFAULT_NS_COEFFS, kw_only=True
    )
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0, low_open=True, kw_only=True)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    weight_decay_mask: MaskLike = mask_field()
    polar_mask: Any = checked_field(matrix_mask, None, static=True, kw_only=True)
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

    moments = (
        Moment("mu", dtype=mu_dtype),
        Moment("nu", dtype=nu_dtype, nonnegative=True),
    )

    def __check_init__(self):
        check_coeffs(self.ns_coeffs, self.ns_steps)

    def init(self, params: Params) -> PolarGradState:
        axes = leaf_axes(self.polar_mask, params, "polar_mask")  # checked
        decay_flags(self.weight_decay_mask, params, "weight_decay_mask")  # checked
        nu = moment_like(self, params, "nu")
        return PolarGradState(
            step=zero_step(),
            mu=moment_like(self, params, "mu"),
            nu=_select(nu, params, [a is None for a in axes]),
        )

    def transform(
        self, grads: Grads, state: PolarGradState, params: Params
    ) -> tuple[Updates, PolarGradState]:
        axes = leaf_axes(self.polar_mask, params, "polar_mask")
        is_polar = [a is not None for a in axes]
        decays = decay_flags(self.weight_decay_mask, params, "weight_decay_mask")
        t = increment(state.step)
        h = values_at(self, state.step)
        direction = _polargrad_direction(self, h)
        lr, wd = h.learning_rate, h.weight_decay

        def polar_rule(g, p, mu, flag):
            leaf_axes_, decay = flag
            update, mu = direction(g, mu, leaf_axes_)
            if decay:
                update = update + wd * p
            return -lr * update, mu

        updates, (mu,), _, (nu,) = map_matrices_and_rest(
            polar_rule,
            adamw_rule(h, t, nesterov=False),
            grads,
            params,
            is_polar,
            shared=(state.mu,),
            other_only=(state.nu,),
            matrix_flags=list(zip(axes, decays)),
            other_flags=decays,
        )
        return updates, PolarGradState(step=t, mu=mu, nu=nu)


def _polargrad_direction(opt: PolarGrad, h: Any) -> Any:
    """PolarGrad's step for one leaf before the learning rate and decay, as
    `direction(g, mu, axes) -> (D, new mu)`, with `h` the values at this step."""
    beta, polar_first = h.beta, opt.polar_first
    coeffs = coefficient_rows(opt.ns_coeffs, opt.ns_steps)

    def polar(x):
        return polar_factor(x, opt.polar_method, opt.qdwh_steps, coeffs, h.eps)

    def nuclear(x, u):  # <x, U> of each matrix: tr(H) for the exact polar factor
        return jnp.sum((x.conj() * u).real, axis=(-2, -1), keepdims=True)

    def direction(g, mu, axes):
        if g.size == 0:  # an empty matrix: nothing to decompose or scale
            return jnp.zeros_like(g), beta * mu + (1 - beta) * g
        if polar_first:
            matrices, back = to_matrices(g, axes)
            u = polar(matrices)
            mu = beta * mu + (1 - beta) * back(u)
            return back(nuclear(matrices, u) * to_matrices(mu, axes)[0]), mu
        mu = beta * mu + (1 - beta) * g
        matrices, back = to_matrices(mu, axes)
        u = polar(matrices)
        return back(nuclear(matrices, u) * u), mu

    return direction
