"""Scion: momentum steered by a linear minimisation oracle per layer."""

import math
from collections.abc import Callable
from typing import Any, TypeAlias

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import is_concrete, static_count
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
from ..._core._leafwise import map_leaves
from ..._core._masks import checked_leaves, decay_flags, is_kept_function
from ..._core._moments import Moment, moment_like
from ..._core._real import RealOnly
from ..._core._structure import FrozenTree, is_none, structure_mismatch
from ..._core._tree import abs_sq, increment, is_float_leaf, step_power, zero_step
from .._preconditioned._muon import _orthogonalise
from .._preconditioned._orthogonal import (
    check_coeffs,
    coefficient_rows,
    ns_coeffs as ns_coeffs_field,
)

NORMS = ("auto", "spectral", "sign", "col", "row", "rms", "none")

# heavyball's floor of the norm Newton-Schulz divides by.
_NS_FLOOR = 1e-7


def _norm_leaf(name: str, path: str, value: Any) -> str:
    if isinstance(value, str) and value in NORMS:
        return value
    raise ValueError(f"{name}{path} must be one of {NORMS}, got {value!r}")


# What `norms` takes: an oracle's name for every leaf, a tree of names, or a
# function of the parameters giving one.
NormsLike: TypeAlias = str | PyTree[str] | Callable[[PyTree], PyTree[str]]


def lmo_norms(name: str, value: NormsLike) -> Any:
    """The converter of Scion's `norms`: one name for every leaf, a function of
    params (kept), or a tree of names (frozen for a static field)."""
    if isinstance(value, str):
        return _norm_leaf(name, "", value)
    if is_kept_function(name, value):
        return value
    if value is None:
        raise ValueError(f"{name} must be one of {NORMS}, a tree of them or a function")
    treedef, leaves = checked_leaves(name, value, _norm_leaf)
    return FrozenTree(name, treedef, tuple(leaves))


_NEEDS = {
    "spectral": (2, "at least 2 dimensions (axis 0 against the rest)"),
    "col": (2, "2 dimensions"),
    "row": (2, "2 dimensions"),
}


def leaf_norms(norms: Any, params: Params, name: str = "norms") -> list[str | None]:
    """Per leaf of `params` (in `jax.tree.leaves` order), the oracle of each float
    leaf (`"auto"` resolved by `ndim`: 2 to 4 `"spectral"`, else `"rms"`) and
    `None` at the others; checked against each leaf's shape."""
    with_paths = jax.tree.leaves_with_path(params)
    if isinstance(norms, str):
        values = [norms] * len(with_paths)
    else:
        tree = norms.tree() if isinstance(norms, FrozenTree) else norms
        if callable(tree) and not isinstance(tree, eqx.Module):
            result = tree(params)
            treedef, leaves = checked_leaves(name, result, _norm_leaf)
            tree = jax.tree.unflatten(treedef, leaves)
        mask_leaves, mask_def = jax.tree.flatten(tree, is_leaf=is_none)
        try:
            subtrees = mask_def.flatten_up_to(params)
        except (ValueError, TypeError):
            raise structure_mismatch(tree, name, params, "params") from None
        values = []
        for value, sub in zip(mask_leaves, subtrees):
            if value is None:
                raise ValueError(f"{name} must name an oracle for every leaf, got None")
            values.extend([value] * len(jax.tree.leaves(sub)))
    out: list[str | None] = []
    for (path, p), value in zip(with_paths, values):
        if not is_float_leaf(p):
            out.append(None)
            continue
        if value == "auto":
            value = "spectral" if p.ndim in (2, 3, 4) else "rms"
        if value in _NEEDS:
            least, what = _NEEDS[value]
            if p.ndim < least or (value != "spectral" and p.ndim != least):
                raise ValueError(
                    f"{name} gives params{jax.tree_util.keystr(path)}, of shape "
                    f"{p.shape}, the {value!r} oracle, which needs {what}"
                )
        out.append(value)
    return out


