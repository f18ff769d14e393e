"""HyperBallAdamW: RMS-normalised steps that keep each weight on a sphere of the
norm it started with."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._fields import (
    MaskLike,
    ScalarOrSchedule,
    StorageLike,
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
from ..._core._real import RealOnly
from ..._core._tree import (
    abs_sq,
    compute_dtype,
    increment,
    is_float_leaf,
    real_compute_dtype,
    step_power,
    zero_step,
)
from .._preconditioned._muon import _merge, _select

# heavyball's floor of the norms it divides by.
_TINY = 1e-12


class HyperBallAdamWState(eqx.Module):
    """State of `HyperBallAdamW`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `nu`: the bias-corrected moving average of the squared gradient, shaped like
      params.
    - `radius`: at the hyperball leaves, the Frobenius norm of the whole leaf (a
      scalar in float32 at least) that every step keeps: the norm `init` saw,
      measured again from the parameters of the first step; `None` elsewhere.
    """

    step: Int[Array, ""]
    nu: PyTree[Float[Array, "..."] | None]
    radius: PyTree[Float[Array, ""] | None]


def hyperball_flags(mask: MaskLike, params: Params) -> list[bool]:
    """Which leaves stay on their sphere: by default every float leaf with
    `ndim >= 2` (heavyball's route), else those `mask` selects."""
    leaves = jax.tree.leaves(params)
    if mask is None:
        return [is_float_leaf(p) and p.ndim >= 2 for p in leaves]
    flags = decay_flags(mask, params, "hyperball_mask")
    return [f and is_float_leaf(p) for p, f in zip(leaves, flags)]


def _norm(x: Array) -> Array:
    return jnp.sqrt(jnp.sum(abs_sq(x)))


def cautioned(g: Array, u: Array) -> Array:
    """heavyball's caution: `u` zeroed where its sign bit differs from `g`'s, and
    the rest scaled by `size / max(1, kept)`."""
    mask = jnp.signbit(g) != jnp.signbit(u)
    kept = jnp.maximum(u.size - jnp.sum(mask), 1).astype(u.dtype)
    return jnp.where(mask, 0, u) * (u.size / kept)


class HyperBallAdamW(AbstractTransform):
    r"""HyperBallAdamW (as heavyball 3.2.1's `HyperBallAdamW`): steps normalised by
    the root of a second moment, and each weight matrix kept on the sphere of the
    Frobenius norm it started with; plain decoupled steps for the other leaves.

    With $t = \mathrm{step} + 1$, `lr` and `wd` the learning rate and weight decay at
    `step`, $\|\cdot\|$ the Frobenius norm of the whole leaf and $r$ that norm of
    the leaf at the first step:

    $$
    \begin{aligned}
    \hat\beta &= 1 - \frac{1 - \beta_2}{1 - \beta_2^t} \\
    \hat\nu &\leftarrow \hat\beta\, \hat\nu + (1 - \hat\beta)\, g^2
        && \text{(kept bias-corrected)} \\
    u &= g / \max(\sqrt{\hat\nu}, \epsilon) + \mathrm{wd} \cdot p \\
    q &= p - \mathrm{lr} \cdot r \, \frac{u}{\max(\|u\|, 10^{-12})}
        && \text{(hyperball leaves)} \\
    p &\leftarrow r \, \frac{q}{\max(\|q\|, 10^{-12})} \\
    p &\leftarrow p - \mathrm{lr} \cdot u && \text{(every other leaf)}
    \end{aligned}
    $$

    The hyperball leaves are by default every float leaf with `ndim >= 2`;
    each step moves such a weight by an angle of about `lr` radians on its
    sphere, whatever the gradient's scale.

    heavyball's optimizer has no first moment (its `betas[0]` is not read) and
    floors the root at `eps` rather than adding it. With `caution` (Liang et al.,
    2024) the step (after the decay, at a hyperball leaf) is zeroed where its sign
    differs from the gradient's and scaled by `size / kept`; with
    `cautious_weight_decay` the decay applies only where the parameter's sign is
    the step's. As heavyball, the radius is measured at the first step, so
    weights loaded after `init` keep their own norm.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module (at a
      hyperball leaf, the angle of each step in radians, about).
    - `b2`: decay of the second moment, in `(0, 1)`.
    - `eps`: floor of the root of the second moment, `> 0`.
    - `weight_decay`: added to the step as `wd * p` before it is normalised at a
      hyperball leaf (there it turns the step towards the origin, and the sphere
      keeps the norm), decoupled elsewhere; `>= 0`.
    - `weight_decay_mask`: which leaves decay: `None` (all), a tree of bools (or a
      prefix of params) or a function of params returning one.
    - `hyperball_mask`: which leaves are kept on their sphere: `None` (every float
      leaf with `ndim >= 2`), a tree of bools or a function of params returning
      one.
    - `caution`: heavyball's cautious masking of the step.
    - `cautious_weight_decay`: decay only where the parameter and step agree in
      sign.
    - `nu_dtype`: how to store the second moment: a dtype (`None`: the
      parameter's) or a block-wise quantized storage such as
      `eqxopt.Blockwise8bit()`.

    **Reference:** Wen et al., *Fantastic Pretraining Optimizers and Where to Find
    Them*, Section 2.1, "HyperBall Optimization", 2025; implemented as heavyball's
    `HyperBallAdamW` (`scale_by_exp_avg_sq`, then `update_by_hyperball` for
    `ndim >= 2` and `apply_update` for the rest).

    **Example:**

    ```python
    import jax
    import jax.numpy as jnp
    import eqxopt

    params = {"w": jax.random.normal(jax.random.key(0), (4, 3)), "b": jnp.zeros(3)}
    grads = {"w": jax.random.normal(jax.random.key(1), (4, 3)), "b": jnp.ones(3)}
    opt = eqxopt.HyperBallAdamW(learning_rate=0.05)
    state = opt.init(params)
    new, state = opt.step(grads, state, params)
    # the matrix keeps its norm; the vector moves against the gradient
    assert jnp.allclose(jnp.linalg.norm(new["w"]), jnp.linalg.norm(params["w"]))
    assert bool((new["b"] < 0).all())
    ```
    """

    reads_params = "hyperball projection"
    real_only = RealOnly("its cautious options compare signs", when="compares_signs")

    learning_rate: ScalarOrSchedule = learning_rate_field()
    b2: ScalarOrSchedule = hyper(
        0.99, low=0.0, high=1.0, low_open=True, high_open=True, kw_only=True
    )
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0, low_open=True, kw_only=True)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)
    weight_decay_mask: MaskLike = mask_field()
    hyperball_mask: MaskLike = mask_field()
    caution: bool = flag_field(False)
    cautious_weight_decay: bool = flag_field(False)
    nu_dtype: StorageLike = dtype_field(storage=True)

    moments = (Moment("nu", dtype=nu_dtype, nonnegative=True),)

    @property
    def compares_signs(self) -> bool:
        """Whether an option reads signs (then complex leaves are refused)."""
        return self.caution or self.cautious_weight_decay

    def init(self, params: Params) -> HyperBallAdamWState:
        flags = hyperball_flags(self.hyperball_mask, params)
        decay_flags(self.weight_decay_mask, params, "weight_decay_mask")  # checked
        leaves, treedef = jax.tree.flatten(params)
        radius = [
            _norm(p.astype(compute_dtype(p.dtype))).astype(real_compute_dtype(p.dtype))
            if f
            else None
            for p, f in zip(leaves, flags)
        ]
        return HyperBallAdamWState(
            step=zero_step(),
            nu=moment_like(self, params, "nu"),
            radius=treedef.unflatten(radius),
        )

    def transform(
        self, grads: Grads, state: HyperBallAdamWState, params: Params
    ) -> tuple[Updates, HyperBallAdamWState]:
        on_ball = hyperball_flags(self.hyperball_mask, params)
        decays = decay_flags(self.weight_decay_mask, params, "weight_decay_mask")
        t = increment(state.step)
        h = values_at(self, state.step)
        lr, b2, eps, wd = h.learning_rate, h.b2, h.eps, h.weight_decay
        caution, cautious_decay = self.caution, self.cautious_weight_decay
        first = state.step == 0  # heavyball measures the radius at its first step
        # heavyball's debiased decay: the average is kept bias-corrected.
        weight = (1 - b2) / (1 - step_power(b2, t))

        def normalised(g, nu):
            nu = nu * (1 - weight) + abs_sq(g) * weight
            return g / jnp.maximum(jnp.sqrt(jnp.maximum(nu, 0)), eps), nu

        def decay_of(p, u):
            if not cautious_decay:
                return wd
            return wd * (jnp.signbit(p) == jnp.signbit(u)).astype(p.dtype)

        def ball_rule(g, p, nu, radius, decay):
            radius = jnp.where(first, _norm(p).astype(radius.dtype), radius)
            u, nu = normalised(g, nu)
            if decay:
                u = u + p * decay_of(p, u)
            if caution:
                u = cautioned(g, u)
            u = u / jnp.maximum(_norm(u), _TINY)
            q = p - lr * u * radius
            new = q * (radius / jnp.maximum(_norm(q), _TINY))
            return new - p, nu, radius

        def flat_rule(g, p, nu, decay):
            u, nu = normalised(g, nu)
            if caution:
                u = cautioned(g, u)
            if decay:
                u = u + p * decay_of(p, u)
            return -lr * u, nu

        off_ball = [not f for f in on_ball]
        ball_updates, (ball_nu, radius) = map_leaves(
            ball_rule,
            _select(grads, params, on_ball, grads=True),
            params,
            (_select(state.nu, params, on_ball), state.radius),
            flags=decays,
        )
        flat_updates, (flat_nu,) = map_leaves(
            flat_rule,
            _select(grads, params, off_ball, grads=True),
            params,
            (_select(state.nu, params, off_ball),),
            elementwise=not caution,
            flags=decays,
        )
        return _merge(ball_updates, flat_updates, params, on_ball), HyperBallAdamWState(
            step=t,
            nu=_merge(ball_nu, flat_nu, params, on_ball),
            radius=radius,
        )
