"""Sophia (Liu et al., 2023): clipped steps preconditioned by a moving average of
the Hessian's diagonal (`optax.contrib.sophia`)."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PyTree, UInt32

from ..._core import _shards
from ..._core._base import AbstractTransform, Grads, Params, Supplied, Updates, supplies
from ..._core._checks import renames
from ..._core._fields import (
    DTypeLike,
    MaskLike,
    ScalarOrSchedule,
    checked_field,
    count_field,
    dtype_field,
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
    align_grads,
    float_leaves_like,
    increment,
    is_float_leaf,
    zero_step,
)


def _seed_key(name: str, value: int | Array) -> Array:
    """An int seed (or a default-implementation typed key) as raw uint32 key data,
    the form `jax.random.PRNGKey` gives and optax keeps in its state."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return jax.random.key_data(jax.random.key(int(value)))
    if isinstance(value, jax.Array) and jnp.issubdtype(
        value.dtype, jax.dtypes.prng_key
    ):
        if value.shape != ():
            raise ValueError(f"{name} must be a single key, got shape {value.shape}")
        return jax.random.key_data(value)
    raise TypeError(
        f"{name} must be an integer seed or a typed JAX key (jax.random.key), got "
        f"{type(value).__name__}"
    )


class SophiaState(eqx.Module):
    """State of `Sophia`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: the moving average of gradients, shaped like params (`None` at non-float
      leaves).
    - `nu`: the moving average of the Hessian diagonal's estimates, shaped like
      params (`None` at non-float leaves).
    - `key`: raw uint32 key data for the next Hutchinson estimate.
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]
    key: UInt32[Array, " 2"]


class Sophia(AbstractTransform):
    r"""Sophia (Liu et al., 2023, "Sophia: A Scalable Stochastic Second-order
    Optimizer for Language Model Pre-training"): a moving average of gradients
    divided by a moving average `nu` of the Hessian's diagonal, clipped element-wise.

    With `t = step + 1`, and `h` a fresh estimate of the Hessian's diagonal taken
    every `update_interval` steps (at steps 0, k, 2k, ...):

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, g \\
    u &= \operatorname{clip}\left(\frac{\mu / (1 - b_1^t)}{\max(\gamma \nu, \epsilon)},
        -c, c\right) && \text{($\nu$ before this step)} \\
    p &\leftarrow p - \mathrm{lr} \left(u + \mathrm{weight\_decay} \cdot p\right)
        && \text{(decay only where \texttt{mask})} \\
    \nu &\leftarrow b_2 \nu + (1 - b_2)\, h && \text{(only at an estimate step)}
    \end{aligned}
    $$

    The estimate is Sophia-H's Hutchinson estimator by default: with Rademacher
    signs `r` drawn from the key in the state, `h = r * (Hessian @ r)`, a
    Hessian-vector product of the loss `obj_fn` (pass `obj_fn=` to
    `update`/`step`, and the batch in `fn_args`: `obj_fn(params, *fn_args)` is a
    scalar). For Sophia-G, or any estimator of your own, pass the estimate itself
    as `hessian=` (a tree shaped like params; read at estimate steps only). The
    same as `optax.contrib.sophia` with its default Hutchinson estimator and the
    same seed (the same signs). Real parameters only: the clip and the `max`
    compare magnitudes.

    `obj_fn` is part of the compiled step's cache key (by identity): make it once,
    outside the loop, and pass each batch through `fn_args`.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: decay of the gradient average, in `[0, 1)`.
    - `b2`: decay of the Hessian average, in `[0, 1)` (per estimate: with the
      default interval 10, `0.99` is about `0.999` per step).
    - `eps`: the floor of `gamma * nu`, `> 0`.
    - `weight_decay`: decoupled decay coefficient, `>= 0`.
    - `gamma`: the scale of the Hessian average, `> 0`.
    - `clip_threshold`: the clip `c`, `> 0`; `None` does not clip.
    - `update_interval`: steps between Hessian estimates, an int `>= 1` (an array
      field: a new value does not recompile).
    - `seed`: the seed of the Hutchinson signs (an int, or a typed key from
      `jax.random.key`); optax's default is 0.
    - `mask`: which leaves get weight decay: `None` (all), a tree of bools (or a
      prefix of params' structure), or a function of params returning one.
    - `mu_dtype`: dtype to store `mu` in; `None` keeps each parameter's dtype.
    """

    reads_params = "Hessian estimate (obj_fn is evaluated at the parameters)"

    # optax's spellings (`_checks.refuse_renamed`)
    renamed_arguments = renames(
        weight_decay_mask=("mask",),
        hessian_diagonal_fn="pass obj_fn= (or hessian=) to update/step",
    )

    learning_rate: ScalarOrSchedule = learning_rate_field()
    b1: ScalarOrSchedule = hyper(0.965, low=0.0, high=1.0, high_open=True)
    b2: ScalarOrSchedule = hyper(0.99, low=0.0, high=1.0, high_open=True)
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0, low_open=True)
    weight_decay: ScalarOrSchedule = weight_decay_field(1e-4, kw_only=False)
    gamma: ScalarOrSchedule = hyper(0.01, low=0.0, low_open=True, kw_only=True)
    clip_threshold: ScalarOrSchedule | None = hyper(
        1.0, low=0.0, low_open=True, optional=True, kw_only=True
    )
    update_interval: Int[Array, ""] = count_field(10, kw_only=True)
    seed: UInt32[Array, " 2"] = checked_field(_seed_key, 0, kw_only=True)
    mask: MaskLike = mask_field()
    mu_dtype: DTypeLike = dtype_field(storage=True)

    real_only = RealOnly("its clip compares magnitudes", trees=("params", "grads"))

    moments = (Moment("mu", dtype=mu_dtype),)
    keywords = supplies(
        obj_fn=Supplied.LOSS_FUNCTION, fn_args=Supplied.CALLER, hessian=Supplied.CALLER
    )

    def init(self, params: Params) -> SophiaState:
        decay_flags(self.mask, params)  # a bad mask fails here
        return SophiaState(
            step=zero_step(),
            mu=moment_like(self, params, "mu"),
            nu=float_leaves_like(params),
            key=jnp.array(self.seed, copy=True),
        )

    def _hutchinson(self, obj_fn, fn_args, key, params):
        """`r * (H @ r)` with Rademacher `r` (per leaf, keys as optax splits
        them), and the next key."""
        key, subkey = jax.random.split(jax.random.wrap_key_data(key))
        leaves, treedef = jax.tree.flatten(params)
        keys = jax.random.split(subkey, len(leaves))
        # Inside shard_map a tangent must vary over the mesh axes its primal
        # varies over (the signs, drawn from the shared key, vary over none).
        signs = treedef.unflatten(
            [
                _shards.like_varying(
                    jax.random.rademacher(k, p.shape, jnp.float32).astype(p.dtype), p
                )
                if is_float_leaf(p)
                else None
                for k, p in zip(keys, leaves)
            ]
        )
        grad_fn = eqx.filter_grad(lambda q: obj_fn(q, *fn_args))
        _, hvp = eqx.filter_jvp(grad_fn, (params,), (signs,))
        # Where the loss ignores a leaf or is linear in it, the product is a
        # symbolic zero, which `filter_jvp` gives as `None`: the estimate is 0.
        product = jax.tree.map(
            lambda h, r: (
                None if r is None else jnp.zeros_like(r) if h is None else h * r
            ),
            hvp,
            signs,
            is_leaf=lambda x: x is None,
        )
        return product, jax.random.key_data(key)

    def transform(
        self,
        grads: Grads,
        state: SophiaState,
        params: Params,
        *,
        obj_fn: Callable[..., Any] | None = None,
        fn_args: tuple = (),
        hessian: PyTree | None = None,
    ) -> tuple[Updates, SophiaState]:
        if (obj_fn is None) == (hessian is None):
            raise TypeError(
                "Sophia.update/step need exactly one of obj_fn= (the loss, "
                "obj_fn(params, *fn_args) -> scalar, for the Hutchinson estimate of "
                "the Hessian's diagonal) and hessian= (an estimate of your own)"
            )
        h = values_at(self, state.step)
        t = increment(state.step)
        estimate = state.step % self.update_interval == 0
        treedef = jax.tree.structure(params)

        def zeros():
            return float_leaves_like(params, jnp.float32)

        if hessian is not None:
            diag = treedef.unflatten(
                [
                    None if d is None else jnp.asarray(d, jnp.float32)
                    for d in align_grads(hessian, params)
                ]
            )
            key = state.key
        else:
            assert obj_fn is not None

            def fresh():
                d, k = self._hutchinson(obj_fn, fn_args, state.key, params)
                d = treedef.unflatten(
                    [
                        None if x is None else x.astype(jnp.float32)
                        for x in align_grads(d, params)
                    ]
                )
                return d, k

            diag, key = _shards.cond(estimate, fresh, lambda: (zeros(), state.key))
        # The estimate passes through the engine as a moment (its output dropped).
        diag = jax.tree.map(
            lambda d, p: None if p is None or not is_float_leaf(p) else d,
            diag,
            params,
            is_leaf=lambda x: x is None,
        )
        b1, b2 = h.b1, h.b2
        t_ = t.astype(jnp.float32)

        def rule(g, p, mu, nu, d, decayed):
            mu = b1 * mu + (1 - b1) * g
            u = (mu / (1 - b1**t_)) / jnp.maximum(h.gamma * nu, h.eps)
            if (clip := h.clip_threshold) is not None:
                u = jnp.clip(u, -clip, clip)
            if decayed:
                u = u + h.weight_decay * p
            nu = jnp.where(estimate, b2 * nu + (1 - b2) * d, nu)
            return -h.learning_rate * u, mu, nu, d

        updates, (mu, nu, _) = map_leaves(
            rule,
            grads,
            params,
            (state.mu, state.nu, diag),
            elementwise=True,
            flags=decay_flags(self.mask, params),
        )
        return updates, SophiaState(step=t, mu=mu, nu=nu, key=key)
