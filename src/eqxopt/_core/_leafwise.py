"""The engine that runs an optimizer's per-leaf maths over a parameter tree.

An optimizer writes its rule for one leaf, `rule(g, p, *moments) -> (u, *moments)`,
on arrays already cast to the compute dtype (at least float32). `map_leaves` does the
rest once for everybody: it pairs every float parameter with its gradient and state,
skips leaves whose gradient is `None` (their state is kept as it was), upcasts
low-precision inputs, and casts new state back to the dtype it is stored in.

Each leaf gets its own element-wise code, on purpose: XLA's CPU backend compiles
identical per-leaf fusions once and reuses the kernel, whereas gathering leaves into
flat or stacked buffers needs one slice per leaf to hand the results back, and every
slice (a different offset) is a kernel of its own to compile (benchmarks/README).
With `elementwise=True` and float32 leaves on a single CPU device, the rule instead
runs as one native C loop per leaf (`_fused`): one pass, multi-threaded for large
leaves, fused with the apply inside `step`; results agree to rounding.
"""

import functools
import types
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int, PyTree

from .._native import _fused
from ._base import AbstractTransform, Grads, Params
from ._fields import values_at
from ._masks import decay_flags
from ._tree import (
    align_grads,
    compute_dtype,
    float_leaves_like,
    increment,
    is_float_leaf,
    zero_step,
)

LeafRule = Callable[..., tuple[Array, ...]]


def map_leaves(
    rule: LeafRule,
    grads: PyTree,
    params: PyTree,
    moments: Sequence[PyTree] = (),
    *,
    elementwise: bool = False,
    flags: Sequence[Any] | None = None,
) -> tuple[PyTree, tuple[PyTree, ...]]:
    """Applies `rule` to every float leaf of `params` that has a gradient.

    **Arguments:**

    - `rule`: `rule(g, p, *moment_leaves) -> (update, *new_moment_leaves)`, called
      with float arrays in the compute dtype.
    - `grads`: gradients with the structure of `params` (`None` allowed).
    - `params`: the parameters.
    - `moments`: state trees shaped like `params` (`None` at non-float leaves).
    - `elementwise`: promise that `rule` treats every element on its own (no norms,
      reductions or shape-dependent maths). The engine may then run it on many leaves
      at once, concatenated into flat buffers; the results are the same.
    - `flags`: optional hashable Python values, one per leaf of `params` (in
      `jax.tree.leaves` order, such as a resolved weight-decay mask); each is passed
      to `rule` as its last argument. Leaves are only ever grouped with leaves of the
      same flag.

    **Returns:** `(updates, new_moments)`: updates in the compute dtype (`None` where
    there is no update), and each moment tree with its stored dtypes.
    """
    param_leaves, param_def = jax.tree.flatten(params)
    grad_leaves = align_grads(grads, params)
    # Moment trees hold None at non-float leaves, so they flatten up to params.
    moment_leaves = [param_def.flatten_up_to(m) for m in moments]
    updates: list[Any] = []
    new_moments: list[list[Any]] = [[] for _ in moments]
    # Native kernels for steps that write in place: a step into new buffers is bound
    # by their allocation (page faults), which XLA's passes pay no worse.
    native = (
        _Native(rule, len(moments))
        if elementwise and _fused.in_place() and _fused.usable()
        else None
    )
    previous: list[Any] = []  # the gradients of the last leaves that have one
    for i, (g, p) in enumerate(zip(grad_leaves, param_leaves)):
        old = [m[i] for m in moment_leaves]
        after = tuple(previous)
        if g is not None:
            previous = [*previous, g][-_WAIT_FOR:]
        if g is None or not is_float_leaf(p):
            updates.append(None)
            for column, value in zip(new_moments, old):
                column.append(value)
            continue
        if native is not None and native.takes(g, p, old):
            flag = () if flags is None else (flags[i],)
            try:
                native.add(i, g, p, old, flag, after)
            except _fused.Unsupported:
                native = None  # XLA's code for this rule, on every other leaf
            else:
                updates.append(None)  # filled in by `native.finish()` below
                for column in new_moments:
                    column.append(None)
                continue
        dtype = compute_dtype(p.dtype)
        args = [g.astype(dtype), p.astype(dtype), *(m.astype(dtype) for m in old)]
        if flags is not None:
            args.append(flags[i])
        outs = rule(*args)
        updates.append(outs[0])
        for column, value, stored in zip(new_moments, outs[1:], old):
            column.append(value.astype(stored.dtype))
    if native is not None:
        for i, outs in native.finish().items():
            updates[i] = outs[0]
            for column, value in zip(new_moments, outs[1:]):
                column[i] = value
    return (
        param_def.unflatten(updates),
        tuple(param_def.unflatten(column) for column in new_moments),
    )


