"""Shampoo with grafting and blocking, as in distributed Shampoo (Shi et al.,
2023)."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int, PyTree

from ..._core import _shards
from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import array_count, static_count
from ..._core._fields import (
    ScalarOrSchedule,
    checked_field,
    choice_field,
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

# Its factor matrices are real symmetric statistics G G^T, and their inverse roots
# come from a real eigendecomposition.
_WHY = "its Kronecker factors and their inverse roots are real"


def _optional_count(
    name: str, value: int | Int[ArrayLike, ""] | None
) -> Int[Array, ""] | None:
    return None if value is None else array_count(name, value)


class ShampooState(eqx.Module):
    """State of `Shampoo`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `mu`: the filtered gradient (exponential average, decay `b1`), shaped like
      params.
    - `nu`: the grafting method's second moment (Adam's average or AdaGrad's sum
      of squared gradients), shaped like params.
    - `factors`: for each float leaf of at least one dimension, a tuple with one
      array per axis `i`: the Kronecker factors `L_i` of every block, stacked,
      shaped `(blocks, b_i, b_i)` with `b_i = min(d_i, block_size)` and `blocks`
      the number of blocks of the leaf. `None` at 0-d and non-float leaves.
    - `roots`: the inverse roots `R_i` (see `Shampoo`) last
      computed from `factors` (shaped as them; the identity until then).
    """

    step: Int[Array, ""]
    mu: PyTree[Float[Array, "..."] | None]
    nu: PyTree[Float[Array, "..."] | None]
    factors: PyTree[Any]
    roots: PyTree[Any]


def _outer(g: Array, axis: int) -> Array:
    """`g`'s outer product along `axis`, summed over every other axis."""
    others = [i for i in range(g.ndim) if i != axis]
    return jnp.tensordot(g, g, axes=(others, others))


def _precondition(x: Array, roots: tuple[Array, ...]) -> Array:
    """`x` multiplied along each axis `i` by the symmetric `roots[i]`."""
    for m in roots:
        x = jnp.tensordot(x, m, axes=(0, 0))  # axis 0 contracted, result at the end
    return x


def inverse_root(a: Array, eps: Array, root: Array) -> Array:
    """`(a + eps I)**(-1/root)` of a symmetric positive semi-definite `a`, by an
    eigendecomposition whose eigenvalues are floored at 0 first (rounding makes
    the smallest ones slightly negative)."""
    a = (a + a.T) / 2
    w, v = jnp.linalg.eigh(a)
    w = jnp.maximum(w, 0) + eps
    return (v * w ** (-1.0 / root)) @ v.T


