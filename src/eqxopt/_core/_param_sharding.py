"""Where a parameter lies, for the state `init` makes from it.

State shaped like its parameter is made like it (`_tree.full_like_leaf`), so it is
placed like it by construction. State made from a parameter but shaped otherwise
(quantized blocks, a statistic with one of the parameter's dimensions reduced away:
`reduced_like`) is placed by `where` it lies: its concrete sharding or, traced
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


def reduced_like(x: Any, p: Any, axis: int) -> Any:
    """`x`, a statistic of the parameter `p` over its dimension `axis` (shaped like
    `p` without it), placed like `p` along the dimensions it keeps (replicated on
    `p`'s mesh where it splits none of them). As it is where `where` finds no
    mesh."""
    found = where(p)
    if found is None:
        return x
    kept = found.spec[:axis] + found.spec[axis + 1 :]
    return found.put(x, NamedSharding(found.mesh, PartitionSpec(*kept)))
