"""Target-network helpers (optax's `incremental_update` and `periodic_update`): a
slow copy of the parameters, moved towards the online ones by Polyak averaging
or replaced by them every few steps."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import PyTree

from .._core._checks import hyperparameter, positive_count, step_count
from .._core._tree import is_float_leaf


def incremental_update(
    new_tensors: PyTree, old_tensors: PyTree, step_size: Any
) -> PyTree:
    r"""The Polyak average of a target network moved one step towards the online
    one, leaf by leaf:

    $$
    \mathrm{old} \leftarrow \mathrm{step\_size} \cdot \mathrm{new}
        + (1 - \mathrm{step\_size}) \cdot \mathrm{old}
    $$

    The same as `optax.incremental_update`. Float leaves are averaged (in at
    least float32, then rounded to `old`'s dtype); every other leaf (integers,
    functions of an Equinox model) and `None` is taken from `new_tensors`, so
    whole models work.

    **Arguments:**

    - `new_tensors`: the online parameters.
    - `old_tensors`: the target parameters, of the same structure.
    - `step_size`: how far to move, in `[0, 1]` (a number or scalar array; a
      concrete value outside is a `ValueError`).

    **Returns:** the new target parameters.
    """
    step_size = hyperparameter("step_size", step_size, low=0.0, high=1.0)

    def average(new: Any, old: Any) -> Any:
        if not (is_float_leaf(new) and is_float_leaf(old)):
            return new
        dtype = jnp.promote_types(old.dtype, jnp.float32)
        s = step_size.astype(dtype)
        return (s * new.astype(dtype) + (1 - s) * old.astype(dtype)).astype(old.dtype)

    return jax.tree.map(average, new_tensors, old_tensors, is_leaf=lambda x: x is None)


def periodic_update(
    new_tensors: PyTree, old_tensors: PyTree, steps: Any, update_period: Any
) -> PyTree:
    """The target network replaced by the online one every `update_period` steps:
    `new_tensors` when `steps % update_period == 0`, else `old_tensors`. The same
    as `optax.periodic_update` (a `lax.cond` on traced counts). The array leaves
    are chosen; every other leaf (the functions of an Equinox model) is taken from
    `new_tensors`.

    **Arguments:**

    - `new_tensors`: the online parameters.
    - `old_tensors`: the target parameters, of the same structure.
    - `steps`: the online network's updates so far, an int `>= 0`.
    - `update_period`: every how many steps to copy, an int `>= 1`.

    **Returns:** the new target parameters.
    """
    steps = step_count("steps", steps)
    update_period = positive_count("update_period", update_period)
    new, rest = eqx.partition(new_tensors, eqx.is_array)
    old, _ = eqx.partition(old_tensors, eqx.is_array)
    chosen = jax.lax.cond(
        jnp.mod(steps, update_period.astype(steps.dtype)) == 0,
        lambda: new,
        lambda: old,
    )
    return eqx.combine(chosen, rest)
