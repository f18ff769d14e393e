"""Where a step's leaves live, and the kernels of sharded leaves run per shard.

A custom call is lowered as one only in a program that runs as it is on each device
(`_compat.lowering_per_device`), so a step whose leaves all live on one device (any
device of several) takes the kernels as they are. Leaves sharded over a mesh of
several CPU devices (`NamedSharding`, split or replicated) take their kernel inside
a `shard_map` over the whole mesh, each leaf with its own partition spec in and
out: every device runs the loop over its own shard, in place; nothing is gathered,
and the outputs keep the leaves' shardings.

The spec of a leaf is in its type where the mesh's axes are Explicit
(`jax.typeof(x).sharding`). On Auto axes (the default of `Mesh(...)`) a trace does
not know it, so the entry points read it from the concrete arrays before tracing
(`_core._placement.read`, made into a `placement` here) and pass it into the trace
as static data (a `Placement`, a pytree without leaves), which then keys the
compiled step: arrays placed otherwise trace again. A leaf whose spec is unknown,
whose moments (or gradient) are placed unlike it, or that lives inside a user's own
`shard_map` (manual axes) keeps XLA's code.
"""

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from .._core import _jax_api
from .._core._jax_api import several_devices, shard_map
from . import _ffi


def _normal(spec: Any, ndim: int) -> PartitionSpec:
    """`spec` with one entry per dimension (`P('a')` of a matrix is `P('a', None)`),
    a one-axis tuple as the axis: specs that shard alike compare equal."""
    entries = []
    for entry in (*spec, *([None] * (ndim - len(spec)))):
        if isinstance(entry, tuple):
            entry = None if not entry else entry[0] if len(entry) == 1 else entry
        entries.append(entry)
    return PartitionSpec(*entries)


@dataclasses.dataclass(frozen=True)
class Placement:
    """The mesh of an entry's sharded inputs and, per input leaf (in
    `jax.tree.leaves` order), its partition spec there (`None`: not sharded over
    it). Static data of the compiled step: a pytree without leaves."""

    mesh: Any
    specs: tuple[PartitionSpec | None, ...]


jax.tree_util.register_pytree_node(
    Placement,
    lambda p: ((), (p.mesh, p.specs)),
    lambda aux, _: Placement(*aux),
)


def placement(leaves: Sequence[Any], shardings: Sequence[Any]) -> Placement | None:
    """Where `leaves` (an entry's input leaves, in order) are sharded, from
    `shardings` (per leaf, its concrete sharding as the entry read it; `None`:
    unknown, such as a tracer's): `None` in a process of one device, where the
    native kernels are off, where no leaf is sharded over a mesh of several CPU
    devices, or where leaves are sharded over different meshes (XLA's code then)."""
    if not several_devices() or not _ffi.usable():
        return None
    mesh = None
    specs: list[PartitionSpec | None] = []
    for x, sharding in zip(leaves, shardings, strict=True):
        spec = None
        if isinstance(sharding, NamedSharding) and sharding.mesh.size > 1:
            if mesh is None:
                mesh = sharding.mesh
            elif sharding.mesh != mesh:
                return None
            spec = _normal(sharding.spec, x.ndim)
        specs.append(spec)
    if mesh is None or not _cpu_mesh(mesh):
        return None
    return Placement(mesh, tuple(specs))


def typed_placement(leaves: Sequence[Any], mesh: Any) -> Placement | None:
    """Where `leaves` (an entry's traced inputs, inside a user's own `jit`, where
    no concrete sharding was read) are sharded over `mesh`, a mesh of Explicit
    axes, from their types: as `placement`, on `mesh` with those axes made Auto
    (the entry runs the optimizer's maths so, `_core._placement.on_auto_axes`)."""
    if not several_devices() or not _ffi.usable():
        return None
    specs: list[PartitionSpec | None] = []
    for x in leaves:
        typed = _jax_api.mesh_and_spec(x) if isinstance(x, jax.Array) else None
        on_mesh = typed is not None and typed[0] == mesh
        specs.append(_normal(typed[1], x.ndim) if on_mesh else None)  # pyright: ignore
    return Placement(_jax_api.auto_version(mesh), tuple(specs))