_F32 = jnp.dtype(jnp.float32)


class _Native:
    """Runs one rule through `_fused` (native kernels).

    Programs are translated once per flag value and output set. Leaves below
    `_GROUP_BELOW` elements share custom calls, `_GROUP_SIZE` at a time (each call
    is an XLA thunk with a few microseconds of overhead; more leaves per call would
    make XLA's alias analysis slow to compile); larger leaves get one call each, which
    splits them across threads. Inside `step` the kernel also applies the update and
    the update itself is left to a second, normally unused call (XLA drops it)."""

    def __init__(self, rule: LeafRule, n_moments: int):
        self.rule = rule
        self.n_in = 2 + n_moments
        self.programs: dict[tuple, _fused.Program] = {}
        self.applied = _fused.applying()
        self.pending: dict[tuple, list[tuple[int, list[Any]]]] = {}
        # The gradient each leaf's in-place call waits for (`_fused.order_after`).
        self.after: dict[int, Any] = {}

    def takes(self, g: Any, p: Any, old: list[Any]) -> bool:
        return all(
            x is not None and x.dtype == _F32 and x.shape == p.shape
            for x in (g, p, *old)
        )

    def program(self, outputs: str, flag: tuple) -> _fused.Program:
        key = (outputs, flag)
        if key not in self.programs:
            self.programs[key] = _fused.translate(self.rule, self.n_in, flag, outputs)
        return self.programs[key]

    def add(
        self, index: int, g: Any, p: Any, old: list[Any], flag: tuple, after: Any
    ) -> None:
        # Translate and build now, so that an untranslatable rule (or a kernel that
        # cannot be built) falls back before any leaf is queued.
        kinds = ("update",) if self.applied is None else ("step", "direction")
        for kind in kinds:
            _fused.load(self.program(kind, flag))
        small = p.size < _GROUP_BELOW
        self.pending.setdefault((flag, small), []).append((index, [g, p, *old]))
        self.after.setdefault(index, after)

    def finish(self) -> dict[int, list[Any]]:
        results: dict[int, list[Any]] = {}
        for (flag, small), queued in self.pending.items():
            size = _GROUP_SIZE if small else 1
            for start in range(0, len(queued), size):
                chunk = queued[start : start + size]
                for (index, _), outs in zip(chunk, self.run(chunk, flag)):
                    results[index] = outs
        return results

    def waits(self, chunk: list[tuple[int, list[Any]]]) -> list[Any]:
        # A call of several (small) leaves waits for what each of them waits for.
        found = {id(g): g for index, _ in chunk for g in self.after[index]}
        return list(found.values())

    def run(self, chunk: list[tuple[int, list[Any]]], flag: tuple) -> list[list[Any]]:
        inputs = [leaf for _, leaf in chunk]
        n_moments = self.n_in - 2
        # In place (the engine runs only donated steps here): each output reuses
        # the buffer of the parameter or moment it replaces.
        moments = {2 + k: 1 + k for k in range(n_moments)}
        if self.applied is None:
            return _fused.run_many(
                self.program("update", flag), inputs, moments, self.waits(chunk)
            )
        after = self.waits(chunk)
        stepped = _fused.run_many(
            self.program("step", flag), inputs, {1: 0, **moments}, after
        )
        directions = _fused.run_many(self.program("direction", flag), inputs, {})
        results = []
        for (new_p, *new_moments), (update,) in zip(stepped, directions):
            self.applied[id(update)] = (update, new_p)
            results.append([update, *new_moments])
        return results


