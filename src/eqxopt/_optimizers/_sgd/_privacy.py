"""Differential privacy (Abadi et al., 2016): per-example clipping and the noised
average of per-example gradients."""

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int, PyTree, UInt32

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import hyperparameter, renames
from ..._core._fields import hyper
from ..._core._keys import key_data
from ..._core._norms import norm
from ..._core._tree import align_grads, compute_dtype, is_float_leaf, leaf_paths


def _batch_size(grads: PyTree, owner: str) -> int:
    """The size of the leading batch axis every leaf of `grads` shares, else a
    `ValueError` naming the first leaf without it."""
    size, first = None, ""
    for path, g in zip(leaf_paths(grads), jax.tree.leaves(grads)):
        if jnp.ndim(g) == 0:
            raise ValueError(
                f"grads{path} is a scalar, but {owner} takes per-example gradients "
                "with a leading batch axis (as jax.vmap(jax.grad(loss)) gives)"
            )
        if size is None:
            size, first = jnp.shape(g)[0], path
        elif jnp.shape(g)[0] != size:
            raise ValueError(
                f"grads{path} has a batch of {jnp.shape(g)[0]} examples but "
                f"grads{first} has {size}; {owner} takes one batch of per-example "
                "gradients"
            )
    if size is None:
        raise ValueError(f"{owner} got no gradients")
    return size


def _check_clip(name: str, value: Any) -> None:
    """A `ValueError` naming `name` unless a known `value` is `>= 0` (a negative
    bound would flip the gradients' sign); a traced one is taken as it comes. The
    value itself is used as given (a Python float stays weakly typed)."""
    hyperparameter(name, value, low=0.0, allow_inf=True)


def _clipped_sum(
    leaves: Sequence[Array], l2_norm_clip: ArrayLike
) -> tuple[list[Array], Int[Array, ""]]:
    # Each example's gradients taken together, scaled to norm `l2_norm_clip` at
    # most (a NaN scale, from 0 / 0, is 1 as in optax), then summed over examples.
    norms = jax.vmap(lambda xs: norm(xs, None, "per-example clipping"))(list(leaves))
    scale = jnp.nan_to_num(jnp.minimum(l2_norm_clip / norms, 1.0), nan=1.0)
    clipped = []
    for g in leaves:
        g = g.astype(compute_dtype(g.dtype))
        clipped.append(jnp.tensordot(scale.astype(g.dtype), g, axes=1))
    return clipped, jnp.sum(scale < 1.0)


def per_example_global_norm_clip(
    grads: PyTree, l2_norm_clip: ArrayLike
) -> tuple[PyTree, Int[Array, ""]]:
    r"""Clips each example's gradients, all leaves taken together, to an L2 norm of
    `l2_norm_clip` at most, and sums them over the examples (Abadi et al., 2016):

    $$
    \sum_{i=1}^{B} g_i \min\left(1, \frac{C}{\lVert g_i \rVert}\right)
    $$

    The same as `optax.per_example_global_norm_clip`.

    **Arguments:**

    - `grads`: a tree of per-example gradients, each leaf with a leading batch
      axis of the same size (as `jax.vmap(jax.grad(loss))` gives); a leaf
      without one is a `ValueError` naming it.
    - `l2_norm_clip`: the bound `C` on each example's norm, `>= 0`.

    **Returns:** `(clipped_sum, num_clipped)`: the sum over the examples, shaped
    like one example's gradients (in at least float32), and how many examples
    were scaled down.
    """
    _check_clip("l2_norm_clip", l2_norm_clip)
    _batch_size(grads, "per_example_global_norm_clip")
    leaves, treedef = jax.tree.flatten(grads)
    clipped, num_clipped = _clipped_sum(leaves, l2_norm_clip)
    return treedef.unflatten(clipped), num_clipped


def per_example_layer_norm_clip(
    grads: PyTree, global_l2_norm_clip: ArrayLike, uniform: bool = True
) -> tuple[PyTree, PyTree]:
    r"""Clips each example's gradient leaf by leaf (McMahan et al., 2018), leaf
    `k` of `K` to its own bound, and sums over the examples:

    $$
    C_k = \begin{cases} C / \sqrt{K} & \text{uniform} \\
        C \sqrt{d_k / d} & \text{otherwise} \end{cases}
    \qquad
    \sum_{i=1}^{B} g_{i,k} \min\left(1, \frac{C_k}{\lVert g_{i,k} \rVert}\right)
    $$

    with `d_k` the size of one example's leaf `k` and `d` their total. The same
    as `optax.per_example_layer_norm_clip`.

    **Arguments:**

    - `grads`: a tree of per-example gradients, as for
      `per_example_global_norm_clip`.
    - `global_l2_norm_clip`: the overall bound `C`, `>= 0`.
    - `uniform`: the same bound for every leaf (default), else bounds
      proportional to the root of each leaf's size.

    **Returns:** `(clipped_sum, num_clipped)`: the sums, shaped like one
    example's gradients, and a tree of how many examples were scaled down at
    each leaf.
    """
    _check_clip("global_l2_norm_clip", global_l2_norm_clip)
    _batch_size(grads, "per_example_layer_norm_clip")
    leaves, treedef = jax.tree.flatten(grads)
    sizes = [g[0].size for g in leaves]
    fractions = [1.0 / len(leaves) if uniform else d / sum(sizes) for d in sizes]
    clipped, num_clipped = [], []
    for g, f in zip(leaves, fractions):
        (sum_,), n = _clipped_sum([g], global_l2_norm_clip * f**0.5)
        clipped.append(sum_)
        num_clipped.append(n)
    return treedef.unflatten(clipped), treedef.unflatten(num_clipped)


