"""Reading an optimizer's hyperparameters at its state's step, and recording
gradient and update norms into the state for logging."""

import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._core._base import (
    AbstractTransform,
    Grads,
    Params,
    Updates,
    checked_transform,
)
from .._core._fields import axis_name_field, hyperparameter_fields, values_at
from .._core._norms import norm, reduction_dtype
from .._core._shards import AxisName
from .._core._tree import align_grads, is_float_leaf, zero_step
from ._chain import Chain, ChainState
from ._partition import Partition, PartitionState
from ._wrapper import AbstractSingleWrapper, inner_field, leaves_of


def hyperparameters(opt: AbstractTransform, state: Any) -> dict[str, Any]:
    """Every hyperparameter of `opt` at the step its `state` has reached: the
    value the next update uses (schedules called), by name.

    A `Chain` gives a dict by link name (`state`'s names), a `Partition` a dict
    by label, a wrapper around one transform its own values plus `"inner"`
    (the wrapped transform's dict), as in
    `hyperparameters(opt, state)["ScaleByLearningRate"]["learning_rate"]`. A
    transform built from others that it holds as fields (`DPSGD`: a
    `DifferentiallyPrivateAggregate` and an `SGD`) gives their values with its
    own, at its state's step (under the field's name, as a dict, where two would
    share a name).

    **Arguments:**

    - `opt`: the optimizer or transform.
    - `state`: its state (from `init`, `update` or `step`).

    **Returns:** a dict from names to scalar arrays (and nested dicts).
    """
    checked_transform("opt", opt)
    if isinstance(opt, Chain):
        if not isinstance(state, ChainState):
            raise TypeError(f"state must be a ChainState, got {type(state).__name__}")
        return {
            name: hyperparameters(link, link_state)
            for name, link, link_state in zip(state.names, opt.links, state.states)
        }
    if isinstance(opt, Partition):
        if not isinstance(state, PartitionState):
            raise TypeError(
                f"state must be a PartitionState, got {type(state).__name__}"
            )
        return {
            label: hyperparameters(t, state.groups[label])
            for label, t in opt.transforms.items()
        }
    step = getattr(state, "step", None)
    step = zero_step() if step is None else step
    wrapper = isinstance(opt, AbstractSingleWrapper)
    own = _values(opt, step, skip="inner" if wrapper else None)
    if wrapper:
        # Wrappers keep the inner state in `inner`, or are the inner state itself.
        inner_state = getattr(state, "inner", state)
        own["inner"] = hyperparameters(opt.inner, inner_state)
    return own


def _values(opt: AbstractTransform, step: Any, skip: str | None = None) -> dict:
    """`opt`'s hyperparameters at `step` (`values_at`), with those of the
    transforms it holds as fields (but `skip`), merged in where no name is taken
    and under the field's name otherwise."""
    at_step = values_at(opt, step)
    own = {name: getattr(at_step, name) for name in hyperparameter_fields(opt)}
    for field in dataclasses.fields(opt):
        held = getattr(opt, field.name, None)
        if field.name == skip or not isinstance(held, AbstractTransform):
            continue
        theirs = _values(held, step)
        if own.keys() & theirs.keys():
            own[field.name] = theirs
        else:
            own.update(theirs)
    return own


class MonitorState(eqx.Module):
    """State of `Monitor`.

    **Fields:**

    - `grad_norm`: scalar, the global norm of the last step's gradients (as
      `eqxopt.global_norm`: NaN when they hold a NaN).
    - `update_norm`: scalar, the global norm of the last step's updates.

    Both are float32, or float64 for float64 parameters under `jax_enable_x64`.
    - `inner`: the wrapped optimizer's state.
    """

    grad_norm: Float[Array, ""]
    update_norm: Float[Array, ""]
    inner: Any


class Monitor(AbstractSingleWrapper):
    """Runs `inner` and records, for logging, the global (Euclidean) norms of the
    step's gradients and of `inner`'s updates into the state: `state.grad_norm`,
    `state.update_norm`. The updates are `inner`'s, unchanged.

    **Arguments:**

    - `inner`: the optimizer (or chain) to watch.
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them: the
      norms of the whole model (each leaf summed over the named axes it is split
      over), the same on every device. `None` (default): this device's blocks.
    """

    reduces_over = "tree"

    inner: AbstractTransform = inner_field()
    axis_name: AxisName = axis_name_field()

    def init(self, params: Params) -> MonitorState:
        # Two buffers: a donated step may write each in place.
        dtype = reduction_dtype(jax.tree.leaves(params))
        return MonitorState(
            grad_norm=jnp.zeros((), dtype),
            update_norm=jnp.zeros((), dtype),
            inner=self.inner.init(params),
        )

    def transform(
        self, grads: Grads, state: MonitorState, params: Params, **extra: Any
    ) -> tuple[Updates, MonitorState]:
        updates, inner_state = self.run_inner(grads, state.inner, params, extra)
        floats = [is_float_leaf(p) for p in jax.tree.leaves(params)]
        dtype = state.grad_norm.dtype  # chosen from the parameters at `init`
        grad_norm = norm(
            [g for g, f in zip(align_grads(grads, params), floats) if f],
            self.axis_name,
            "Monitor",
        ).astype(dtype)
        update_norm = norm(
            [u for u, f in zip(leaves_of(updates, params), floats) if f],
            self.axis_name,
            "Monitor",
        ).astype(dtype)
        return updates, MonitorState(
            grad_norm=grad_norm, update_norm=update_norm, inner=inner_state
        )
