"""Where state and outputs live: state that no parameter shapes, the outputs of
`update`/`step`, and errors that name a misplaced leaf.

State shaped like a parameter is made like it (`full_like_leaf`), so it is sharded
like it. The rest (step counters, 0-d statistics, buffers of other shapes) used to be
made on the default device, uncommitted: a step moved it, but a checkpoint restored
into the shardings of `opt.init(params)` put it there committed, and the next step
then failed on arrays on different devices. So every optimizer's `init` ends in
`place_state`: such leaves go replicated on the parameters' mesh
(`NamedSharding(mesh, P())`), or onto the one device all parameters are on.

Outputs are placed like the inputs they replace: each new parameter (and each
update) with its parameter's sharding, each new state leaf with its old leaf's
sharding.

Without this, XLA's sharding propagation is free to choose the outputs' shardings:
with the parameters replicated and the state split over a mesh axis (ZeRO-1), the new
parameters came back split like the state, and donated buffers could not be reused
(their outputs were placed differently). Two cases:

- Meshes with Explicit axes carry the sharding in each array's type, so the traced
  entry reads it from its inputs and reshards each output to it (also inside a
  user's own `jit`). The optimizer's maths in between runs with those axes made
  Auto (`on_auto_axes`): the compiler places every intermediate, as on an Auto
  mesh, so no optimizer has to say how a product, reshape, select or `cond` over
  operands split unlike each other (a ZeRO-1 state and replicated gradients,
  FSDP factors and their statistics) is split.
- On Auto meshes the traced values know nothing of their placement, so `update` and
  `step` read the concrete inputs' shardings before the call (`read`, only in a
  process with several devices; the same reading serves the native backend's
  per-shard kernels) and the entry constrains each output to its input's sharding
  where that spans several devices (`signature`, part of the compiled function's
  cache key).
"""

import dataclasses
import functools
import threading
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from . import _jax_api
from ._jax_api import array_type, is_tracer, several_devices
from ._packed import refuse_leaf_reductions
from ._tree import leaf_paths


def _committed(tree: Any) -> list[tuple[str, Any]]:
    """`(path, leaf)` of every concrete array of `tree` committed to its devices
    (an uncommitted one goes wherever a step needs it); for error messages."""
    return [
        (path, x)
        for path, x in zip(leaf_paths(tree), jax.tree.leaves(tree))
        if type(x) is array_type() and x.committed
    ]


def params_placement(params: Any) -> Any:
    """The sharding for state that no parameter shapes: replicated over the mesh of
    the committed parameters, or their one device; `None` where none is committed
    or they are not all on the same devices (then nothing is moved)."""
    shardings = [
        x.sharding
        for x in jax.tree.leaves(params)
        if type(x) is array_type() and x.committed
    ]
    if not shardings:
        return None
    devices = shardings[0].device_set
    if any(s.device_set != devices for s in shardings):
        return None
    meshes = {s.mesh for s in shardings if isinstance(s, NamedSharding)}
    if len(meshes) == 1:
        return NamedSharding(meshes.pop(), PartitionSpec())
    if len(devices) == 1 and not meshes:
        return SingleDeviceSharding(next(iter(devices)))
    return None


def place_state(state: Any, params: Any) -> Any:
    """`state` with every uncommitted concrete array placed by `params_placement`
    (leaves already placed, such as moments made like their parameter, stay)."""
    target = params_placement(params)
    if target is None:
        return state
    leaves, treedef = jax.tree.flatten(state)
    where = [
        i for i, x in enumerate(leaves) if type(x) is array_type() and not x.committed
    ]
    if where:
        placed = jax.device_put([leaves[i] for i in where], target)
        for i, x in zip(where, placed):
            leaves[i] = x
    return jax.tree.unflatten(treedef, leaves)


_inside = threading.local()


