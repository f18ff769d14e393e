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


def mesh_and_spec(x: Any) -> tuple[Any, Any] | None:
    """The (abstract) mesh and the `PartitionSpec` in the type of `x` (sharding in
    types, `jax.typeof`, JAX >= 0.6), or None where this JAX has no such types or
    `x` lies on no mesh with named axes. The spec names only Explicit axes: Auto
    axes are the compiler's to decide and read as unsharded."""
    typeof = getattr(jax, "typeof", None)
    if typeof is None:
        return None
    sharding = getattr(typeof(x), "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or not getattr(mesh, "axis_names", ()):
        return None
    return mesh, getattr(sharding, "spec", None)


def axis_kinds(mesh: Any) -> dict[str, str]:
    """`{axis name: "explicit" | "auto" | "manual"}` for a mesh from
    `mesh_and_spec` (the names of `jax.sharding.AxisType`, lower-cased)."""
    return {
        name: str(getattr(kind, "name", kind)).lower()
        for name, kind in zip(mesh.axis_names, mesh.axis_types)
    }


def reshard(x: Any, sharding: Any) -> Any:
    """`jax.sharding.reshard`: `x` moved to `sharding` (Explicit axes)."""
    return jax.sharding.reshard(x, sharding)  # pyright: ignore[reportAttributeAccessIssue]


def matmul(a: Any, b: Any, out_sharding: Any = None) -> Any:
    """`a @ b`, with `out_sharding` (JAX >= 0.6) where given: the sharding of a
    product over an Explicit axis that both operands split."""
    if out_sharding is None:
        return a @ b
    return jax.numpy.matmul(a, b, out_sharding=out_sharding)  # pyright: ignore[reportCallIssue]


def shard_alike(x: Any, like: Any) -> Any:
    """`x` given the sharding the compiler picks for `like` (Auto axes)."""
    from jax.experimental.shard_alike import shard_alike as alike

    return alike(x, like)[0]