class Shampoo(AbstractTransform):
    """Shampoo (Gupta et al., 2018) as distributed Shampoo (Shi et al., 2023,
    "A Distributed Data-Parallel PyTorch Implementation of the Distributed
    Shampoo Optimizer for Training Neural Networks At-Scale"): a Kronecker-factored
    full-matrix preconditioner per block of each parameter, with its step size
    grafted from Adam or AdaGrad.

    Each leaf of `n >= 1` dimensions is cut into blocks: every axis longer than
    `block_size` into pieces of `block_size` (the last one padded with zeros,
    which leaves the other blocks' maths exact). For a block `G` of the gradient,
    with `k` the step count after this update and `lr` the learning rate at it:

    ```
    m  = b1 * m + (1 - b1) * g;     m^ = m / (1 - b1**k)           (filtering)
    graft (Adam):    v = graft_b2 * v + (1 - graft_b2) * g**2
                     D = m^ / (sqrt(v / (1 - graft_b2**k)) + graft_eps)
    graft (AdaGrad): v = v + g**2;   D = m^ / (sqrt(v) + graft_eps)
    L_i = b2 * L_i + (1 - b2) * G_(i) G_(i)^T  (b2 = 1: L_i = L_i + G_(i) G_(i)^T)
    every precondition_frequency steps (k % precondition_frequency == 0):
        R_i = (eigh floor(L_i / (1 - b2**k)) + eps)**(-1/r)
    (r = 2 n, or inv_root_override)
    S = m^ x_1 R_1 x_2 ... x_n R_n                 (R_i applied along axis i)
    P = S * ||D|| / ||S||   (norms per block)   if k >= start_preconditioning_step
    P = D                                        otherwise
    p = p - lr * (P + weight_decay * p)            (decoupled weight decay)
    ```

    (`(1 - b2**k)` is 1 when `b2 = 1`.) The inverse roots come from a
    symmetric eigendecomposition in the state's precision (float32 or wider),
    with the eigenvalues floored at zero before `eps` is added. A 0-d leaf gets
    the grafting direction `D` alone. The state of every block is stacked on a
    leading axis (`ShampooState`), so it can be sharded across devices like a
    batch; each step's matrix work is per block, `O(block_size**3)`. This
    follows the distributed Shampoo paper's algorithm (arXiv 2309.06497) without
    its momentum, Nesterov and coupled weight decay options.

    On a mesh, for a leaf split over mesh axes (FSDP's `P('fsdp', None)` and the
    like), `init` splits its factors and roots over the same axes: along the
    block axis where the device count divides the number of blocks, else along
    each block's rows, so each device holds about `1/N` of them. A step gathers a
    leaf's roots (within the step only) where it applies them, and computes each
    block's inverse roots on one device, the devices taking the blocks of every
    leaf in turn, the results shared by collectives: the same numbers as on one
    device. `block_size` changes the maths (a blocked preconditioner is not the
    full one); a mesh run equals the one-device run of the same `block_size`.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`: decay of the gradient filter, in `[0, 1)` (0: no filtering).
    - `b2`: decay of the Kronecker factors, in `(0, 1]` (1: a running sum).
    - `eps`: added to the factors' eigenvalues before the inverse root, `> 0`.
    - `weight_decay`: decoupled decay coefficient, `>= 0`.
    - `grafting`: `"adam"` or `"adagrad"`: whose per-block step size the
      Shampoo direction takes (static).
    - `graft_b2`: decay of Adam grafting's second moment, in `(0, 1)`.
    - `graft_eps`: added to the grafting method's root, `> 0`.
    - `precondition_frequency`: recompute the inverse roots every this many steps
      (an int `>= 1`; an array field, so changing it does not recompile).
    - `start_preconditioning_step`: the first step that uses the Shampoo
      direction (an int `>= 1`, or `None`: `precondition_frequency`, the first
      step with inverse roots).
    - `inv_root_override`: the root `r` of `R_i = (...)**(-1/r)` for every block
      (an int `>= 1`, or `None`: `2 n` for a block of `n` axes, the paper's
      default; 2 is the common override, which whitens a quadratic's Kronecker
      factors fully).
    - `block_size`: the largest block along any axis (static int; the paper's
      `max_preconditioner_dim`).
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule = learning_rate_field(1e-3)
    b1: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True)
    b2: ScalarOrSchedule = hyper(0.999, low=0.0, high=1.0, low_open=True)
    eps: ScalarOrSchedule = hyper(1e-12, low=0.0, low_open=True)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0, kw_only=False)
    grafting: str = choice_field("adam", ("adam", "adagrad"), kw_only=False)
    graft_b2: ScalarOrSchedule = hyper(
        0.999, low=0.0, high=1.0, low_open=True, high_open=True
    )
    graft_eps: ScalarOrSchedule = hyper(1e-8, low=0.0, low_open=True)
    precondition_frequency: Int[Array, ""] = checked_field(array_count, 20)
    start_preconditioning_step: Int[Array, ""] | None = checked_field(
        _optional_count, None
    )
    inv_root_override: Int[Array, ""] | None = checked_field(_optional_count, None)
    # Static: it decides the shapes of the state.
    block_size: int = checked_field(static_count, 1024, static=True, kw_only=True)

    real_only = RealOnly(_WHY)

    def _layout(self, p: Array) -> Layout | None:
        if p.ndim == 0 or p.size == 0:
            return None
        return layout(p.shape, self.block_size)

    def init(self, params: Params) -> ShampooState:

        def stacked(p, eye):
            if not is_float_leaf(p):
                return None
            lay = self._layout(p)
            if lay is None:
                return None
            dtype = compute_dtype(p.dtype)
            make = jnp.eye if eye else (lambda b, dtype: jnp.zeros((b, b), dtype))
            # Split over the devices that hold the parameter (by blocks where
            # their count divides the blocks, else by rows): `split_like`.
            return tuple(
                split_like(
                    jnp.broadcast_to(make(b, dtype=dtype), (lay.blocks, b, b)), p
                )
                for b in lay.block
            )

        return ShampooState(
            step=zero_step(),
            mu=float_leaves_like(params),
            nu=float_leaves_like(params),
            factors=jax.tree.map(lambda p: stacked(p, False), params),
            roots=jax.tree.map(lambda p: stacked(p, True), params),
        )

    def transform(
        self, grads: Grads, state: ShampooState, params: Params
    ) -> tuple[Updates, ShampooState]:
        h = values_at(self, state.step)
        t = increment(state.step)
        start = (
            self.precondition_frequency
            if self.start_preconditioning_step is None
            else self.start_preconditioning_step
        )
        refresh = (t % self.precondition_frequency) == 0
        use_shampoo = t >= start

        def filtered_and_factors(g, mu, nu, factors, lay):
            dtype = g.dtype
            k = t.astype(dtype)
            b1, b2 = h.b1.astype(dtype), h.b2.astype(dtype)
            gb2, geps = h.graft_b2.astype(dtype), h.graft_eps.astype(dtype)
            mu = b1 * mu + (1 - b1) * g
            filtered = mu / (1 - b1**k)
            if self.grafting == "adam":
                nu = gb2 * nu + (1 - gb2) * g * g
                graft = filtered / (jnp.sqrt(nu / (1 - gb2**k)) + geps)
            else:
                nu = nu + g * g
                graft = filtered / (jnp.sqrt(nu) + geps)
            if lay is not None:
                blocks = to_blocks(g, lay)
                weight = jnp.where(b2 == 1, 1.0, 1 - b2).astype(dtype)
                factors = tuple(
                    b2 * f + weight * jax.vmap(lambda x, i=i: _outer(x, i))(blocks)
                    for i, f in enumerate(factors)
                )
            return filtered, graft, mu, nu, factors

        def root_problems(factors, lay, dtype):
            # One problem per block and axis: the factor and its leaf's constants.
            k, b2 = t.astype(dtype), h.b2.astype(dtype)
            correction = jnp.where(b2 == 1, 1.0, 1 - b2**k).astype(dtype)
            root = (
                jnp.asarray(2 * len(lay.block), dtype)
                if self.inv_root_override is None
                else self.inv_root_override.astype(dtype)
            )
            constants = (correction, h.eps.astype(dtype), root)
            return [
                (f, *(jnp.broadcast_to(c, f.shape[:1]) for c in constants))
                for f in factors
            ]

        def one_root(problem):
            factor, correction, eps, root = problem
            return inverse_root(factor / correction, eps, root)

        def direction(filtered, graft, roots, lay):
            if lay is None:
                return graft
            s = jax.vmap(_precondition)(to_blocks(filtered, lay), roots)
            d = to_blocks(graft, lay)
            axes = tuple(range(1, s.ndim))
            s_norm = jnp.sqrt(jnp.sum(s * s, axis=axes, keepdims=True))
            d_norm = jnp.sqrt(jnp.sum(d * d, axis=axes, keepdims=True))
            positive = s_norm > 0
            scale = jnp.where(positive, d_norm / jnp.where(positive, s_norm, 1), 0)
            grafted = from_blocks(s * scale, lay)
            return jnp.where(use_shampoo, grafted, graft)

        param_leaves, param_def = jax.tree.flatten(params)
        grad_leaves = align_grads(grads, params)
        columns = [
            param_def.flatten_up_to(tree)
            for tree in (state.mu, state.nu, state.factors, state.roots)
        ]
        # The filter, the graft and the factors of every leaf first, then the
        # inverse roots of every factor at once (on a mesh, each on one device:
        # `map_round_robin`), then each leaf's direction.
        out: list[list[Any]] = [[], [], [], [], []]
        stepped = []
        for g, p, mu, nu, factors, roots in zip(grad_leaves, param_leaves, *columns):
            if g is None or not is_float_leaf(p):
                for column, value in zip(out, (None, mu, nu, factors, roots)):
                    column.append(value)
                continue
            dtype = compute_dtype(p.dtype)
            lay = self._layout(p)
            filtered, graft, new_mu, new_nu, factors = filtered_and_factors(
                g.astype(dtype), mu.astype(dtype), nu.astype(dtype), factors, lay
            )
            place = len(out[0])
            out[0].append(None)  # the update, once the roots are known
            out[1].append(new_mu.astype(mu.dtype))
            out[2].append(new_nu.astype(nu.dtype))
            out[3].append(factors)
            out[4].append(roots)
            stepped.append((place, p, dtype, lay, filtered, graft))

        blocked = [(place, dtype, lay) for place, _, dtype, lay, *_ in stepped if lay]
        mesh = work_mesh((grads, params))

        def compute(factors, roots):
            del roots
            problems = [
                problem
                for (_, dtype, lay), f in zip(blocked, factors)
                for problem in root_problems(f, lay, dtype)
            ]
            found = iter(map_round_robin(one_root, problems, mesh))
            return [tuple(next(found) for _ in f) for f in factors]

        new_roots = _shards.cond(
            refresh,
            compute,
            lambda factors, roots: roots,
            [out[3][place] for place, *_ in blocked],
            [out[4][place] for place, *_ in blocked],
        )
        for (place, *_), roots in zip(blocked, new_roots):
            out[4][place] = roots
        for place, p, dtype, lay, filtered, graft in stepped:
            d = direction(filtered, graft, out[4][place], lay)
            lr, wd = h.learning_rate.astype(dtype), h.weight_decay.astype(dtype)
            out[0][place] = -lr * (d + wd * p.astype(dtype))
        updates, mu, nu, factors, roots = (param_def.unflatten(c) for c in out)
        return updates, ShampooState(step=t, mu=mu, nu=nu, factors=factors, roots=roots)
