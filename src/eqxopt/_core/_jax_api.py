"""Public JAX APIs that moved or appeared between the oldest JAX that eqxopt supports
(`jax>=0.4.38` in pyproject.toml) and the newest it is tested on (0.10.x): one place
that picks the spelling this JAX has. Only public APIs live here; JAX internals are
fenced in `eqxopt/_native/_compat.py`."""

from collections.abc import Callable
from typing import Any

import jax


def shard_map(
    fn: Callable, *, mesh: Any, in_specs: Any, out_specs: Any, check: bool = True
) -> Callable:
    """`jax.shard_map` (JAX >= 0.6), or `jax.experimental.shard_map.shard_map` before
    it; `check` is `check_vma` there and `check_rep` here."""
    new = getattr(jax, "shard_map", None)
    if new is not None:
        return new(
            fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check
        )
    from jax.experimental.shard_map import shard_map as old  # pyright: ignore

    return old(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=check)


def varying_axes(x: Any) -> frozenset | None:
    """The manual mesh axes (of the enclosing `shard_map`) that the value of `x` (an
    array, tracer or `jax.ShapeDtypeStruct`) varies over: `jax.typeof(x).vma` (JAX
    0.6 to 0.9), `.manual_axis_type.varying` (JAX >= 0.10); `None` on a JAX without
    varying-axes types (before 0.6), where nothing is known. Outside `shard_map`, or
    inside one with `check_vma=False`, the set is empty."""
    if isinstance(x, jax.ShapeDtypeStruct):
        aval = x
    else:
        typeof = getattr(jax, "typeof", None)
        if typeof is None:
            return None
        aval = typeof(x)
    vma = getattr(aval, "vma", None)
    if vma is None:
        mat = getattr(aval, "manual_axis_type", None)
        vma = getattr(mat, "varying", None)
    return None if vma is None else frozenset(vma)


def pvary(x: Any, axes: tuple) -> Any:
    """`x` typed as varying over the manual mesh axes `axes` too (its value is
    unchanged): `jax.lax.pcast(x, axes, to="varying")` (JAX >= 0.8),
    `jax.lax.pvary` before it, and `x` itself on a JAX without varying-axes types."""
    if not axes:
        return x
    pcast = getattr(jax.lax, "pcast", None)
    if pcast is not None:
        return pcast(x, axes, to="varying")
    old = getattr(jax.lax, "pvary", None)
    return x if old is None else old(x, axes)
