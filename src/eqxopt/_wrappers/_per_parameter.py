"""Per-parameter options without `Partition`: learning-rate multipliers by leaf, and
ascending instead of descending (torch's `maximize`)."""

import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PyTree

from .._core._base import AbstractTransform, Grads, Params, State, Updates
from .._core._fields import checked_field
from .._core._jax_api import is_tracer
from .._core._masks import checked_leaves, is_kept_function
from .._core._structure import is_none, structure_mismatch
from .._core._tree import align_grads
from ._wrapper import AbstractSingleWrapper, inner_field, leaves_of

Multipliers = PyTree[float | Float[Array, ""]] | Callable[[PyTree], PyTree[float]]


def _multiplier(name: str, path: str, value: Any) -> Any:
    """One multiplier, as a float32 scalar array, checked when it is known."""
    if isinstance(value, bool) or not isinstance(
        value, (int, float, jax.Array, jnp.ndarray)
    ):
        raise TypeError(f"{name}{path} must be a float, got {type(value).__name__}")
    value = jnp.asarray(value, jnp.float32)
    if value.shape != ():
        raise ValueError(f"{name}{path} must be a scalar, got shape {value.shape}")
    if not is_tracer(value):
        number = float(value)
        if not (math.isfinite(number) and number >= 0.0):
            raise ValueError(f"{name}{path} must be finite and >= 0, got {number}")
    return value


def _multipliers(
    name: str, value: PyTree[float] | Callable[[PyTree], PyTree[float]]
) -> Any:
    # A function of the params is kept (a static leaf: reuse one function); a tree
    # of numbers becomes float32 scalar arrays, so new values reuse the compiled step.
    if is_kept_function(name, value):
        return value
    treedef, leaves = checked_leaves(name, value, _multiplier)
    return treedef.unflatten(leaves)


_ONE = np.float32(1.0)


def _per_leaf(multipliers: Any, params: Params) -> list[Any]:
    """One multiplier (a float32 scalar) per leaf of `params`."""
    if callable(multipliers) and not isinstance(multipliers, eqx.Module):
        multipliers = _multipliers("multipliers", multipliers(params))
    leaves, treedef = jax.tree.flatten(multipliers, is_leaf=is_none)
    try:
        subtrees = treedef.flatten_up_to(params)
    except (ValueError, TypeError):
        raise structure_mismatch(multipliers, "multipliers", params, "params") from None
    out: list[Any] = []
    for m, sub in zip(leaves, subtrees):
        # None (as `eqx.filter` leaves at non-arrays) leaves the update as it is.
        m = _ONE if m is None else m
        out.extend([m] * len(jax.tree.leaves(sub)))
    return out


class LearningRateMultipliers(AbstractSingleWrapper):
    r"""Multiplies `inner`'s update of each leaf by that leaf's multiplier $m$:

    $$
    u = m \cdot \operatorname{inner}(g)
    $$

    One optimizer with its own learning rate per parameter group (embeddings,
    biases, ...) and no `Partition`.

    For optimizers whose update is proportional to the learning rate, weight decay
    included (SGD with momentum, Adam, AdamW, Lion, ...), `m = lr_group / lr` is
    torch's parameter groups with `lr=lr_group` (its decoupled decay also scales
    with the group's `lr`) and optax's `multi_transform` over copies of the
    optimizer. The state is `inner`'s, for every leaf.

    **Arguments:**

    - `inner`: the optimizer or transform whose updates to scale.
    - `multipliers`: a float `>= 0` per leaf: a tree with the structure of the
      parameters, or a prefix of it (a number covers the whole subtree below it),
      or a function of the parameters returning one; `None` counts as `1` (so
      `eqx.filter(model, eqx.is_inexact_array)` makes a template). Numbers are
      held as arrays, so new values reuse the compiled step; a function is part
      of the compiled step's key: define it once (module level), not a new
      `lambda` each time.
    """

    # Element-wise: a packed model's leaves are buffers, and a multiplier of a
    # leaf is one of a buffer there (as a mask's value is), given per label.
    reduces_over = "nothing"

    inner: AbstractTransform = inner_field()
    multipliers: Multipliers = checked_field(_multipliers)

    def init(self, params: Params) -> State:
        _per_leaf(self.multipliers, params)  # a bad tree fails here
        return self.inner.init(params)

    def transform(
        self, grads: Grads, state: State, params: Params, **extra: Any
    ) -> tuple[Updates, State]:
        updates, state = self.run_inner(grads, state, params, extra)
        scaled = [
            None if u is None else u * m.astype(u.dtype)
            for u, m in zip(
                leaves_of(updates, params), _per_leaf(self.multipliers, params)
            )
        ]
        return jax.tree.structure(params).unflatten(scaled), state


class Maximize(AbstractSingleWrapper):
    r"""Ascends instead of descending: `inner` is given the negated gradients,

    $$
    u = \operatorname{inner}(-g)
    $$

    as torch's `maximize=True` (which every torch optimizer applies to the gradient
    first, before momentum and weight decay). The state is `inner`'s.

    **Arguments:**

    - `inner`: the optimizer whose objective to maximise.
    """

    reduces_over = "nothing"

    inner: AbstractTransform = inner_field()

    def init(self, params: Params) -> State:
        return self.inner.init(params)

    def transform(
        self, grads: Grads, state: State, params: Params, **extra: Any
    ) -> tuple[Updates, State]:
        treedef = jax.tree.structure(params)
        negated = treedef.unflatten(
            [None if g is None else -g for g in align_grads(grads, params)]
        )
        return self.run_inner(negated, state, params, extra)