def placing_init(init: Any) -> Callable:
    """`init` (a method as found in a class's `__dict__`) followed by `place_state`
    on the outermost call only: a wrapper's `init` calls those of the transforms it
    holds, and the whole state is placed once, against the whole parameter tree.
    The outermost call first refuses a packed model that some transform of the
    optimizer would not give the tree's numbers on (`_packed`)."""

    @functools.wraps(getattr(init, "method", init))
    def wrapped(self: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        bound = init.__get__(self, type(self))
        if getattr(_inside, "flag", False):
            return bound(params, *args, **kwargs)
        # A packed model is refused before any state is made, naming the
        # transform whose maths reduces over a leaf.
        refuse_leaf_reductions(self, params)
        _inside.flag = True
        try:
            state = bound(params, *args, **kwargs)
        finally:
            _inside.flag = False
        return place_state(state, params)

    return wrapped


def _describe(x: Any) -> str:
    ids = sorted(d.id for d in x.sharding.device_set)
    return f"device{'s' if len(ids) > 1 else ''} {ids}"


def raise_if_misplaced(
    error: ValueError, opt: Any, grads: Any, state: Any, params: Any
) -> None:
    """Raises a `ValueError` naming the leaf that sits on other devices than the
    parameters (a state leaf first), from `error` (JAX's, which names an argument of
    eqxopt's compiled function); returns if every committed leaf agrees (then
    `error` is about something else). The inputs are read, not the error's
    wording."""
    named = {
        "state": _committed(state),
        "grads": _committed(grads),
        "params": _committed(params),
        "the optimizer": _committed(opt),
    }
    reference = named["params"] or named["grads"] or named["state"]
    if not reference:
        return
    ref_path, ref = reference[0]
    ref_name = "params" if named["params"] else "grads" if named["grads"] else "state"
    devices = ref.sharding.device_set
    for name, leaves in named.items():
        for path, x in leaves:
            if x.sharding.device_set == devices:
                continue
            where = f"{name}{path}" if name != "the optimizer" else f"{name}'s {path}"
            fix = (
                "the shardings of `opt.init(params)` (restore a checkpoint into "
                "them), or replicated on the parameters' mesh: "
                "`jax.device_put(x, NamedSharding(mesh, PartitionSpec()))`"
                if isinstance(ref.sharding, NamedSharding)
                else "the parameters' device: `jax.device_put(x, device)`"
            )
            raise ValueError(
                f"{where} ({x.dtype}{list(x.shape)}) is on {_describe(x)} but "
                f"{ref_name}{ref_path} is on {_describe(ref)} ({ref.sharding}); a "
                "step needs every committed array on the same devices. Put it "
                f"where the parameters are: {fix}"
            ) from error


@dataclasses.dataclass(frozen=True, slots=True)
class Inputs:
    """The concrete inputs of one `update`/`step` call and where they live, read
    once before the call for both readers: `signature` (to place the outputs) and,
    for a donated call, the native backend's `placement` (kernels per shard).

    - `leaves`: the leaves (`jax.tree.leaves`) of the grads (a donated call's
      only), the params and the state, in that order.
    - `shardings`: per leaf, its concrete sharding (`None`: a tracer, or not a JAX
      array).
    - `params`, `state`: where the params' and the state's leaves are.
    - `donated`: whether the call is donated (then the grads' leaves are read).
    """

    leaves: list[Any]
    shardings: list[Any]
    params: slice
    state: slice
    donated: bool


def _sharding(x: Any) -> Any:
    # A tracer (inside a user's trace) has no concrete sharding to read.
    if isinstance(x, jax.Array) and not is_tracer(x):
        return x.sharding
    return None


def read(grads: Any, params: Any, state: Any, *, donated: bool) -> Inputs | None:
    """Where the leaves of a call's inputs live (`Inputs`); `None` in a process of
    one device, where nothing is read: nothing needs placing."""
    if not several_devices():
        return None
    on_grads = jax.tree.leaves(grads) if donated else []
    leaves = [*on_grads, *jax.tree.leaves(params)]
    split = len(leaves)
    leaves += jax.tree.leaves(state)
    return Inputs(
        leaves,
        list(map(_sharding, leaves)),
        slice(len(on_grads), split),
        slice(split, None),
        donated,
    )


_SINGLE = jax.sharding.SingleDeviceSharding


def _spread(sharding: Any) -> Any:
    # Only arrays placed across several devices need their placement restated.
    if sharding is None or type(sharding) is _SINGLE:
        return None
    return sharding if len(sharding.device_set) > 1 else None


def signature(inputs: Inputs | None) -> tuple[tuple[Any, ...], ...] | None:
    """For the params and the state of `inputs` (from `read`), per leaf, its
    sharding where it spans several devices, else `None`; `None` when no leaf
    does, or nothing was read."""
    if inputs is None:
        return None
    out = tuple(
        tuple(map(_spread, inputs.shardings[part]))
        for part in (inputs.params, inputs.state)
    )
    if not any(s is not None for group in out for s in group):
        return None
    return out


def explicit_mesh(tree: Any) -> Any:
    """The (abstract) mesh of Explicit axes that the array leaves of `tree` are
    typed on (the first found), or `None`."""
    for x in jax.tree.leaves(tree):
        if not isinstance(x, jax.Array):
            continue
        typed = _jax_api.mesh_and_spec(x)
        if typed is not None and "explicit" in _jax_api.axis_kinds(typed[0]).values():
            return typed[0]
    return None


def on_auto_axes(fn: Callable, mesh: Any, *trees: Any) -> Any:
    """`fn(*trees)` with the Explicit axes of `mesh` made Auto while it runs: each
    array leaf typed on `mesh` keeps its placement but drops it from its type, so
    the maths inside is that of an Auto mesh (the compiler places every
    intermediate, and none has to say how a product, reshape, select or `cond`
    over split operands is split). The outputs come back typed on the Auto axes:
    `keep` gives each its input's type."""
    auto = _jax_api.auto_version(mesh)

    def untyped(x: Any) -> Any:
        if not isinstance(x, jax.Array):
            return x
        typed = _jax_api.mesh_and_spec(x)
        if typed is None or typed[0] != mesh:
            return x
        return _jax_api.reshard(x, PartitionSpec())

    with _jax_api.use_abstract_mesh(auto):
        return fn(*(jax.tree.map(untyped, tree) for tree in trees))


def _is_none(x: Any) -> bool:
    return x is None


def keep(outs: Any, ins: Any, shardings: tuple[Any, ...] | None) -> Any:
    """Inside the trace: `outs` (a tree shaped like `ins`, `None` where no output)
    with each array leaf placed like the leaf of `ins` at its place: resharded to
    its type's sharding on an Explicit mesh, else constrained to `shardings` (the
    concrete inputs' shardings, leaf by leaf, from `signature`)."""
    in_leaves, in_def = jax.tree.flatten(ins, is_leaf=_is_none)
    out_leaves, out_def = jax.tree.flatten(outs, is_leaf=_is_none)
    if in_def != out_def:
        return outs
    present = [x for x in in_leaves if x is not None]
    if shardings is None or len(shardings) != len(present):
        shardings = (None,) * len(present)
    by_leaf = iter(shardings)
    placed = []
    for x, y in zip(in_leaves, out_leaves):
        sharding = None if x is None else next(by_leaf)
        if not isinstance(x, jax.Array) or not isinstance(y, jax.Array):
            placed.append(y)
            continue
        if x.shape != y.shape:
            placed.append(y)
            continue
        typed = _jax_api.mesh_and_spec(x)
        if typed is not None and "explicit" in _jax_api.axis_kinds(typed[0]).values():
            y = _jax_api.reshard(y, NamedSharding(*typed))
        elif sharding is not None:
            y = jax.lax.with_sharding_constraint(y, sharding)
        placed.append(y)
    return jax.tree.unflatten(out_def, placed)