class ScionState(eqx.Module):
    """State of `Scion`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: the momentum, shaped like params (bias-corrected as it is kept, with
      `bias_correction`).
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]


class Scion(AbstractTransform):
    r"""Scion (Pethick et al., 2025): the momentum of each leaf is turned into a
    step of fixed size in a norm chosen for the layer, by that norm's linear
    minimisation oracle (LMO): spectral (Newton-Schulz) for hidden matrices, sign
    or column and row norms for embeddings and heads, RMS for vectors.

    With $t = \mathrm{step} + 1$, `lr` and `wd` the learning rate and weight decay
    at `step`, $\rho$ the radius `scale`:

    $$
    \begin{aligned}
    \hat\beta &= 1 - \frac{1 - \beta}{1 - \beta^t}
        && \text{(bias\_correction; else } \hat\beta = \beta) \\
    d &\leftarrow \hat\beta\, d + (1 - \hat\beta)\, g \\
    p &\leftarrow p - \mathrm{lr} \left(\rho \operatorname{lmo}(d)
        + \mathrm{wd} \cdot p\right) && \text{(unconstrained)} \\
    p &\leftarrow (1 - \mathrm{lr})\, p - \mathrm{lr}\, \rho \operatorname{lmo}(d)
        && \text{(constrained: towards the ball of radius } \rho)
    \end{aligned}
    $$

    The oracle of each leaf $X$ (the direction of steepest descent of unit size in
    its norm; the step is $-\operatorname{lmo}$ here), with $d_0$, $d_1$ its
    first two dimensions and $\epsilon$ `eps`:

    - `"spectral"`: $\sqrt{d_0 / d_1}\, \operatorname{NewtonSchulz}(X) / k$ with
      $X$ taken as a $(d_0, \cdot)$ matrix and $k$ the product of its further
      dimensions (a convolution's kernel size; 1 for a matrix);
    - `"sign"`: $\operatorname{sign}(X) / d_1$ (a vector or scalar: $/1$);
    - `"col"`: each column divided by $\max(\|X_{:,j}\| / \sqrt{d_0}, \epsilon)$;
    - `"row"`: each row divided by $\max(\sqrt{d_1}\, \|X_{i,:}\|, \epsilon)$;
    - `"rms"`: $X / \max(\sqrt{\operatorname{mean}_0 X^2}, \epsilon)$, the mean
      over axis 0 (a scalar: $X / \max(|X|, \epsilon)$);
    - `"none"`: $X$ (momentum SGD);
    - `"auto"` (the default): heavyball's choice by `ndim`, `"spectral"` for 2 to 4
      dimensions and `"rms"` otherwise.

    With the defaults this is heavyball 3.2.1's `Scion` (debiased momentum, the
    auto norm, Newton-Schulz with its per-step coefficients, the `"dion"`
    preset, and the input divided by its Frobenius norm floored at $10^{-7}$;
    its weight decay `p * (1 - lr wd)`): `constrained=True` is its
    `weight_decay=1`. heavyball also overwrites the parameters at its first step
    with its own initialisation (orthogonal matrices scaled as the oracle,
    zero vectors); eqxopt leaves the initialisation to the model. With
    `bias_correction=False` and `beta` $= 1 -$ its `momentum` it is
    `pytorch_optimizer.SCION`'s step (its `Col()`, `Row()` and `Sign()` with
    their default options; it adds `eps` where heavyball and eqxopt floor at
    it). Weights are read as `(out, in, *kernel)`, the layout of
    `equinox.nn.Linear`, `equinox.nn.Conv` and torch.

    The paper's radii differ by layer (a larger one for the output head): give
    each group its own `Scion` in `eqxopt.Partition`.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `beta`: momentum, in `[0, 1)`.
    - `scale`: the radius $\rho$, `> 0`.
    - `norms`: which oracle each leaf gets: one of `"auto"`, `"spectral"`,
      `"sign"`, `"col"`, `"row"`, `"rms"`, `"none"` for every leaf, a tree (or
      prefix of params) of them, or a function of params returning one (as
      `Muon`'s `muon_mask`). `"spectral"` needs a leaf with at least 2
      dimensions, `"col"` and `"row"` one with exactly 2.
    - `constrained`: the conditional-gradient step (the parameters shrink by `lr`
      towards the ball of radius `scale`); then `weight_decay` must be 0.
    - `bias_correction`: heavyball's debiased momentum (`True`) or the paper's
      plain average (`False`).
    - `eps`: the floor of the norms the `"col"`, `"row"` and `"rms"` oracles
      divide by, `> 0`.
    - `ns_steps`: the number of Newton-Schulz steps (static int `>= 1`).
    - `ns_coeffs`: the quintic's coefficients, as `Muon`'s (default `"dion"`,
      heavyball's per-step rows).
    - `weight_decay`: decoupled decay of the unconstrained step, `>= 0`.
    - `weight_decay_mask`: which leaves decay: `None` (all), a tree of bools (or a
      prefix of params) or a function of params returning one.
    - `mu_dtype`: how to store the momentum: a dtype (`None`: the parameter's) or
      a block-wise quantized storage such as `eqxopt.Blockwise8bit()`.

    **Reference:** Pethick, Xie, Antonakopoulos, Zhu, Silveti-Falls and Cevher,
    *Training Deep Learning Models with Norm-Constrained LMOs*, ICML 2025,
    [arXiv:2502.07529](https://arxiv.org/abs/2502.07529).

    **Example:**

    ```python
    import jax
    import jax.numpy as jnp
    import eqxopt

    params = {"w": jax.random.normal(jax.random.key(0), (4, 3)), "b": jnp.zeros(3)}
    grads = {"w": jax.random.normal(jax.random.key(1), (4, 3)), "b": jnp.ones(3)}
    opt = eqxopt.Scion(learning_rate=0.1, norms={"w": "spectral", "b": "sign"})
    state = opt.init(params)
    new, state = opt.step(grads, state, params)
    # the matrix's step is orthogonal (scaled by sqrt(4 / 3)); the vector's a sign
    singular_values = jnp.linalg.svd(new["w"] - params["w"], compute_uv=False)
    assert jnp.allclose(singular_values, 0.1 * (4 / 3) ** 0.5, rtol=0.3)
    assert jnp.allclose(new["b"], -0.1)
    ```
    """

    reads_params = None  # only the options that say so (`params_needed`)
    real_only = RealOnly("its oracles take signs and real norms")

    learning_rate: ScalarOrSchedule = learning_rate_field()
    beta: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True, kw_only=True)
    scale: ScalarOrSchedule = hyper(1.0, low=0.0, low_open=True, kw_only=True)
    norms: Any = checked_field(lmo_norms, "auto", static=True, kw_only=True)
    constrained: bool = flag_field(False, reads_params=True)
    bias_correction: bool = flag_field(True)
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0, low_open=True, kw_only=True)
    # Static: the number of Newton-Schulz steps unrolled in the compiled step.
    ns_steps: int = checked_field(static_count, 5, static=True, kw_only=True)
    ns_coeffs: Float[Array, "*k 3"] = checked_field(
        ns_coeffs_field, "dion", kw_only=True
    )
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    weight_decay_mask: MaskLike = mask_field()
    mu_dtype: StorageLike = dtype_field(storage=True)

    moments = (Moment("mu", dtype=mu_dtype),)

    def __check_init__(self):
        check_coeffs(self.ns_coeffs, self.ns_steps)
        wd = self.weight_decay
        if self.constrained and not (
            isinstance(wd, jax.Array) and (not is_concrete(wd) or float(wd) == 0)
        ):
            raise ValueError(
                "weight_decay must be 0 with constrained=True (the constrained step "
                f"shrinks the parameters by lr itself), got {wd!r}"
            )

    def init(self, params: Params) -> ScionState:
        leaf_norms(self.norms, params)  # checked
        decay_flags(self.weight_decay_mask, params, "weight_decay_mask")  # checked
        return ScionState(step=zero_step(), mu=moment_like(self, params, "mu"))

    def transform(
        self, grads: Grads, state: ScionState, params: Params
    ) -> tuple[Updates, ScionState]:
        norms = leaf_norms(self.norms, params)
        decays = decay_flags(self.weight_decay_mask, params, "weight_decay_mask")
        t = increment(state.step)
        h = values_at(self, state.step)
        lr, beta, radius, eps, wd = (
            h.learning_rate,
            h.beta,
            h.scale,
            h.eps,
            h.weight_decay,
        )
        coeffs = coefficient_rows(self.ns_coeffs, self.ns_steps)
        constrained = self.constrained
        # heavyball's debiased average is kept bias-corrected.
        weight = (
            (1 - beta) / (1 - step_power(beta, t)) if self.bias_correction else 1 - beta
        )

        def lmo(x, norm):
            if norm == "spectral":
                if x.size == 0:
                    return jnp.zeros_like(x)
                shape = x.shape
                flat = jnp.reshape(x, (shape[0], -1))
                o = _orthogonalise(flat, coeffs, _NS_FLOOR, floor=True)
                scale = math.sqrt(shape[0] / max(shape[1], 1)) / max(
                    math.prod(shape[2:]), 1
                )
                return jnp.reshape(o, shape) * scale
            if norm == "sign":
                return jnp.sign(x) / (x.shape[1] if x.ndim >= 2 else 1)
            if norm == "col":
                col = jnp.sqrt(jnp.sum(abs_sq(x), axis=0, keepdims=True))
                return x / jnp.maximum(col / math.sqrt(x.shape[0]), eps)
            if norm == "row":
                row = jnp.sqrt(jnp.sum(abs_sq(x), axis=-1, keepdims=True))
                return x / jnp.maximum(row * math.sqrt(x.shape[-1]), eps)
            if norm == "rms":
                if x.ndim == 0:
                    return x / jnp.maximum(jnp.abs(x), eps)
                rms = jnp.sqrt(jnp.mean(abs_sq(x), axis=0, keepdims=True))
                return x / jnp.maximum(rms, eps)
            return x  # "none"

        def rule(g, p, mu, flag):
            norm, decay = flag
            mu = mu * (1 - weight) + g * weight
            step = radius * lmo(mu, norm)
            if constrained:
                step = step + p
            elif decay:
                step = step + wd * p
            return -lr * step, mu

        updates, (mu,) = map_leaves(
            rule, grads, params, (state.mu,), flags=list(zip(norms, decays))
        )
        return updates, ScionState(step=t, mu=mu)
