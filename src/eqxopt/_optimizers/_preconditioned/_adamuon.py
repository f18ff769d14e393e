"""AdaMuon: Muon's orthogonalised momentum with a second moment on the orthogonal
direction and an RMS-aligned scale."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import static_count
from ..._core._fields import (
    MaskLike,
    ScalarOrSchedule,
    StorageLike,
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
from ..._core._tree import abs_sq, increment, step_power, zero_step
from ._muon import _orthogonalise, adamw_rule, map_matrices_and_rest
from ._orthogonal import (
    DEFAULT_NS_COEFFS,
    check_coeffs,
    coefficient_rows,
    fans,
    leaf_axes,
    matrix_mask,
    ns_coeffs as ns_coeffs_field,
    to_matrices,
)

# The floor of the Frobenius norm that Newton-Schulz divides by (pytorch-optimizer's
# `zero_power_via_newton_schulz_5`, `clamp_min(1e-7)`).
_NS_FLOOR = 1e-7


class AdaMuonState(eqx.Module):
    """State of `AdaMuon`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: the momentum of every float leaf (AdaMuon and AdamW leaves alike),
      shaped like params.
    - `nu`: the second moment of every float leaf, shaped like params: of the
      orthogonalised direction at the AdaMuon leaves, of the gradient (AdamW's) at
      the others.
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]


