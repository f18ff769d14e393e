"""The core's compatibility module: public JAX APIs that moved or appeared between
the oldest JAX that eqxopt supports (`jax>=0.4.38` in pyproject.toml) and the newest
it is tested on (0.10.x), one place that picks the spelling this JAX has. Only public
APIs live here: the core uses no JAX internals. (The native CPU backend fences the
internals it needs in a compatibility module of its own.)"""

import functools
import inspect
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np


@functools.cache
def array_type() -> type:
    """jaxlib's concrete array class, found on first use: making an array when
    eqxopt is imported would start JAX's backends, after which
    `jax.distributed.initialize` refuses to run. The first use may come while a
    function is traced, where `jnp.zeros` would give a tracer."""
    with jax.ensure_compile_time_eval():
        return type(jax.numpy.zeros(()))


def is_tracer(x: Any) -> bool:
    """Whether `x` is an abstract value of some trace (no number to read now): a
    JAX array that is not a concrete one (tracers count as `jax.Array`s)."""
    return isinstance(x, jax.Array) and type(x) is not array_type()


def holds_tracer(tree: Any) -> bool:
    """Whether some leaf of `tree` is a tracer (`is_tracer`), checked once per
    distinct leaf type rather than per leaf (tracers are `jax.Array`s by an instance
    check, not by subclass)."""
    leaves = jax.tree.leaves(tree)
    one_per_type = dict(zip(map(type, leaves), leaves)).values()
    return any(map(is_tracer, one_per_type))


@functools.cache
def several_devices() -> bool:
    """Whether this process sees more than one device (of any process)."""
    return jax.device_count() > 1


def split(flat: Any, sizes: Sequence[int]) -> list[Any]:
    """`flat` (1-D) cut into consecutive pieces of `sizes` elements: `jax.lax.split`
    (JAX >= 0.4.36), whose transpose is one concatenation, so the gradient of a
    split buffer costs one copy however many pieces it has (the transpose of each
    slice alone pads a full-size buffer); consecutive slices on an older JAX."""
    new = getattr(jax.lax, "split", None)
    if new is not None:
        return list(new(flat, tuple(sizes)))
    offsets = np.cumsum([0, *sizes]).tolist()
    return [jax.lax.slice(flat, (a,), (b,)) for a, b in itertools.pairwise(offsets)]


@functools.cache
def _skips_negative_indices() -> bool:
    parameters = inspect.signature(jax.lax.dynamic_slice).parameters
    return "allow_negative_indices" in parameters


def dynamic_slice_in_range(flat: Any, start: Any, size: int) -> Any:
    """`jax.lax.dynamic_slice` of the 1-D `flat` at a traced `start` known to lie in
    `[0, flat.size - size]`: without the wrap of negative starts where this JAX can
    leave it out (`allow_negative_indices`), which is three operations fewer a
    slice to trace."""
    if _skips_negative_indices():
        return jax.lax.dynamic_slice(
            flat, (start,), (size,), allow_negative_indices=False
        )
    return jax.lax.dynamic_slice(flat, (start,), (size,))


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
    axes are the compiler's to decide and read as unsharded (`axis_kinds` tells
    them apart). The one reader of a type's sharding: the entries place their
    outputs by it (`_placement.keep`), state made at `init` follows its parameter
    by it (`_param_sharding`), and Muon and SOAP find a leaf's mesh by it."""
    typeof = getattr(jax, "typeof", None)
    if typeof is None:
        return None
    sharding = getattr(typeof(x), "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or not getattr(mesh, "axis_names", ()):
        return None
    return mesh, getattr(sharding, "spec", None)


def abstract_type(x: Any) -> Any:
    """The hashable abstract type of array `x` (or tracer): `jax.typeof(x)` (JAX >=
    0.6: shape, dtype, weak type and, where JAX has them, sharding and varying axes),
    else its shape, dtype and weak type."""
    typeof = getattr(jax, "typeof", None)
    if typeof is not None:
        return typeof(x)
    return (tuple(np.shape(x)), np.dtype(x.dtype), bool(getattr(x, "weak_type", False)))


def axis_kinds(mesh: Any) -> dict[str, str]:
    """`{axis name: "explicit" | "auto" | "manual"}` for a mesh from
    `mesh_and_spec` (the names of `jax.sharding.AxisType`, lower-cased)."""
    return {
        name: str(getattr(kind, "name", kind)).lower()
        for name, kind in zip(mesh.axis_names, mesh.axis_types)
    }


def auto_version(mesh: Any) -> Any:
    """The abstract mesh `mesh` (from `mesh_and_spec`) with its Explicit axes made
    Auto (`AbstractMesh.update_axis_types`)."""
    auto = jax.sharding.AxisType.Auto  # pyright: ignore[reportAttributeAccessIssue]
    kinds = axis_kinds(mesh)
    return mesh.update_axis_types(
        {name: auto for name, kind in kinds.items() if kind == "explicit"}
    )


def use_abstract_mesh(mesh: Any) -> Any:
    """`jax.sharding.use_abstract_mesh(mesh)`: a context in which traced values are
    typed on `mesh` (its axis types: which axes the types name)."""
    return jax.sharding.use_abstract_mesh(mesh)  # pyright: ignore[reportAttributeAccessIssue]


def reshard(x: Any, sharding: Any) -> Any:
    """`jax.sharding.reshard`: `x` moved to `sharding` (Explicit axes)."""
    return jax.sharding.reshard(x, sharding)  # pyright: ignore[reportAttributeAccessIssue]


def shard_alike(x: Any, like: Any) -> Any:
    """`x` given the sharding the compiler picks for `like` (Auto axes)."""
    from jax.experimental.shard_alike import shard_alike as alike

    return alike(x, like)[0]


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
