"""ZeRO stage 1: the optimizer state split over a mesh axis, the parameters not.

The placement rule lives here once, for every optimizer: it reads only the shapes
(and current shardings) of the state's leaves, never which optimizer made them. The
entries (`update`/`step`) then keep every output where its input was (see
`eqxopt._core._placement`), so the state stays split and the parameters stay put.
"""

from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import PyTree

__all__ = ["shard_state", "state_shardings"]


def _axes(mesh: Any, axis: Any) -> tuple[tuple[str, ...], int]:
    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}: {mesh!r}"
        )
    names = (axis,) if isinstance(axis, str) else axis
    if (
        not isinstance(names, tuple)
        or not names
        or not all(isinstance(n, str) for n in names)
    ):
        raise TypeError(
            f"axis must be a mesh axis name or a non-empty tuple of names, got {axis!r}"
        )
    for name in names:
        if name not in mesh.axis_names:
            raise ValueError(
                f"axis {name!r} is not an axis of the mesh (its axes: "
                f"{tuple(mesh.axis_names)})"
            )
    if len(set(names)) != len(names):
        raise ValueError(f"axis names a mesh axis twice: {axis!r}")
    size = 1
    for name in names:
        size *= mesh.shape[name]
    return names, size


def _used(entry: Any) -> set[str]:
    if entry is None:
        return set()
    return {entry} if isinstance(entry, str) else set(entry)


def _on(sharding: Any, mesh: Mesh) -> bool:
    """Whether `sharding` is a `NamedSharding` on `mesh`: a concrete array's, or
    an abstract one's (`jax.eval_shape` on Explicit axes gives the mesh's
    `abstract_mesh`)."""
    if not isinstance(sharding, NamedSharding):
        return False
    if sharding.mesh == mesh:
        return True
    abstract = getattr(mesh, "abstract_mesh", None)
    return abstract is not None and sharding.mesh == abstract


def _refuse_unplaced(state: Any, mesh: Mesh) -> None:
    """A `ValueError` for an abstract state (`jax.ShapeDtypeStruct` leaves) none of
    whose leaves records a sharding on `mesh`: where a leaf follows FSDP-sharded
    parameters is then unknown. (Where some do, as `jax.eval_shape` gives on
    Explicit axes, the others are the leaves made from no parameter, which `init`
    replicates.)"""
    abstract = [
        (path, x)
        for path, x in jax.tree.leaves_with_path(state)
        if isinstance(x, jax.ShapeDtypeStruct)
    ]
    if any(_on(x.sharding, mesh) for _, x in abstract):
        return
    for path, x in abstract:
        if len(x.shape):
            raise ValueError(
                f"state{jax.tree_util.keystr(path)} is a jax.ShapeDtypeStruct with "
                "no sharding on the mesh, and so is every leaf of the state: where "
                "the state follows sharded parameters (FSDP) is unknown. "
                "jax.eval_shape records shardings only on a mesh of Explicit axes "
                "(jax.make_mesh's default); on Auto axes pass the state itself "
                "(opt.init(params)), or ShapeDtypeStructs with their sharding"
            )


def _leaf_sharding(
    leaf: Any, mesh: Mesh, names: tuple[str, ...], size: int
) -> NamedSharding | None:
    shape = getattr(leaf, "shape", None)
    if shape is None or not hasattr(leaf, "dtype"):
        return None  # not an array (None, a function, a Python number)
    current = getattr(leaf, "sharding", None)
    if _on(current, mesh):
        assert isinstance(current, NamedSharding)
        spec: list[Any] = list(current.spec)
        spec += [None] * (len(shape) - len(spec))
    else:  # on one device, or on another mesh: replicated on this one
        spec = [None] * len(shape)
    taken = set().union(*map(_used, spec)) if spec else set()
    if not taken & set(names):
        for dim, n in enumerate(shape):
            if spec[dim] is None and n > 0 and n % size == 0:
                spec[dim] = names[0] if len(names) == 1 else names
                break
    return NamedSharding(mesh, PartitionSpec(*spec))


