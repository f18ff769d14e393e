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

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, PyTree

from . import _fused
from ._tree import align_grads, compute_dtype, is_float_leaf

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
    native = _Native(rule, len(moments)) if elementwise and _fused.usable() else None
    for i, (g, p) in enumerate(zip(grad_leaves, param_leaves)):
        old = [m[i] for m in moment_leaves]
        if g is None or not is_float_leaf(p):
            updates.append(None)
            for column, value in zip(new_moments, old):
                column.append(value)
            continue
        if native is not None and native.takes(g, p, old):
            flag = () if flags is None else (flags[i],)
            try:
                outs = native(g, p, old, flag)
            except _fused.Unsupported:
                native = None  # XLA's code for this rule, on every leaf
            else:
                updates.append(outs[0])
                for column, value in zip(new_moments, outs[1:]):
                    column.append(value)
                continue
        dtype = compute_dtype(p.dtype)
        args = [g.astype(dtype), p.astype(dtype), *(m.astype(dtype) for m in old)]
        if flags is not None:
            args.append(flags[i])
        outs = rule(*args)
        updates.append(outs[0])
        for column, value, stored in zip(new_moments, outs[1:], old):
            column.append(value.astype(stored.dtype))
    return (
        param_def.unflatten(updates),
        tuple(param_def.unflatten(column) for column in new_moments),
    )


_F32 = jnp.dtype(jnp.float32)


class _Native:
    """Runs one rule through `_fused` (native kernels), leaf by leaf.

    Programs are translated once per flag value and output set. Inside `step` the
    kernel also applies the update and the update itself is left to a second,
    normally unused call (XLA drops it); under donation outputs reuse the buffers of
    the parameter and moments they replace."""

    def __init__(self, rule: LeafRule, n_moments: int):
        self.rule = rule
        self.n_in = 2 + n_moments
        self.programs: dict[tuple, _fused.Program] = {}
        self.applied = _fused.applying()
        self.in_place = _fused.in_place()

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

    def __call__(self, g: Any, p: Any, old: list[Any], flag: tuple) -> list[Any]:
        inputs = [g, p, *old]
        moments = {2 + k: 1 + k for k in range(len(old))} if self.in_place else {}
        if self.applied is None:
            return _fused.run(self.program("update", flag), inputs, moments)
        aliases = {1: 0, **moments} if self.in_place else {}
        new_p, *new_moments = _fused.run(self.program("step", flag), inputs, aliases)
        (update,) = _fused.run(self.program("direction", flag), inputs, {})
        self.applied[id(update)] = (update, new_p)
        return [update, *new_moments]
