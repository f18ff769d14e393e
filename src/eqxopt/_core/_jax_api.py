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


def explicit_sharding(x: Any) -> Any:
    """The sharding in `x`'s type when its mesh has an Explicit axis (JAX's sharding
    in types, `jax.typeof(x).sharding`), else `None` (Auto meshes, and JAX before
    explicit sharding, whose types carry no sharding)."""
    typeof = getattr(jax, "typeof", None)
    explicit = getattr(getattr(jax.sharding, "AxisType", None), "Explicit", None)
    if typeof is None or explicit is None:
        return None
    sharding = getattr(typeof(x), "sharding", None)
    axis_types = getattr(getattr(sharding, "mesh", None), "axis_types", ())
    return sharding if explicit in tuple(axis_types) else None


def reshard(x: Any, sharding: Any) -> Any:
    """`jax.sharding.reshard` (only reached where `explicit_sharding` found one)."""
    return jax.sharding.reshard(x, sharding)  # pyright: ignore
