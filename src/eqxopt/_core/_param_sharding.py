"""Where a parameter lies, for the state `init` makes from it.

State shaped like its parameter is made like it (`_tree.full_like_leaf`), so it is
placed like it by construction. State made from a parameter but shaped otherwise
(quantized blocks, a statistic with one of the parameter's dimensions reduced away:
`reduced_like`, a preconditioner's factors and stacks of per-block matrices:
`split_like`) is placed by `where` it lies: its concrete sharding or, traced
(`jax.jit` or `jax.eval_shape` of `init`) on a mesh of Explicit axes, the sharding
in its type. So a state that follows FSDP-sharded parameters is split from the
start, and `jax.eval_shape(opt.init, params)` records where each leaf lies (on the
parameter's mesh, replicated where it is not split).
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
from jax.sharding import NamedSharding, PartitionSpec

from . import _jax_api
from ._jax_api import is_tracer


class Where(NamedTuple):
    """Where a parameter lies: its `mesh`, its `spec` (one entry per dimension)
    and `put(x, sharding)`, which places another array on that mesh."""

    mesh: Any
    spec: tuple[Any, ...]
    put: Callable[[Any, Any], Any]


def where(p: Any) -> Where | None:
    """Where the array `p` lies over a mesh: its concrete `NamedSharding`, or,
    traced, the sharding in its type on a mesh of Explicit axes. `None` for a 0-d
    or non-array `p`, one on no mesh, or one traced on other axes (Auto axes are
    the compiler's to decide; inside `shard_map` a value is a local block)."""
    if not isinstance(p, jax.Array) or not p.ndim:
        return None
    if is_tracer(p):
        typed = _jax_api.mesh_and_spec(p)
        kinds = set(_jax_api.axis_kinds(typed[0]).values()) if typed else set()
        if typed is None or kinds != {"explicit"}:
            return None  # Auto axes, or inside shard_map (manual axes)
        mesh, spec = typed
        put = _jax_api.reshard
    else:
        sharding = p.sharding
        if not isinstance(sharding, NamedSharding):
            return None
        mesh, spec = sharding.mesh, sharding.spec
        put = jax.device_put
    spec = tuple(spec) + (None,) * (p.ndim - len(spec))
    return Where(mesh, spec, put)


def _axes(entry: Any) -> tuple[Any, ...]:
    """The mesh axes of one `PartitionSpec` entry (a name, a tuple of them, None)."""
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def _size(mesh: Any, axes: tuple[Any, ...]) -> int:
    size = 1
    for name in axes:
        size *= mesh.shape[name]
    return size


def _entry(axes: tuple[Any, ...]) -> Any:
    return axes[0] if len(axes) == 1 else axes


def spec_like(
    shape: tuple[int, ...],
    found: Where,
    dims: tuple[int | None, ...],
    spread: bool,
) -> PartitionSpec:
    """The `PartitionSpec` of an array of `shape` made from a parameter that lies
    at `found`: dimension `i` split like the parameter's dimension `dims[i]`
    (where one is named and its axes divide it); with `spread`, the parameter's
    axes left unused split the first other dimension whose size they divide
    (so each device holds about `1/N` of it)."""
    spec: list[Any] = [None] * len(shape)
    used: set[Any] = set()
    for i, d in enumerate(dims):
        axes = () if d is None else _axes(found.spec[d])
        if axes and shape[i] % _size(found.mesh, axes) == 0:
            spec[i] = _entry(axes)
            used.update(axes)
    if spread:
        left = tuple(a for e in found.spec for a in _axes(e) if a not in used)
        size = _size(found.mesh, left)
        if left and size > 1:
            for i, n in enumerate(shape):
                if spec[i] is None and n >= size and n % size == 0:
                    spec[i] = _entry(left)
                    break
    return PartitionSpec(*spec)


def reduced_like(x: Any, p: Any, axis: int) -> Any:
    """`x`, a statistic of the parameter `p` over its dimension `axis` (shaped like
    `p` without it), placed like `p` along the dimensions it keeps (replicated on
    `p`'s mesh where it splits none of them). As it is where `where` finds no
    mesh."""
    found = where(p)
    if found is None:
        return x
    kept = tuple(d for d in range(p.ndim) if d != axis)
    spec = spec_like(x.shape, found, kept, spread=False)
    return found.put(x, NamedSharding(found.mesh, spec))


def split_like(x: Any, p: Any, dims: tuple[int | None, ...] = ()) -> Any:
    """`x`, state made from the parameter `p` but shaped otherwise (a Kronecker
    factor, an eigenbasis, a projector, a stack of per-block matrices), split
    over the mesh axes that split `p`: dimension `i` of `x` like dimension
    `dims[i]` of `p` (`None`: no such dimension), and the axes of `p` left over
    along the first other dimension of `x` they divide (a stack's leading one
    first), so each device holds about `1/N` of it as it holds `1/N` of `p`.
    Replicated on `p`'s mesh where no dimension divides; as it is where `where`
    finds no mesh. A step keeps each state leaf's placement; where the maths
    needs such a leaf whole, the compiler gathers it inside the step."""
    found = where(p)
    if found is None:
        return x
    spec = spec_like(x.shape, found, dims, spread=True)
    return found.put(x, NamedSharding(found.mesh, spec))