@functools.lru_cache(maxsize=64)
def _cpu_mesh(mesh: Any) -> bool:
    devices = NamedSharding(mesh, PartitionSpec()).device_set
    return {d.platform for d in devices} == {"cpu"}


class Sharded(tuple):
    """`(mesh, spec)`: run a leaf's kernel per shard over `mesh`."""

    @property
    def mesh(self) -> Any:
        return self[0]

    @property
    def spec(self) -> PartitionSpec:
        return self[1]


# A leaf whose kernel runs as it is: the program holds it on one device (or XLA's
# code replaces it at lowering, `_compat.lowering_per_device`).
LOCAL = "local"


def _axis_types(mesh: Any) -> set[str]:
    return {str(t).rsplit(".", 1)[-1] for t in getattr(mesh, "axis_types", ())}


@dataclasses.dataclass(eq=False)
class Locator:
    """Where the leaves of one trace live: from the entry's `Placement` (matched to
    its input tracers by identity), else from the leaves' types."""

    mesh: Any = None
    specs: dict[int, PartitionSpec | None] = dataclasses.field(default_factory=dict)
    # The entry's input tracers, kept alive so that their ids stay theirs.
    inputs: Any = None

    @classmethod
    def of(cls, where: Any, inputs: Any) -> "Locator":
        if not isinstance(where, Placement):
            return cls()
        leaves = jax.tree.leaves(inputs)
        if len(leaves) != len(where.specs):
            return cls()
        return cls(where.mesh, {id(x): s for x, s in zip(leaves, where.specs)}, leaves)

    def spec(self, x: Any) -> PartitionSpec | None:
        if id(x) in self.specs:
            return self.specs[id(x)]
        sharding = jax.typeof(x).sharding
        mesh = getattr(sharding, "mesh", None)
        if mesh is not None and not mesh.empty and _axis_types(mesh) == {"Explicit"}:
            return _normal(sharding.spec, x.ndim)
        return None

    def where(self, g: Any, p: Any, moments: Sequence[Any]) -> Any:
        """`LOCAL`, `Sharded(mesh, spec)` or `None` (XLA's code) for one leaf."""
        mesh = getattr(jax.typeof(p).sharding, "mesh", None)
        if mesh is None or mesh.empty or mesh.size == 1:
            return LOCAL
        if _axis_types(mesh) - {"Auto", "Explicit"}:
            return None  # inside a user's shard_map (manual axes)
        spec = self.spec(p)
        if spec is None or any(self.spec(m) != spec for m in moments):
            return None
        grad_spec = self.spec(g)  # a gradient made in the trace is placed by XLA
        if grad_spec is not None and grad_spec != spec:
            return None
        concrete = self.mesh if self.mesh is not None else mesh
        if concrete.shape_tuple != mesh.shape_tuple:
            return None
        if getattr(concrete, "abstract_mesh", concrete) != mesh:
            # The entry runs on a mesh of Explicit axes made Auto
            # (`_core._placement.on_auto_axes`): the `shard_map` is over that.
            concrete = mesh
        return Sharded((concrete, spec))

    def known(self, x: Any, mesh: Any) -> PartitionSpec | None:
        """`x`'s spec if it is sharded over `mesh`'s axes, else `None`."""
        spec = self.spec(x)
        found = getattr(jax.typeof(x).sharding, "mesh", None)
        if spec is None or found is None or found.shape_tuple != mesh.shape_tuple:
            return None
        return spec


def per_shard(
    fn: Callable[..., Any], mesh: Any, in_specs: Any, out_specs: Any
) -> Callable[..., Any]:
    """`fn` run on each device's shards over every axis of `mesh` (a `shard_map`;
    its result types are not checked, as the custom call's carry no varying axes)."""
    return shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check=False)
