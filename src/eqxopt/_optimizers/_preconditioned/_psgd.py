"""PSGD with a Kronecker-factored preconditioner (Li, 2015/2018): PSGD-Kron as
`kron.py` (psgd_torch, psgd_jax) has it, the algorithm of heavyball's
`ForeachPSGDKron`."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PyTree, UInt32

from ..._core import _shards
from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import optional_static_count, static_count
from ..._core._fields import (
    ScalarOrSchedule,
    checked_field,
    flag_field,
    hyper,
    learning_rate_field,
    values_at,
    weight_decay_field,
)
from ..._core._param_sharding import split_like
from ..._core._real import RealOnly
from ..._core._round_robin import map_round_robin, work_mesh
from ..._core._tree import (
    align_grads,
    compute_dtype,
    float_leaves_like,
    increment,
    is_float_leaf,
    zero_step,
)
from ._blocks import Layout, from_blocks, layout, to_blocks

_WHY = "its preconditioner factors are real triangular matrices"

# The smallest normaliser of a factor's step (as psgd_jax: an all-zero statistic
# leaves the factor as it is instead of dividing by zero).
_TINY = 1e-30


def _key_data(name: str, key: Any) -> tuple[Array, str]:
    """Raw key data and the name of its PRNG implementation, from an int seed or
    a typed JAX key."""
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        key = jax.random.key(int(key))
    if not (
        isinstance(key, jax.Array)
        and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
        and key.shape == ()
    ):
        raise TypeError(
            f"{name} must be an int seed or a single typed JAX key "
            f"(jax.random.key), got {key!r}"
        )
    return jax.random.key_data(key), str(jax.random.key_impl(key))


class PSGDKronState(eqx.Module):
    """State of `PSGDKron`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `key`: the PRNG key for the next step's draws, as raw `uint32` key data.
    - `mu`: the momentum (exponential average of the gradients), shaped like
      params.
    - `q`: for each float leaf a tuple with one factor per axis of its blocks
      (a 0-d leaf counts as one axis of size 1), stacked over the leaf's blocks:
      `(blocks, b_i, b_i)` upper triangular, or `(blocks, b_i)` for a diagonal
      factor. `None` at non-float and empty leaves.
    """

    step: Int[Array, ""]
    key: UInt32[Array, "..."]
    mu: PyTree[Float[Array, "..."] | None]
    q: PyTree[Any]


def _apply(x: Array, qs: tuple[Array, ...], transpose: bool = False) -> Array:
    """`x` with `Q_i` (or `Q_i^T`) applied along each axis `i`; a 1-D `Q_i` is a
    diagonal."""
    for q in qs:
        if q.ndim == 1:
            x = jnp.moveaxis(x * q.reshape((-1,) + (1,) * (x.ndim - 1)), 0, -1)
        else:
            x = jnp.tensordot(x, q, axes=(0, 0 if transpose else 1))
    return x


def _solve(x: Array, qs: tuple[Array, ...]) -> Array:
    """`x` with `Q_i^{-T}` applied along each axis `i` (`X inv(Q_i)` with axis
    `i` last), by triangular solves."""
    for q in qs:
        x = jnp.moveaxis(x, 0, -1)
        if q.ndim == 1:
            x = x / q
        else:
            flat = x.reshape((-1, q.shape[0]))
            flat = jax.lax.linalg.triangular_solve(
                q, flat, left_side=False, lower=False
            )
            x = flat.reshape(x.shape)
    return x


def _statistic(a: Array, axis: int, diagonal: bool) -> Array:
    """`A_(i) A_(i)^T` summed over the other axes (its diagonal for a diagonal
    factor)."""
    others = [i for i in range(a.ndim) if i != axis]
    if diagonal:
        return jnp.sum(a * a, axis=others)
    return jnp.tensordot(a, a, axes=(others, others))


def norm_lower_bound(a: Array) -> Array:
    """A cheap lower bound of the spectral norm of a square `a` (within about
    `sqrt(2)` of it), as the PSGD authors compute it: `a` applied to its largest
    row or column, normalised."""
    max_abs = jnp.max(jnp.abs(a))
    positive = max_abs > 0
    scale = jnp.where(positive, max_abs, 1)
    a = a / scale
    aa = a * a
    col, row = jnp.sum(aa, axis=0), jnp.sum(aa, axis=1)
    i, j = jnp.argmax(col), jnp.argmax(row)

    def unit(x):
        n = jnp.linalg.norm(x)
        return x / jnp.where(n > 0, n, 1)

    by_col = jnp.linalg.norm(unit(a[:, i] @ a) @ a.T)
    by_row = jnp.linalg.norm(a.T @ unit(a @ a[j, :]))
    bound = jnp.where(col[i] > row[j], by_col, by_row)
    return jnp.where(positive, max_abs * bound, max_abs)


def _update_factors(
    qs: tuple[Array, ...], g: Array, v: Array, precond_lr: Array
) -> tuple[Array, ...]:
    """One step of PSGD's preconditioner fit for one block, from the pair
    `(v, g)`: every factor from the same `A = Q g` and `B = Q^{-T} v`."""
    a = _apply(g, qs)
    b = _solve(v, qs)
    new = []
    for i, q in enumerate(qs):
        diagonal = q.ndim == 1
        t1 = _statistic(a, i, diagonal)
        t2 = _statistic(b, i, diagonal)
        if diagonal:
            norm = jnp.maximum(jnp.max(jnp.abs(t1 + t2)), _TINY)
            new.append(q - precond_lr / norm * (t1 - t2) * q)
        else:
            norm = jnp.maximum(norm_lower_bound(t1 + t2), _TINY)
            new.append(q - precond_lr / norm * jnp.triu(t1 - t2) @ q)
    return tuple(new)


def _balance(qs: tuple[Array, ...]) -> tuple[Array, ...]:
    """The factors rescaled to equal largest magnitudes (their Kronecker product,
    the preconditioner, unchanged)."""
    norms = jnp.stack([jnp.max(jnp.abs(q)) for q in qs])
    gmean = jnp.prod(norms) ** (1 / len(qs))
    return tuple(q * (gmean / n) for q, n in zip(qs, norms))


def _places(leaves: list[Any]) -> list[int]:
    places, count = [], 0
    for p in leaves:
        places.append(count)
        count += int(is_float_leaf(p) and p.size > 0)
    return places


class PSGDKron(AbstractTransform):
    """PSGD-Kron (Li, "Preconditioned Stochastic Gradient Descent", 2015, and
    "Preconditioner on Matrix Lie Group for SGD", 2018): SGD with momentum,
    preconditioned by `P = Q^T Q` with `Q` a Kronecker product of one factor per
    axis (upper triangular, or diagonal), fitted online to the gradient with
    random probe vectors: PSGD-Kron, the algorithm heavyball ships as
    `ForeachPSGDKron`, here as `kron.py` of psgd_torch/psgd_jax has it (the
    momentum debiased and the update's RMS clipped per leaf as the PyTorch
    `kron.py`; heavyball's own defaults and extras are not reproduced).

    Each leaf is cut into blocks as `Shampoo` does (every axis longer than
    `block_size`, if given; zero padding, with the probes zero there, leaves the
    maths of the other entries exact). Axis `i` of a block gets a diagonal factor
    if its length is 1 or above `max_size_triangular`, or if the leaf has fewer
    than `min_ndim_triangular` dimensions; otherwise a triangular one. Factors
    start at `precond_init_scale**(1/n) * I` (`n` axes; a 0-d leaf is one axis
    of length 1). With `k` the step count after this update:

    ```
    key, k_update, k_probe, k_balance = split(key, 4)
    update = uniform(k_update) < update_probability(k)
    m = b1 * m + (1 - b1) * g;   m^ = m / (1 - b1**k)
    if update:
        (v: normal(fold_in(k_probe, i)) for the i-th non-empty float leaf)
        if uniform(k_balance) < 0.01: rescale the factors to equal max |Q_i|
        A = Q h (Q_i along each axis i; h = m^, or g without
            momentum_into_precond_update);   B = Q^{-T} v
        T1_i = A_(i) A_(i)^T;  T2_i = B_(i) B_(i)^T   (over the other axes)
        Q_i = Q_i - precond_lr / ||T1_i + T2_i|| * triu(T1_i - T2_i) Q_i
            (diagonal factors: elementwise, with the largest |entry| as norm;
             ||.|| a lower bound of the spectral norm, as the authors')
    u = Q^T Q m^;   u = u * min(1, 1.1 / (rms(u) + 1e-12))      (per leaf)
    p = p - lr * (u + weight_decay * p)   (decay only for leaves of >= 2 axes)
    ```

    `update_probability=None` is the authors' schedule: 1 for the first 500
    steps, then `exp(-0.001 (k - 500))`, floored at 0.03. The probes and the
    update decisions come from the key in the state, so a run is reproducible.
    The per-leaf update-RMS clip and the weight decay are as in `kron.py`.

    On a mesh, for a leaf split over mesh axes (FSDP's `P('fsdp', None)` and the
    like), `init` splits its factors over the same axes (along the block axis
    where the device count divides the number of blocks, else along each
    factor's rows), so each device holds about `1/N` of them. A step gathers them
    where it applies them (within the step only) and fits each block's factors
    on one device, the devices taking the blocks of every leaf in turn, the
    results shared by collectives: the same numbers as on one device.
    `block_size` changes the maths; a mesh run equals the one-device run of the
    same `block_size`.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: momentum decay, in `[0, 1)`.
    - `weight_decay`: decoupled decay coefficient, `>= 0` (leaves of at least
      two dimensions).
    - `precond_lr`: the preconditioner fit's step size, `> 0`.
    - `precond_init_scale`: the initial scale of `P`'s factors, `> 0`.
    - `update_probability`: the probability of fitting the preconditioner at a
      step, in `[0, 1]`, or `None` for the authors' schedule.
    - `key`: an int seed or a typed JAX key (`jax.random.key`), for the probes
      and the update decisions.
    - `max_size_triangular`: the longest axis (of a block) with a triangular
      factor (static int).
    - `min_ndim_triangular`: leaves with fewer dimensions get diagonal factors
      only (static int).
    - `block_size`: the largest block along any axis, or `None` (no blocking;
      static).
    - `momentum_into_precond_update`: fit the preconditioner to the momentum
      rather than to the gradient (static bool).
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule = learning_rate_field(1e-3)
    b1: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0, kw_only=False)
    precond_lr: ScalarOrSchedule = hyper(0.1, low=0.0, low_open=True)
    # Read once, at init, into the factors: a schedule would have no step to
    # be read at.
    precond_init_scale: ScalarOrSchedule = hyper(
        1.0, low=0.0, low_open=True, schedule=False
    )
    update_probability: ScalarOrSchedule | None = hyper(
        None, low=0.0, high=1.0, optional=True
    )
    key: UInt32[Array, "..."] = eqx.field(default=0, kw_only=True)
    key_impl: str = eqx.field(static=True, init=False)
    # Static: they decide the shapes of the state.
    max_size_triangular: int = checked_field(
        static_count, 8192, static=True, kw_only=True
    )
    min_ndim_triangular: int = checked_field(static_count, 2, static=True, kw_only=True)
    block_size: int | None = checked_field(
        optional_static_count, None, static=True, kw_only=True
    )
    momentum_into_precond_update: bool = flag_field(True)

    real_only = RealOnly(_WHY)

    def __post_init__(self):
        # Two fields from one argument: the raw key data and its implementation.
        self.key, self.key_impl = _key_data("key", self.key)

    def _layout(self, p: Array) -> Layout:
        return layout(p.shape if p.ndim else (1,), self.block_size)

    def _diagonal(self, p: Array, size: int) -> bool:
        return (
            size == 1
            or size > self.max_size_triangular
            or p.ndim < self.min_ndim_triangular
        )

    def init(self, params: Params) -> PSGDKronState:

        def factors(p):
            if not is_float_leaf(p) or p.size == 0:
                return None
            lay = self._layout(p)
            dtype = compute_dtype(p.dtype)
            scale = jnp.asarray(self.precond_init_scale, dtype) ** (1 / len(lay.block))
            out = []
            for b in lay.block:
                one = (
                    jnp.ones((b,), dtype)
                    if self._diagonal(p, b)
                    else jnp.eye(b, dtype=dtype)
                )
                # Split over the devices that hold the parameter: `split_like`.
                out.append(
                    split_like(
                        jnp.broadcast_to(scale * one, (lay.blocks, *one.shape)), p
                    )
                )
            return tuple(out)

        return PSGDKronState(
            step=zero_step(),
            key=jnp.array(self.key, copy=True),  # a donated step must not take it
            mu=float_leaves_like(params),
            q=jax.tree.map(factors, params),
        )

    def transform(
        self, grads: Grads, state: PSGDKronState, params: Params
    ) -> tuple[Updates, PSGDKronState]:
        h = values_at(self, state.step)
        t = increment(state.step)
        key = jax.random.wrap_key_data(state.key, impl=self.key_impl)
        next_key, k_update, k_probe, k_balance = jax.random.split(key, 4)
        if h.update_probability is None:
            k32 = t.astype(jnp.float32)
            prob = jnp.clip(jnp.exp(-0.001 * (k32 - 500.0)), 0.03, 1.0)
        else:
            prob = h.update_probability.astype(jnp.float32)
        # float32 draws, under jax_enable_x64 too (the same numbers either way).
        update = jax.random.uniform(k_update, dtype=jnp.float32) < prob
        balance = jax.random.uniform(k_balance, dtype=jnp.float32) < 0.01

        param_leaves, param_def = jax.tree.flatten(params)
        grad_leaves = align_grads(grads, params)
        mu_leaves = param_def.flatten_up_to(state.mu)
        q_leaves = param_def.flatten_up_to(state.q)
        out: list[list[Any]] = [[], [], []]
        # The momentum and the probes of every leaf first, then the fit of every
        # block's factors at once (on a mesh, each block on one device:
        # `map_round_robin`), then each leaf's update.
        fitted = []
        # Each probe's key is the leaf's place among the non-empty float leaves, so
        # leaves that get none (empty, or not float) do not change the others'.
        places = _places(param_leaves)
        for index, g, p, mu, qs in zip(
            places, grad_leaves, param_leaves, mu_leaves, q_leaves
        ):
            if g is None or not is_float_leaf(p):
                for column, value in zip(out, (None, mu, qs)):
                    column.append(value)
                continue
            if p.size == 0:  # nothing to precondition (nor to update)
                for column, value in zip(
                    out, (jnp.zeros(p.shape, compute_dtype(p.dtype)), mu, qs)
                ):
                    column.append(value)
                continue
            dtype = compute_dtype(p.dtype)
            k = t.astype(dtype)
            b1 = h.b1.astype(dtype)
            new_mu = b1 * mu.astype(dtype) + (1 - b1) * g.astype(dtype)
            debiased = new_mu / (1 - b1**k)
            lay = self._layout(p)
            probe = jax.random.normal(
                jax.random.fold_in(k_probe, index), p.shape, dtype
            )
            fit_to = debiased if self.momentum_into_precond_update else g
            place = len(out[0])
            out[0].append(None)  # the update, once the factors are fitted
            out[1].append(new_mu.astype(mu.dtype))
            out[2].append(qs)
            fitted.append((place, p, dtype, lay, debiased, fit_to, probe))

        def blocks(x, lay):
            return to_blocks(x.reshape(lay.shape), lay)

        def fit(all_qs):
            problems = []
            for qs, (_, _, dtype, lay, _, fit_to, probe) in zip(all_qs, fitted):
                qs = _shards.cond(balance, jax.vmap(_balance), lambda qs: qs, qs)
                lr = jnp.broadcast_to(h.precond_lr.astype(dtype), (lay.blocks,))
                fit_blocks = blocks(fit_to.astype(dtype), lay)
                problems.append((qs, fit_blocks, blocks(probe, lay), lr))
            return map_round_robin(
                lambda problem: _update_factors(*problem), problems, mesh
            )

        mesh = work_mesh((grads, params))
        all_qs = _shards.cond(
            update, fit, lambda qs: qs, [out[2][place] for place, *_ in fitted]
        )
        for qs, (place, p, dtype, lay, debiased, _, _) in zip(all_qs, fitted):
            qs = tuple(q.astype(dtype) for q in qs)
            pre_blocks = jax.vmap(
                lambda x, qs: _apply(_apply(x, qs), qs, transpose=True)
            )(blocks(debiased, lay), qs)
            pre = from_blocks(pre_blocks, lay).reshape(p.shape)
            rms = jnp.sqrt(jnp.mean(pre * pre))
            pre = pre * jnp.minimum(1.0, 1.1 / (rms + 1e-12)).astype(dtype)
            if p.ndim >= 2:
                pre = pre + h.weight_decay.astype(dtype) * p.astype(dtype)
            out[0][place] = -h.learning_rate.astype(dtype) * pre
            out[2][place] = qs
        updates, mu, q = (param_def.unflatten(c) for c in out)
        return updates, PSGDKronState(
            step=t, key=jax.random.key_data(next_key), mu=mu, q=q
        )