class AdaMuon(AbstractTransform):
    r"""AdaMuon (Si et al., 2025): Muon's Newton-Schulz orthogonalised momentum,
    divided element by element by the root of a second moment of the orthogonal
    direction (Adam's adaptivity on Muon's geometry) and rescaled to a set RMS, for
    matrix weights; AdamW for every other leaf.

    For an AdaMuon leaf (by default every float leaf with `ndim == 2`; `muon_mask`
    selects others and says which of their axes form the matrix, as `Muon`'s), with
    $t = \mathrm{step} + 1$, `lr` and `wd` the learning rate and weight decay at
    `step`, each matrix of shape `(m, n)` = `(fan_in, fan_out)` and $\|\cdot\|$
    its Frobenius norm:

    $$
    \begin{aligned}
    \mu &\leftarrow \beta \mu + (1 - \beta)\, g \\
    X &= \beta \mu + (1 - \beta)\, g \ \text{(nesterov)}, \quad
        X = \mu \ \text{(otherwise)} \\
    O &= \operatorname{NewtonSchulz}(X), \quad
        O = \operatorname{NewtonSchulz}(\operatorname{sign} X)
        \ \text{(sign\_momentum)} \\
    \nu &\leftarrow \beta_2 \nu + (1 - \beta_2)\, O^2 \\
    \hat O &= O / \left(\sqrt{\nu / (1 - \beta_2^t)} + \epsilon\right) \\
    D &= \mathrm{consistent\_rms} \cdot \sqrt{m n}\;
        \hat O / (\|\hat O\| + \epsilon) \\
    D &= \sqrt{\max(1, n / m)} \sqrt{\min(m, n)}\;
        \hat O / (\|\hat O\| + \epsilon) && \text{(consistent\_rms=None)} \\
    p &\leftarrow p - \mathrm{lr} \left(D + \mathrm{wd} \cdot p\right)
    \end{aligned}
    $$

    Newton-Schulz divides $X$ by its Frobenius norm (floored at $10^{-7}$),
    transposes it if it has more rows than columns, and applies
    $X \leftarrow a X + (b A + c A^2) X$, $A = X X^\top$, once per row $(a, b, c)$
    of the coefficients (see `Muon`). The RMS-aligned scale makes the step's RMS
    `consistent_rms` (`0.2`, AdamW's typical update RMS, so AdamW's learning rate
    and schedule carry over); `None` is Jordan's width scaling instead.

    This is pytorch-optimizer's `AdaMuon` (4.1.0), its defaults included, with
    Newton-Schulz run in the parameters' dtype (float32 at least) where it runs in
    bfloat16: its `use_adjusted_lr=False` is `consistent_rms=None`, with a weight
    read as `(out, in)` (`MatrixAxes(reduction=-1, output=-2)`, what
    `eqxopt.matrix_axes` gives an `eqx.nn.Linear`; a conv kernel flattened to
    `(out, in * k...)` is `MatrixAxes(reduction=(1, 2, ...), output=0)`). The
    paper's Algorithm 1 takes the sign of the momentum before orthogonalising it
    (`sign_momentum=True`; the authors' code has Nesterov momentum,
    `nesterov=True`); its first moment is not an average but a sum, which the
    orthogonalisation does not see. AdamW's learning rate is `learning_rate` unless
    `adam_learning_rate` is given (pytorch-optimizer's `adamw_lr` defaults to
    `3e-4`).

    Every other float leaf gets AdamW without Nesterov (pytorch-optimizer's AdamW
    group) with `adam_b1`, `adam_b2`, `eps`, `adam_eps_root`, `adam_weight_decay`
    and `adam_learning_rate`; see `Muon`.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `beta`: momentum, in `[0, 1)`.
    - `beta2`: decay of the second moment of the orthogonal direction, in
      `[0, 1)`.
    - `ns_steps`: the number of Newton-Schulz steps (static int `>= 1`).
    - `ns_coeffs`: the quintic's coefficients `(a, b, c)`: shape `(3,)` (every
      step), `(k, 3)` with `k >= ns_steps` (one row per step), or a preset's name
      (see `Muon`).
    - `gram_newton_schulz`: run the same steps on the Gram matrix (see `Muon`).
    - `sign_momentum`: orthogonalise the sign of the momentum (the paper's
      sign-stabilised direction) rather than the momentum.
    - `eps`: added to the root of the second moment, to the norm of the RMS
      scaling and to AdamW's denominator, `> 0`.
    - `weight_decay`: decoupled decay of the AdaMuon leaves, `>= 0`.
    - `weight_decay_mask`: which leaves decay (both branches): `None` (all), a
      tree of bools (or a prefix of params) or a function of params returning one.
    - `nesterov`: Nesterov momentum for the AdaMuon leaves (default `False`).
    - `muon_mask`: which leaves get AdaMuon: `None` (every leaf with
      `ndim == 2`), a tree (or prefix) of bools and `eqxopt.MatrixAxes`, or a
      function of params returning one (see `Muon`; `eqxopt.matrix_axes(model)`
      gives one from an Equinox model).
    - `consistent_rms`: the RMS of each matrix's step before the learning rate, a
      float `> 0` (default `0.2`), or `None` for Jordan's width scaling.
    - `adam_b1`, `adam_b2`: AdamW's decays, in `[0, 1)` and `(0, 1)`.
    - `adam_eps_root`: added inside AdamW's root, `>= 0`.
    - `adam_weight_decay`: AdamW's decoupled decay, `>= 0`.
    - `adam_learning_rate`: AdamW's learning rate; `None` uses `learning_rate`.
    - `mu_dtype`, `nu_dtype`: how to store the moments: a dtype (`None`: the
      parameter's) or a block-wise quantized storage (`eqxopt.Blockwise8bit()`:
      8-bit moments).

    **Example:**

    ```python
    import jax
    import jax.numpy as jnp
    import eqxopt

    params = {"w": jax.random.normal(jax.random.key(0), (6, 4)), "b": jnp.zeros(4)}
    grads = {"w": jax.random.normal(jax.random.key(1), (6, 4)), "b": jnp.ones(4)}
    opt = eqxopt.AdaMuon(0.01)
    state = opt.init(params)
    new, state = opt.step(grads, state, params)
    # the matrix's step has RMS lr * 0.2
    rms = jnp.sqrt(jnp.mean((new["w"] - params["w"]) ** 2))
    assert jnp.allclose(rms, 0.01 * 0.2, rtol=1e-4)
    assert bool((new["b"] < 0).all())  # AdamW moves against the gradient
    ```
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule = learning_rate_field()
    beta: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True, kw_only=True)
    beta2: ScalarOrSchedule = hyper(
        0.95, low=0.0, high=1.0, high_open=True, kw_only=True
    )
    # Static: the number of Newton-Schulz steps unrolled in the compiled step.
    ns_steps: int = checked_field(static_count, 5, static=True, kw_only=True)
    ns_coeffs: Float[Array, "*k 3"] = checked_field(
        ns_coeffs_field, DEFAULT_NS_COEFFS, kw_only=True
    )
    gram_newton_schulz: bool = flag_field(False)
    sign_momentum: bool = flag_field(False)
    eps: ScalarOrSchedule = hyper(1e-10, low=0.0, low_open=True, kw_only=True)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    weight_decay_mask: MaskLike = mask_field()
    nesterov: bool = flag_field(False)
    muon_mask: Any = checked_field(matrix_mask, None, static=True, kw_only=True)
    consistent_rms: ScalarOrSchedule | None = hyper(
        0.2, low=0.0, low_open=True, optional=True, kw_only=True
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

    moments = (
        Moment("mu", dtype=mu_dtype),
        Moment("nu", dtype=nu_dtype, nonnegative=True),
    )

    def __check_init__(self):
        check_coeffs(self.ns_coeffs, self.ns_steps)

    def init(self, params: Params) -> AdaMuonState:
        leaf_axes(self.muon_mask, params)  # checked
        decay_flags(self.weight_decay_mask, params, "weight_decay_mask")  # checked
        return AdaMuonState(
            step=zero_step(),
            mu=moment_like(self, params, "mu"),
            nu=moment_like(self, params, "nu"),
        )

    def transform(
        self, grads: Grads, state: AdaMuonState, params: Params
    ) -> tuple[Updates, AdaMuonState]:
        axes = leaf_axes(self.muon_mask, params)
        is_muon = [a is not None for a in axes]
        decays = decay_flags(self.weight_decay_mask, params, "weight_decay_mask")
        t = increment(state.step)
        h = values_at(self, state.step)
        direction = _adamuon_direction(self, h, t)
        lr, wd = h.learning_rate, h.weight_decay

        def adamuon_rule(g, p, mu, nu, flag):
            leaf_axes_, decay = flag
            update, mu, nu = direction(g, mu, nu, leaf_axes_)
            if decay:
                update = update + wd * p
            return -lr * update, mu, nu

        updates, (mu, nu), _, _ = map_matrices_and_rest(
            adamuon_rule,
            adamw_rule(h, t, nesterov=False),
            grads,
            params,
            is_muon,
            shared=(state.mu, state.nu),
            matrix_flags=list(zip(axes, decays)),
            other_flags=decays,
        )
        return updates, AdaMuonState(step=t, mu=mu, nu=nu)


def _adamuon_direction(opt: AdaMuon, h: Any, t: Int[Array, ""]) -> Any:
    """AdaMuon's step for one leaf before the learning rate and decay, as
    `direction(g, mu, nu, axes) -> (D, new mu, new nu)`."""
    beta, beta2, eps, rms = h.beta, h.beta2, h.eps, h.consistent_rms
    coeffs = coefficient_rows(opt.ns_coeffs, opt.ns_steps)
    nesterov, sign = opt.nesterov, opt.sign_momentum
    how = dict(gram=opt.gram_newton_schulz, floor=True)

    def direction(g, mu, nu, axes):
        mu = beta * mu + (1 - beta) * g
        if g.size == 0:  # an empty matrix: nothing to orthogonalise or scale
            return jnp.zeros_like(g), mu, nu
        x = beta * mu + (1 - beta) * g if nesterov else mu
        if sign:
            x = jnp.sign(x)
        matrices, back = to_matrices(x, axes)
        o = back(_orthogonalise(matrices, coeffs, _NS_FLOOR, **how))
        nu = beta2 * nu + (1 - beta2) * abs_sq(o)
        o_hat, back = to_matrices(
            o / (jnp.sqrt(nu / (1 - step_power(beta2, t))) + eps), axes
        )
        norm = jnp.sqrt(jnp.sum(abs_sq(o_hat), axis=(-2, -1), keepdims=True))
        m, n = fans(g.shape, axes)
        if rms is None:  # Jordan's width scaling of the unit-RMS-per-entry step
            scale = (max(1.0, n / m) * min(m, n)) ** 0.5
        else:
            scale = rms * (m * n) ** 0.5
        return back(scale * o_hat / (norm + eps)), mu, nu

    return direction
