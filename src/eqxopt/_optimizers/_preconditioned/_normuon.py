"""NorMuon: Muon's orthogonalised momentum, normalised neuron by neuron."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import static_count
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
from ..._core._masks import decay_flags
from ..._core._moments import Moment, moment_like
from ..._core._tree import (
    abs_sq,
    increment,
    real_compute_dtype,
    zero_step,
)
from ._muon import (
    _muon_flags,
    _orthogonalise,
    _select,
    adamw_rule,
    map_matrices_and_rest,
)
from ._orthogonal import (
    DEFAULT_NS_COEFFS,
    check_coeffs,
    coefficient_rows,
    ns_coeffs as ns_coeffs_field,
)

# The authors' guard of the divisions by the row RMS and by the norm.
_TINY = 1e-10


class NorMuonState(eqx.Module):
    """State of `NorMuon`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: the momentum of every float leaf (NorMuon and AdamW leaves alike),
      shaped like params.
    - `nu`: AdamW's second moment, shaped like params at the AdamW leaves and `None`
      at the NorMuon leaves.
    - `row_nu`: at the NorMuon leaves, the moving average of the mean square of each
      row of the orthogonalised momentum: shape `(..., m, 1)` for a leaf
      `(..., m, n)`, in float32 (at least); `None` elsewhere.
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]
    row_nu: PyTree[Float[Array, "..."] | None]