# A leaf's in-place call waits for the gradients of this many leaves before it
# (`_fused.order_after`): enough for the parallel branches of a layer (attention's
# query, key and value projections read the same input).
_WAIT_FOR = 4
# Leaves smaller than this share custom calls, this many at a time.
_GROUP_BELOW = 1 << 16
_GROUP_SIZE = 32


_NO_MASK = object()


class AbstractLeafwiseOptimizer(AbstractTransform):
    """An optimizer whose maths is one rule per parameter leaf, over a few
    params-shaped state trees (moments): the base of every optimizer that is its
    fields plus a `leaf` method.

    A subclass declares:

    - its options as fields (`eqxopt._core._fields`: `learning_rate()`, `hyper()`,
      `mask()`, `dtype()`, ...);
    - `state_type`: its state module, with a `step` field and one field per moment;
    - `moments`: the names of the moment fields, in the order `leaf` takes them;
      each is stored in the dtype of the field `<name>_dtype` if there is one (else
      each parameter's dtype);
    - `elementwise`: whether `leaf` treats every element on its own (no reductions
      and no shape-dependent maths), which lets the native kernels run it;
    - `leaf(h, t, g, p, *moments[, decayed]) -> (update, *new_moments)`: the rule,
      on arrays in the compute dtype; `h` holds every hyperparameter's value at
      this step (`h.learning_rate`, `h.b1`, ...; `_fields.values_at`) and what
      `step_values` adds, `t` is the step count after this update, and `decayed`
      (passed when the optimizer has a `mask` field) whether this leaf is masked
      in.

    The engine does the rest: state creation, `None` gradients, dtypes, the mask,
    and the native fast path.
    """

    learning_rate: eqx.AbstractVar[Any]
    state_type: eqx.AbstractClassVar[type[eqx.Module]]
    moments: eqx.AbstractClassVar[tuple[str, ...]]
    elementwise: eqx.AbstractClassVar[bool]
    # The per-leaf rule (a method); see above.
    leaf: eqx.AbstractClassVar[Callable[..., tuple[Array, ...]]]

    def step_values(self, step: Int[Array, ""]) -> types.SimpleNamespace:
        """What `leaf` gets as `h` at `step`: every hyperparameter's value there
        (`_fields.values_at`). A subclass may add values derived from them, which
        are then computed once per step rather than once per leaf (bias
        corrections, ...)."""
        return values_at(self, step)

    def moment_fill(self, name: str) -> float:
        """The value a moment starts at (0 unless a subclass says otherwise)."""
        del name
        return 0.0

    def _flags(self, params: Params) -> list[bool] | None:
        # Whether each leaf is masked in, for optimizers with a `mask` field.
        mask = getattr(self, "mask", _NO_MASK)
        return None if mask is _NO_MASK else decay_flags(mask, params)

    def init(self, params: Params) -> Any:
        self._flags(params)  # a bad mask fails here, not mid-training
        moments = {
            name: float_leaves_like(
                params, getattr(self, f"{name}_dtype", None), self.moment_fill(name)
            )
            for name in self.moments
        }
        return self.state_type(step=zero_step(), **moments)  # pyright: ignore

    def transform(self, grads: Grads, state: Any, params: Params) -> tuple[Any, Any]:
        h = self.step_values(state.step)
        t = increment(state.step)
        updates, new = map_leaves(
            functools.partial(self.leaf, h, t),
            grads,
            params,
            tuple(getattr(state, name) for name in self.moments),
            elementwise=self.elementwise,
            flags=self._flags(params),
        )
        return updates, self.state_type(step=t, **dict(zip(self.moments, new)))  # pyright: ignore
