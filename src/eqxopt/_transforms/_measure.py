"""Measurements of the updates recorded into the state, for debugging and logging
a chain (optax's `snapshot` and `measure_with_ema`): links that pass the updates
through unchanged."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int, PyTree

from .._core._base import AbstractTransform, Grads, Params, Updates
from .._core._checks import renames
from .._core._fields import (
    DTypeLike,
    ScalarOrSchedule,
    checked_field,
    dtype_field,
    flag_field,
    hyper,
    values_at,
)
from .._core._leafwise import map_leaves
from .._core._tree import increment, is_float_leaf, zero_step


def _measure(name: str, value: Callable[..., Any]) -> Callable:
    if not callable(value) or isinstance(value, eqx.Module):
        raise TypeError(
            f"{name} must be a function of the updates, got {type(value).__name__}"
        )
    return value


def _name(name: str, value: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    return value


def _float_params(params: Params) -> PyTree:
    # What `init` measures: the float leaves, `None` where an update never comes.
    return jax.tree.map(lambda p: p if is_float_leaf(p) else None, params)


def _passed(grads: Grads, params: Params) -> Updates:
    updates, _ = map_leaves(lambda g, p: (g,), grads, params)
    return updates


def _like(new: PyTree, old: PyTree) -> PyTree:
    # The state keeps the dtypes `init` gave it (a measure of bf16 parameters at
    # `init`, of float32 updates later).
    return jax.tree.map(lambda n, o: jnp.asarray(n).astype(o.dtype), new, old)


class SnapshotState(eqx.Module):
    """State of `Snapshot` (the field of optax's `SnapshotState`).

    **Fields:**

    - `measurement`: a dict `{measure_name: measure(updates)}` of the last step's
      updates (of the parameters after `init`); `eqxopt.tree_get(state,
      measure_name)` reads it from a chain's state.
    """

    measurement: dict[str, Any]


class Snapshot(AbstractTransform):
    """Records a measurement of the updates that reach it into the state and passes
    them on unchanged, `u = u`: the same as `optax.snapshot`, to see what a link
    in the middle of a chain gives (a norm before clipping, say).

    `measure` gets the updates (full precision; `None` at the leaves that get no
    update), at `init` the float parameters (`None` elsewhere), and returns a tree
    of arrays of the same shapes at every step (kept in the dtypes of the first).
    It is static, part of the compiled step's key: pass the same function each
    time (`eqxopt.tree_norm`, one defined at module level), not a new `lambda` per
    transform.

    **Arguments:**

    - `measure_name`: the key of the measurement in `state.measurement`, a str.
    - `measure`: a function `updates -> measurement`.
    """

    reduces_over = "tree"

    reads_params = None  # the parameters are not read (`params_needed`)

    measure_name: str = checked_field(_name, static=True)
    measure: Callable = checked_field(_measure, static=True)

    def init(self, params: Params) -> SnapshotState:
        return SnapshotState({self.measure_name: self.measure(_float_params(params))})

    def transform(
        self, grads: Grads, state: SnapshotState, params: Params
    ) -> tuple[Updates, SnapshotState]:
        updates = _passed(grads, params)
        old = state.measurement[self.measure_name]
        return updates, SnapshotState(
            {self.measure_name: _like(self.measure(updates), old)}
        )


class MeasureWithEMAState(eqx.Module):
    """State of `MeasureWithEMA`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done (optax's `count`).
    - `ema`: the moving average of the measurement, not debiased (optax's `ema`).
    - `measurement`: the average as optax's `monitor` records it: `ema` debiased
      with `debias`, else `ema` (zeros after `init`).
    """

    step: Int[Array, ""]
    ema: PyTree
    measurement: PyTree


class MeasureWithEMA(AbstractTransform):
    r"""Records an exponential moving average of a measurement of the updates into
    the state and passes the updates on unchanged, with `m = measure(u)` and
    `t = step + 1`:

    $$
    \begin{aligned}
    \mathrm{ema} &\leftarrow \mathrm{decay} \cdot \mathrm{ema}
        + (1 - \mathrm{decay})\, m \\
    \mathrm{measurement} &= \mathrm{ema} / (1 - \mathrm{decay}^t)
        && \text{(\texttt{ema} itself without \texttt{debias})}
    \end{aligned}
    $$

    The numbers of `optax.measure_with_ema` inside `optax.monitor`
    (`optax.monitor({name: optax.measure_with_ema(measure, decay)})`); here it is a
    link of its own, whose updates are the ones it got (optax's, used alone, are
    the average). `measure` is as `Snapshot`'s: a function of the updates, static
    (pass the same one each time); at `init` it sees the float parameters, to give
    the average its shapes.

    **Arguments:**

    - `measure`: a function `updates -> measurement` (a tree of arrays).
    - `decay`: decay of the average, in `[0, 1)`; a schedule is read at the step.
    - `debias`: record the average divided by `1 - decay**t` (a bool).
    - `ema_dtype`: the float dtype to keep the average in; `None`: the
      measurement's, or float32 for a measurement that is not a float (a bool
      such as `norm > 1`) (optax's `accumulator_dtype`).
    """

    reduces_over = "tree"

    reads_params = None  # the parameters are not read (`params_needed`)

    # optax's spellings (`_checks.refuse_renamed`)
    renamed_arguments = renames(accumulator_dtype=("ema_dtype",))

    measure: Callable = checked_field(_measure, static=True)
    decay: ScalarOrSchedule = hyper(low=0.0, high=1.0, high_open=True)
    debias: bool = flag_field(True, kw_only=False)
    ema_dtype: DTypeLike = dtype_field(kw_only=False)

    def init(self, params: Params) -> MeasureWithEMAState:
        def zeros(m: Any) -> Array:
            m = jnp.asarray(m)
            if self.ema_dtype is not None:
                dtype = self.ema_dtype
            elif jnp.issubdtype(m.dtype, jnp.inexact):
                dtype = m.dtype
            else:
                dtype = jnp.float32
            return jnp.zeros(m.shape, dtype)

        ema = jax.tree.map(zeros, self.measure(_float_params(params)))
        return MeasureWithEMAState(
            step=zero_step(), ema=ema, measurement=jax.tree.map(jnp.copy, ema)
        )

    def transform(
        self, grads: Grads, state: MeasureWithEMAState, params: Params
    ) -> tuple[Updates, MeasureWithEMAState]:
        updates = _passed(grads, params)
        decay = values_at(self, state.step).decay
        t = increment(state.step)

        def average(m: Any, e: Array) -> tuple[Array, Array]:
            m = jnp.asarray(m)
            dtype = jnp.promote_types(e.dtype, jnp.float32)
            d = decay.astype(dtype)
            new = d * e.astype(dtype) + (1 - d) * m.astype(dtype)
            shown = new / (1 - d ** t.astype(dtype)) if self.debias else new
            return new.astype(e.dtype), shown.astype(e.dtype)

        treedef = jax.tree.structure(state.ema)
        pairs = [
            average(m, e)
            for m, e in zip(
                treedef.flatten_up_to(self.measure(updates)), jax.tree.leaves(state.ema)
            )
        ]
        return updates, MeasureWithEMAState(
            step=t,
            ema=treedef.unflatten([new for new, _ in pairs]),
            measurement=treedef.unflatten([shown for _, shown in pairs]),
        )