class NorMuon(AbstractTransform):
    r"""NorMuon (Li et al., 2025): Muon's Newton-Schulz orthogonalised momentum with
    a second moment per neuron (per row), which evens out the very different row
    norms an orthogonalised update leaves, for matrix weights; AdamW for every
    other leaf.

    For a NorMuon leaf (by default every float leaf with `ndim == 2`; a leaf with
    more dimensions that `muon_mask` selects is a stack of matrices in its last two
    axes) of shape `(..., m, n)`, with `lr` and `wd` the learning rate and weight
    decay at `step`, $\epsilon_0 = 10^{-10}$ and $\|\cdot\|$ the Frobenius norm of
    each matrix:

    $$
    \begin{aligned}
    \mu &\leftarrow \beta \mu + (1 - \beta)\, g \\
    O &= \operatorname{NewtonSchulz}\left(\beta \mu + (1 - \beta)\, g\right)
        && \text{(nesterov; else of $\mu$)} \\
    v_i &\leftarrow \beta_2 v_i + (1 - \beta_2) \operatorname{mean}_j O_{ij}^2
        && \text{(one per row $i$)} \\
    \hat O_{ij} &= O_{ij} / (\sqrt{v_i} + \epsilon_0) \\
    D &= \sqrt{\max(1, m / n)}\, \frac{\|O\|}{\|\hat O\| + \epsilon_0} \, \hat O
        && \text{(consistent\_rms=None)} \\
    D &= \mathrm{consistent\_rms} \cdot \frac{\sqrt{m n}}{\|\hat O\| + \epsilon_0}
        \, \hat O && \text{(otherwise)} \\
    p &\leftarrow p - \mathrm{lr} \left(D + \mathrm{wd} \cdot p\right)
    \end{aligned}
    $$

    This is the update of the authors' reference code (`normuon_update`: the row
    normalisation keeps the matrix's norm, then Jordan's `sqrt(max(1, rows /
    cols))` scaling, which reads a weight as `(out, in)`, the layout of
    `equinox.nn.Linear` and torch, so rows are output neurons); with
    `consistent_rms` the step's RMS is set to it, the paper's algorithm's scaling
    (`0.2` there, to match AdamW's update RMS). The momentum is not bias-corrected
    (the orthogonalisation ignores its scale), and the Newton-Schulz steps run in
    float32 (at least), where the authors' run in bfloat16.

    Every other float leaf gets AdamW without Nesterov (as the authors' code's
    Adam group) with `adam_b1`, `adam_b2`, `eps`, `adam_eps_root`,
    `adam_weight_decay` and `adam_learning_rate`; see `Muon`. optax and
    torch.optim have no NorMuon.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `beta`: momentum, in `[0, 1)`.
    - `beta2`: decay of the row second moments, in `[0, 1)`.
    - `ns_steps`: the number of Newton-Schulz steps (static int `>= 1`).
    - `ns_coeffs`: the quintic's coefficients `(a, b, c)`, shape `(3,)` (used for
      every step), `(k, 3)` with `k >= ns_steps` (one row per step), or a preset's
      name (see `Muon`).
    - `eps`: added to the Frobenius norm before Newton-Schulz and to AdamW's
      denominator, `> 0`.
    - `weight_decay`: decoupled decay of the NorMuon leaves, `>= 0`.
    - `weight_decay_mask`: which leaves decay (both branches): `None` (all), a tree
      of bools (or a prefix of params) or a function of params returning one.
    - `nesterov`: Nesterov momentum for the NorMuon leaves (default `True`).
    - `muon_mask`: which leaves get NorMuon: `None` (every leaf with `ndim == 2`), a
      tree of bools or a function of params returning one. Selected leaves need
      `ndim >= 2`.
    - `consistent_rms`: `None` for the authors' code's scaling, or a float `> 0`:
      the RMS of each matrix's step before the learning rate.
    - `adam_b1`, `adam_b2`: AdamW's decays, in `[0, 1)` and `(0, 1)`.
    - `adam_eps_root`: added inside AdamW's root, `>= 0`.
    - `adam_weight_decay`: AdamW's decoupled decay, `>= 0`.
    - `adam_learning_rate`: AdamW's learning rate; `None` uses `learning_rate`.
    - `mu_dtype`, `nu_dtype`: dtypes to store the momentum and AdamW's second
      moment in (`None`: the parameter's).
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule = learning_rate_field()
    beta: ScalarOrSchedule = hyper(
        0.95, low=0.0, high=1.0, high_open=True, kw_only=True
    )
    beta2: ScalarOrSchedule = hyper(
        0.95, low=0.0, high=1.0, high_open=True, kw_only=True
    )
    # Static: the number of Newton-Schulz steps unrolled in the compiled step.
    ns_steps: int = checked_field(static_count, 5, static=True, kw_only=True)
    ns_coeffs: Float[Array, "*k 3"] = checked_field(
        ns_coeffs_field, DEFAULT_NS_COEFFS, kw_only=True
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

    moments = (
        Moment("mu", dtype=mu_dtype),
        Moment("nu", dtype=nu_dtype, nonnegative=True),
    )

    def __check_init__(self):
        check_coeffs(self.ns_coeffs, self.ns_steps)

    def init(self, params: Params) -> NorMuonState:
        flags = _muon_flags(self.muon_mask, params)
        decay_flags(self.weight_decay_mask, params, "weight_decay_mask")  # checked

        def rows(p):
            real = real_compute_dtype(p.dtype)
            return jnp.zeros((*p.shape[:-1], 1), real)

        leaves, treedef = jax.tree.flatten(params)
        row_nu = [rows(p) if f else None for p, f in zip(leaves, flags)]
        nu = moment_like(self, params, "nu")
        return NorMuonState(
            step=zero_step(),
            mu=moment_like(self, params, "mu"),
            nu=_select(nu, params, [not f for f in flags]),
            row_nu=treedef.unflatten(row_nu),
        )

    def transform(
        self, grads: Grads, state: NorMuonState, params: Params
    ) -> tuple[Updates, NorMuonState]:
        is_muon = _muon_flags(self.muon_mask, params)
        decays = decay_flags(self.weight_decay_mask, params, "weight_decay_mask")
        t = increment(state.step)
        h = values_at(self, state.step)
        lr, beta, beta2, wd = h.learning_rate, h.beta, h.beta2, h.weight_decay
        coeffs = coefficient_rows(self.ns_coeffs, self.ns_steps)
        eps, rms, nesterov = h.eps, h.consistent_rms, self.nesterov

        def frobenius(x):
            return jnp.sqrt(jnp.sum(abs_sq(x), axis=(-2, -1), keepdims=True))

        def normuon_rule(g, p, mu, v, decay):
            mu = beta * mu + (1 - beta) * g
            if p.size == 0:  # an empty matrix: nothing to orthogonalise or scale
                return jnp.zeros_like(g), mu, v
            o = _orthogonalise(
                beta * mu + (1 - beta) * g if nesterov else mu, coeffs, eps
            )
            v = beta2 * v + (1 - beta2) * jnp.mean(abs_sq(o), axis=-1, keepdims=True)
            o_hat = o / (jnp.sqrt(v) + _TINY)
            m, n = p.shape[-2:]
            if rms is None:  # the norm kept, then Jordan's width scaling
                scale = max(1.0, m / n) ** 0.5 * frobenius(o)
            else:
                scale = rms * (m * n) ** 0.5
            direction = scale / (frobenius(o_hat) + _TINY) * o_hat
            if decay:
                direction = direction + wd * p
            return -lr * direction, mu, v

        updates, (mu,), (row_nu,), (nu,) = map_matrices_and_rest(
            normuon_rule,
            adamw_rule(h, t, nesterov=False),
            grads,
            params,
            is_muon,
            shared=(state.mu,),
            matrix_only=(state.row_nu,),
            other_only=(state.nu,),
            matrix_flags=decays,
            other_flags=decays,
        )
        return updates, NorMuonState(
            step=t,
            mu=mu,
            nu=nu,
            row_nu=row_nu,
        )
