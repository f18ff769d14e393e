"""Independent pieces of work spread over a mesh, each done on one device.

A preconditioner's periodic work (Shampoo's inverse roots, SOAP's eigenbases,
PSGD's factor fit) is a set of independent problems, one per block or factor
matrix. Left to the compiler, every device of a mesh computes every one of them
(an eigendecomposition of a matrix that is split or replicated is computed whole
everywhere). `map_round_robin` gives each problem to one device instead: problems
of the same shapes are pooled across leaves, each device computes its own inside
`shard_map` (a device with fewer problems than the others skips its empty slots),
and the results go where the caller needs them, by the collectives the compiler
adds to place them (an all-to-all to the devices that hold the state, an
all-gather where every device uses them). A stack of `k` problems whose count the
mesh's device count divides is split as the state placed by
`_param_sharding.split_like` is (device `d` computes the `d`-th contiguous `k/N`),
so its inputs and results move nowhere; the other problems go to the devices in
turn, from where the last left off.

Off a mesh (one device, or inside a user's `shard_map`, where each device is on its
own) the problems run as a `jax.vmap` over each stack, as they would without this.
"""

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from . import _jax_api, _shards


def work_mesh(tree: Any) -> Any:
    """The (abstract) mesh of Auto axes over several devices that the array leaves
    of `tree` are typed on, inside a trace (the first found), or `None`: one
    device, or a mesh with Manual axes (inside `shard_map`) or Explicit ones (the
    entries make them Auto: `_placement.on_auto_axes`)."""
    for x in jax.tree.leaves(tree):
        if not isinstance(x, jax.Array):
            continue
        typed = _jax_api.mesh_and_spec(x)
        if typed is None:
            continue
        mesh = typed[0]
        if set(_jax_api.axis_kinds(mesh).values()) == {"auto"} and mesh.size > 1:
            return mesh
        return None
    return None


def _signature(stack: Any) -> Any:
    leaves, treedef = jax.tree.flatten(stack)
    return treedef, tuple((x.shape[1:], jnp.dtype(x.dtype)) for x in leaves)


def _count(stack: Any) -> int:
    return jax.tree.leaves(stack)[0].shape[0]


def map_round_robin(
    fn: Callable[[Any], Any], stacks: Sequence[Any], mesh: Any
) -> list[Any]:
    """`[jax.vmap(fn)(stack) for stack in stacks]`, each problem (one entry along
    the leading axis of every array of a stack; stacks are pytrees whose arrays
    share that length) computed on one device of `mesh` (from `work_mesh`);
    without a mesh, that `vmap`. `fn` maps one problem to its result (a pytree of
    arrays)."""
    if mesh is None:
        return [jax.vmap(fn)(stack) for stack in stacks]
    groups: dict[Any, list[int]] = {}
    for i, stack in enumerate(stacks):
        groups.setdefault(_signature(stack), []).append(i)
    results: list[Any] = [None] * len(stacks)
    turn = 0
    for members in groups.values():
        found, turn = _map_group(fn, [stacks[i] for i in members], mesh, turn)
        for i, result in zip(members, found):
            results[i] = result
    return results


def _map_group(
    fn: Callable, stacks: list[Any], mesh: Any, turn: int
) -> tuple[list[Any], int]:
    """`map_round_robin` for stacks of problems of the same shapes, pooled into
    one `(devices, slots, ...)` array of each device's problems; the devices'
    turn goes on from `turn` (returned for the next group)."""
    devices = mesh.size
    counts = [_count(stack) for stack in stacks]
    even = [k % devices == 0 for k in counts]
    # A stack the device count divides: device d takes its d-th contiguous part,
    # by a reshape (where its state is split so, nothing moves).
    parts = [
        jax.tree.map(lambda x: x.reshape(devices, -1, *x.shape[1:]), stack)
        for stack, ok in zip(stacks, even)
        if ok
    ]
    valid = [
        np.ones((devices, k // devices), bool) for k, ok in zip(counts, even) if ok
    ]
    # The others' problems go to the devices in turn, each at its device's next
    # slot; `table` gives each slot's problem, or the zero row past them.
    rest = [stack for stack, ok in zip(stacks, even) if not ok]
    owners = []
    if rest:
        count = sum(_count(stack) for stack in rest)
        owners = [(turn + j) % devices for j in range(count)]
        turn = (turn + count) % devices
        slots = -(-count // devices)
        table = np.full((devices, slots), count)
        filled = [0] * devices
        for j, d in enumerate(owners):
            table[d, filled[d]] = j
            filled[d] += 1
        pooled = jax.tree.map(
            lambda *xs: jnp.concatenate([*xs, jnp.zeros_like(xs[0][:1])]), *rest
        )
        parts.append(jax.tree.map(lambda x: x[table], pooled))
        valid.append(table < count)
    problems = jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=1), *parts)
    out = _shards_map(fn, mesh, np.concatenate(valid, axis=1))(problems)
    # Back to each stack's own order.
    widths = [k // devices for k, ok in zip(counts, even) if ok]
    starts = np.cumsum([0, *widths])
    evens = iter(
        jax.tree.map(lambda y, a=a, b=b: y[:, a:b].reshape(-1, *y.shape[2:]), out)
        for a, b in itertools.pairwise(starts)
    )
    others: Any = iter(())
    if rest:
        local = np.zeros(len(owners), int)
        filled = [0] * devices
        for j, d in enumerate(owners):
            local[j] = filled[d]
            filled[d] += 1
        done = jax.tree.map(
            lambda y: y[:, starts[-1] :][np.asarray(owners), local], out
        )
        ends = np.cumsum([0, *(_count(stack) for stack in rest)])
        others = iter(
            jax.tree.map(lambda y, a=a, b=b: y[a:b], done)
            for a, b in itertools.pairwise(ends)
        )
    results = [next(evens) if ok else next(others) for ok in even]
    return results, turn


def _shards_map(fn: Callable, mesh: Any, valid: np.ndarray) -> Callable:
    """`fn` over each device's slots of `(devices, slots, ...)` arrays, inside
    `shard_map`, one problem at a time (a batched LAPACK call on every host
    device at once waits on one thread pool and can deadlock it), the empty
    slots (`valid` false) skipped."""
    every = bool(valid.all())

    def local(problems: Any, valid: Any) -> Any:
        # This device's row of the `(devices, slots, ...)` arrays.
        problems, valid = jax.tree.map(lambda x: x[0], (problems, valid))

        def one(args: Any) -> Any:
            problem, ok = args
            if every:
                return fn(problem)
            shapes = jax.eval_shape(fn, problem)

            def skip(problem: Any) -> Any:
                return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

            return _shards.cond(ok, fn, skip, problem)

        return jax.tree.map(lambda y: y[None], jax.lax.map(one, (problems, valid)))

    spec = PartitionSpec(tuple(mesh.axis_names))  # over every device
    mapped = _jax_api.shard_map(local, mesh=mesh, in_specs=(spec, spec), out_specs=spec)
    return lambda problems: mapped(problems, valid)