def state_shardings(
    state: PyTree[Any], mesh: Mesh, axis: str | tuple[str, ...] = "data"
) -> PyTree[NamedSharding | None]:
    """The ZeRO-1 placement of an optimizer state on `mesh`: one `NamedSharding` per
    array leaf, splitting it over `axis`.

    Each array leaf keeps the partitioning it has on `mesh` (a state that follows
    FSDP-sharded parameters stays so) and is split over `axis` along its first
    dimension that is not partitioned yet and whose size divides by the size of
    `axis`. A leaf with no such dimension, a leaf already split over `axis`, and
    every 0-d leaf (the step counter) are replicated on `mesh` in the others. No
    leaf is gathered or moved: this only computes shardings, so `state` may be
    abstract, and a state can be created sharded without ever existing whole on
    one device. An abstract state must record where its leaves are:
    `jax.eval_shape(opt.init, params)` does on a mesh of Explicit axes
    (`jax.make_mesh`'s default), where each leaf's type carries its sharding:

    ```python
    abstract = jax.eval_shape(opt.init, params)
    shardings = eqxopt.state_shardings(abstract, mesh, "data")
    state = jax.jit(lambda p: opt.init(p), out_shardings=shardings)(params)
    ```

    On a mesh of Auto axes (`Mesh(devices, names)`) `jax.eval_shape` records no
    sharding, so nothing tells a state that follows FSDP-sharded parameters from
    a replicated one: pass the state itself there (`opt.init(params)`), or
    `jax.ShapeDtypeStruct`s with their `sharding`. An abstract state none of whose
    leaves records a sharding on `mesh` is refused.

    The rule looks only at shapes, so it is the same for every optimizer, wrapper
    and chain, and for quantized states (their codes and scales are split alike).

    **Arguments:**

    - `state`: an optimizer state from `init`, or its `jax.ShapeDtypeStruct`s
      with their shardings (see above).
    - `mesh`: the `jax.sharding.Mesh` to place the state on.
    - `axis`: the mesh axis to split over (the data-parallel one), or a tuple of
      axes, split over together.

    **Returns:** a tree with the structure of `state`: a `NamedSharding` for each
    array leaf, `None` for any other leaf.

    **Raises:** `TypeError` when `mesh` is not a `Mesh` or `axis` is not a name or
    tuple of names; `ValueError` when an axis is not one of `mesh`'s, or when
    `state` is abstract and no leaf of it records a sharding on `mesh`.
    """
    names, size = _axes(mesh, axis)
    _refuse_unplaced(state, mesh)
    leaves, treedef = jax.tree.flatten(state)
    return jax.tree.unflatten(
        treedef, [_leaf_sharding(x, mesh, names, size) for x in leaves]
    )


def shard_state(
    state: PyTree[Any], mesh: Mesh, axis: str | tuple[str, ...] = "data"
) -> PyTree[Any]:
    """`state` placed on `mesh` as `state_shardings` says (ZeRO stage 1): every
    array leaf split over `axis` along a dimension that divides, the rest
    replicated; other leaves unchanged.

    Each leaf stays in the memory it is in (host memory for `OffloadState`'s).
    Pass the result to `update`/`step` as any state: they return each state leaf
    with its own sharding and each parameter (or update) with its parameter's
    sharding, with or without `donate=True`; the numbers are those of the
    unsharded step. Each device then holds about 1/N of the state (N the size of
    `axis`), and each step adds one all-gather of the new parameters (each device
    computes its slice of every update).

    To avoid building the state replicated first, create it sharded:
    `jax.jit(lambda p: opt.init(p), out_shardings=eqxopt.state_shardings(...))` (see
    `state_shardings`).

    **Arguments:**

    - `state`: an optimizer state, from `init` or a previous step.
    - `mesh`: the `jax.sharding.Mesh` to place the state on.
    - `axis`: the mesh axis to split over, or a tuple of axes.

    **Returns:** the state, placed (a copy; `state` itself is unchanged).

    **Raises:** as `state_shardings`.

    **Example:**

    ```python
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    import eqxopt

    mesh = jax.make_mesh((jax.device_count(),), ("data",))  # every device
    params = {"w": jnp.ones((8 * jax.device_count(), 4))}
    params = jax.device_put(params, NamedSharding(mesh, P()))  # replicated
    opt = eqxopt.Adam(1e-3)
    state = eqxopt.shard_state(opt.init(params), mesh, "data")  # the moments split
    grads = jax.tree.map(jnp.ones_like, params)
    params, state = opt.step(grads, state, params)
    # the parameters stay replicated
    assert params["w"].sharding.is_fully_replicated
    ```
    """
    names, size = _axes(mesh, axis)
    leaves, treedef = jax.tree.flatten(state)
    placed = []
    for x in leaves:
        sharding = _leaf_sharding(x, mesh, names, size)
        if sharding is not None and isinstance(x, jax.Array):
            # In the memory it is in (host memory under `OffloadState`).
            kind = getattr(x.sharding, "memory_kind", None)
            if kind is not None:
                sharding = sharding.with_memory_kind(kind)
            x = jax.device_put(x, sharding)
        placed.append(x)
    return jax.tree.unflatten(treedef, placed)