class DifferentiallyPrivateAggregateState(eqx.Module):
    """State of `DifferentiallyPrivateAggregate`.

    **Fields:**

    - `key`: the PRNG key for the next step's noise, as raw `uint32` key data
      (`jax.random.key_data`).
    """

    key: UInt32[Array, "..."]


class DifferentiallyPrivateAggregate(AbstractTransform):
    r"""The aggregation of DP-SGD (Abadi et al., 2016, "Deep Learning with
    Differential Privacy"): per-example gradients clipped, summed, noised and
    averaged. For a batch of `B` examples with gradients `g_i` (each example's
    leaves taken together) and `C` the `l2_norm_clip`:

    $$
    u = \frac{1}{B} \left( \sum_{i=1}^{B}
        g_i \min\left(1, \frac{C}{\lVert g_i \rVert}\right)
        + C \sigma\, n \right),
        \qquad n \sim \mathcal{N}(0, 1) \text{ elementwise}
    $$

    with `sigma` the `noise_multiplier`. It takes *per-example* gradients: every
    gradient with a leading batch axis (the same size for every leaf) before its
    parameter's shape, as `jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))`
    gives; a gradient without it is a `ValueError` naming the leaf. It returns
    updates shaped like the parameters, so in a `Chain` it is the first link and
    any optimizer follows it (`DPSGD` is this and `SGD`).

    The noise comes from the key in the state: each step splits it into `1 + K`
    keys for `K` parameter leaves, the first the next state's key, key `1 + k`
    for leaf `k` (in `jax.tree.leaves` order). This is `optax.contrib.
    differentially_private_aggregate`'s split, so with the same key and float32
    parameters the noise is the same; a leaf without a gradient gets no update
    and leaves the other leaves' noise unchanged.

    **Arguments:**

    - `l2_norm_clip`: the bound `C` on each example's gradient norm, `>= 0`.
    - `noise_multiplier`: `sigma`, the noise's standard deviation relative to
      `C`, `>= 0`.
    - `seed`: an integer seed (a Python int or a 0-d integer array) or a JAX
      PRNG key (typed, from `jax.random.key`, or raw `uint32` data). Required:
      there is no hidden global seed. An array field, so a new seed does not
      recompile.
    """

    reads_params = None  # the parameters are not read (`params_needed`)
    per_example = True

    # optax's spellings (`_checks.refuse_renamed`)
    renamed_arguments = renames(key=("seed",))

    # Read without a step count (the state keeps none), so not schedules.
    # Stored as scalar arrays (the converters); numbers are taken.
    l2_norm_clip: float | Float[Array, ""] = hyper(low=0.0, schedule=False)
    noise_multiplier: float | Float[Array, ""] = hyper(low=0.0, schedule=False)
    # Set in `__post_init__`, from any form of key (`_keys.key_data`).
    seed: UInt32[Array, "..."] = eqx.field()  # pyright: ignore[reportGeneralTypeIssues]
    key_impl: str = eqx.field(static=True, init=False)

    def __post_init__(self):
        # Two fields from one argument: the raw key data and its implementation.
        self.seed, self.key_impl = key_data("seed", self.seed)

    def init(self, params: Params) -> DifferentiallyPrivateAggregateState:
        # A copy: a donated step must not delete the transform's own key.
        return DifferentiallyPrivateAggregateState(key=jnp.array(self.seed, copy=True))

    def transform(
        self, grads: Grads, state: DifferentiallyPrivateAggregateState, params: Params
    ) -> tuple[Updates, DifferentiallyPrivateAggregateState]:
        param_leaves, treedef = jax.tree.flatten(params)
        key = jax.random.wrap_key_data(state.key, impl=self.key_impl)
        next_key, *leaf_keys = jax.random.split(key, len(param_leaves) + 1)
        aligned = align_grads(grads, params)
        given = [
            i
            for i, (g, p) in enumerate(zip(aligned, param_leaves))
            if g is not None and is_float_leaf(p)
        ]
        updates: list[Any] = [None] * len(param_leaves)
        if given:
            leaves = [aligned[i] for i in given]
            size = leaves[0].shape[0]
            clipped, _ = _clipped_sum(leaves, self.l2_norm_clip)
            std = jnp.asarray(self.l2_norm_clip * self.noise_multiplier)
            for i, total in zip(given, clipped):
                noise = jax.random.normal(leaf_keys[i], total.shape, total.dtype)
                updates[i] = (total + std.astype(total.dtype) * noise) / size
        return treedef.unflatten(updates), DifferentiallyPrivateAggregateState(
            key=jax.random.key_data(next_key)
        )
