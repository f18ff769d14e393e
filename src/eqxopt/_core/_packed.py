"""`Packed`: a parameter tree kept as a few flat buffers (an explicit layout option).

Every array that crosses a `jax.jit` boundary costs JAX a few microseconds, and XLA
runs at least one kernel per leaf: a step over 2000 leaves of 1000 floats spends
most of its time on that, not on arithmetic (an identity function over such a tree
already takes about 8 ms a call here). Packed, the same parameters are one buffer
per dtype (and per label), so the optimizer sees a handful of large leaves.

The model gets its tree back with `packed.unpack()` inside the loss function;
`jax.grad` through it gives the gradients packed the same way. The derivative of
cutting a buffer into leaves is XLA's split, whose transpose is one concatenation (so
a step's cost grows with the parameters, not with the square of the leaf count, as
it would with the transposes of separate slices: each pads a zero buffer of the full
size); a backend may do either copy itself (the native CPU kernels do, one copy
each).

XLA:CPU compiles one kernel per distinct fusion and reuses identical ones. A slice
at a constant offset is a fusion of its own for every leaf, so a model of N layers
would compile N kernels more packed than as a tree (whose per-leaf fusions are all
alike). On the CPU the leaves are therefore dynamic slices at offsets that XLA
cannot compute at compile time (`_opaque_offsets`): one kernel serves every leaf of
a size.
"""

import dataclasses
import functools
from collections.abc import Callable, Hashable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PyTree

from . import _backend
from ._compile import static_key
from ._jax_api import dynamic_slice_in_range, mesh_and_spec, split
from ._storage import is_quantized
from ._structure import is_none, structure_mismatch

# One leaf of the original tree: ("array", buffer index, shape, dtype) or
# ("static", key) for anything that is not an array (kept as it is in the key, which
# compares by type and value, or by identity when it is unhashable).
_Slot = tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Where each leaf lives: hashable, so a `Packed` of the same layout reuses
    compiled code."""

    treedef: Any
    slots: tuple[_Slot, ...]
    keys: tuple

    def members(self, index: int) -> list[tuple[int, ...]]:
        return [s[2] for s in self.slots if s[0] == "array" and s[1] == index]


class Packed(eqx.Module):
    """Parameters (or gradients, or a moment) stored as one flat buffer per dtype and
    label: make it with `eqxopt.pack(tree)`, read it with `.unpack()`.

    Any optimizer takes a `Packed` as its parameters; its state then holds `Packed`
    moments with the same layout (`state.mu.unpack()` is params-shaped). Element-wise
    optimizers (SGD, the Adam family, Lion, ...) give the same numbers as on the
    tree, and those that also reduce over the whole tree (global-norm clipping,
    SAM, L-BFGS, ...) the same to rounding. Optimizers that reduce over each leaf
    (LAMB, LARS, Adafactor, Muon, SOAP, `Cautious`, `ClipByBlockRMS`, ...) would
    see one leaf per buffer instead of one per parameter: their `init` refuses a
    packed model, naming them; use the tree for those.

    **Fields:**

    - `buffers`: the flat buffers (1-D arrays), in the order of `labels()`.
    - `layout`: static: the tree structure and where each leaf lives.
    """

    buffers: tuple[Any, ...]
    layout: _Layout = eqx.field(static=True)

    def unpack(self) -> PyTree:
        """The tree this was packed from (leaves in their shapes and dtypes). Inside
        `jax.grad`, the gradient with respect to the `Packed` comes back packed.
        Every mode of differentiation goes through it (`jax.grad`, `jax.vjp`,
        `jax.jvp`, hessians, under `jax.vmap` too), but not `jax.linear_transpose`
        on XLA's code, whose cut reads the data (`jax.vjp` gives the transpose).

        For a moment of the state (`state.mu`), each leaf's values: `None` at the
        leaves that have no state (int and bool arrays, as `opt.init` of the tree
        gives), and a block-wise quantized buffer (`Blockwise8bit()`, ...) read
        back in float32."""
        pieces = [self._leaves_of(k, b) for k, b in enumerate(self.buffers)]
        iterators = [iter(p) for p in pieces]
        leaves = [
            next(iterators[slot[1]]) if slot[0] == "array" else slot[1].obj
            for slot in self.layout.slots
        ]
        return jax.tree.unflatten(self.layout.treedef, leaves)

    def _leaves_of(self, index: int, buffer: Any) -> list[Any]:
        # A moment's buffers are stored as the optimizer keeps that moment; what is
        # no array (None, the labels of `labels()`) stands for each of its leaves.
        shapes = self.layout.members(index)
        if is_quantized(buffer):
            buffer = buffer.dequantize()
        if not _is_array(buffer):
            return [buffer] * len(shapes)
        return _split(buffer, shapes)

    def labels(self) -> "Packed":
        """A `Packed` with the same structure whose buffers are replaced by their
        labels (see `pack`): with bool labels, a weight-decay mask for
        `AdamW(mask=...)` and the like."""
        return Packed(tuple(key[0] for key in self.layout.keys), self.layout)


def _split(flat: Any, shapes: list[tuple[int, ...]]) -> list[Any]:
    """`flat` cut into consecutive pieces of `shapes`: the backend's copy where it
    has one, else XLA's code (`_cut`), whose gradient is one concatenation however
    many pieces there are."""
    if not shapes:
        return []
    shapes_key = tuple(tuple(s) for s in shapes)
    backend = _backend.active()
    pieces = None if backend is None else backend.split(flat, shapes_key)
    return _cut(flat, shapes_key) if pieces is None else pieces


Shapes = tuple[tuple[int, ...], ...]


def _cut(flat: Any, shapes: Shapes) -> list[Any]:
    """`flat` cut into consecutive pieces of `shapes` by XLA's code: pieces that
    share their kernels (`_cut_sharing_kernels`) where they can be differentiated
    and their offsets fit in int32, XLA's split otherwise."""
    total = sum(_sizes(shapes))
    if (
        len(shapes) > 1
        and 0 < total <= np.iinfo(np.int32).max
        and jnp.issubdtype(flat.dtype, jnp.inexact)
        and not _sharded(flat)
    ):
        return _cut_sharing_kernels(flat, shapes)
    return _split_by_xla(flat, shapes)


def _sizes(shapes: Shapes) -> tuple[int, ...]:
    return tuple(int(np.prod(s, dtype=np.int64)) for s in shapes)


def _split_by_xla(flat: Any, shapes: Shapes) -> list[Any]:
    return [x.reshape(s) for x, s in zip(split(flat, _sizes(shapes)), shapes)]


def _sharded(x: Any) -> bool:
    # Explicitly sharded buffers keep XLA's split, whose static offsets the
    # partitioner can place; a dynamic slice would need the whole buffer.
    placed = mesh_and_spec(x)
    return placed is not None and any(axis is not None for axis in placed[1] or ())


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _cut_sharing_kernels(flat: Any, shapes: Shapes) -> list[Any]:
    """`flat` cut into pieces of `shapes` by dynamic slices, at offsets that XLA
    cannot fold into constants on the CPU (`_opaque_offsets`), so that the slices
    of one size share one kernel there; at constant offsets elsewhere, which XLA
    makes the slices of its split. Its derivative is XLA's split of the tangent in
    every mode, whose transpose is one concatenation. The reshapes are inside, so
    that differentiating the cut is one rule, not one per leaf."""
    sizes = _sizes(shapes)
    starts = tuple(np.cumsum((0, *sizes[:-1]), dtype=np.int64).astype(np.int32))
    offsets = jax.lax.platform_dependent(
        flat, starts, cpu=_opaque_offsets, default=lambda flat, starts: starts
    )
    return [
        dynamic_slice_in_range(flat, offset, size).reshape(shape)
        for offset, size, shape in zip(offsets, sizes, shapes)
    ]


@_cut_sharing_kernels.defjvp
def _cut_sharing_kernels_jvp(
    shapes: Shapes, primals: tuple, tangents: tuple
) -> tuple[list[Any], list[Any]]:
    (flat,), (tangent,) = primals, tangents
    return _cut_sharing_kernels(flat, shapes), _split_by_xla(tangent, shapes)


def _opaque_offsets(flat: Any, starts: tuple) -> tuple:
    """`starts` as values that XLA cannot compute at compile time. XLA:CPU compiles
    one kernel per distinct fusion and reuses identical ones; a constant offset is
    part of the slice's fusion, which makes every leaf's fusion distinct. The
    offsets come out of a loop that never runs but whose condition reads the data:
    XLA removes a loop whose trip count it can compute, and an optimization barrier
    is gone before fusion on XLA:CPU."""
    # 0 or 1, from the data: the loop runs while it exceeds 1, never, which XLA
    # cannot know. The body changes every offset, and not by a common step
    # (offsets advanced alike would become one offset plus constants).
    is_nan = (flat[0] != flat[0]).astype(jnp.int32)

    def never(carry: tuple) -> Any:
        return carry[0] > 1

    def scramble(carry: tuple) -> tuple:
        return tuple(map(jax.lax.bitwise_not, carry))

    return tuple(jax.lax.while_loop(never, scramble, (is_nan, *starts))[1:])


def _concat(parts: list[Any]) -> Any:
    """The 1-D concatenation of `parts`: the backend's copy where it has one."""
    backend = _backend.active()
    out = None if backend is None else backend.concat(parts)
    return jnp.concatenate(parts) if out is None else out


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


def _labels_of_prefix(label_tree: PyTree, tree: PyTree) -> list[Any]:
    # As a mask: a label covers the whole subtree below it.
    prefix, label_def = jax.tree.flatten(label_tree, is_leaf=is_none)
    try:
        subtrees = label_def.flatten_up_to(tree)
    except (ValueError, TypeError):
        raise structure_mismatch(label_tree, "labels", tree, "tree") from None
    return [
        label
        for label, subtree in zip(prefix, subtrees)
        for _ in jax.tree.leaves(subtree)
    ]


def _is_key(x: Any) -> bool:
    return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def pack(tree: PyTree, labels: PyTree | Callable | None = None) -> Packed:
    """Packs the arrays of `tree` into one flat buffer per dtype (and per label).

    **Arguments:**

    - `tree`: any pytree (an Equinox model included); its non-array leaves
      (activation functions, ...) are kept as they are, outside the buffers.
    - `labels`: optional: a tree with the structure of `tree` or a prefix of it (a
      label covers the whole subtree below it, as in a mask), or a function of
      `tree` returning one, holding hashable labels, such as a bool for "gets
      weight decay"; leaves with different labels go to different buffers, and
      `Packed.labels()` gives the labels back in the packed structure. A tree of
      another structure is a `ValueError` saying where the two part.

    Arrays of PRNG keys (`jax.random.key`) have no flat numeric form: a tree
    holding one is a `TypeError` naming the leaf.

    **Returns:** a `Packed`; `pack(tree).unpack()` equals `tree`.

    **Example:**

    ```python
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import eqxopt

    model = eqx.nn.MLP(2, 1, width_size=8, depth=2, key=jax.random.key(0))
    packed = eqxopt.pack(model)
    assert len(jax.tree.leaves(packed)) == 1  # six float32 arrays in one buffer
    opt = eqxopt.Adam(1e-3)
    state = opt.init(packed)  # packed moments too
    grads = jax.grad(lambda p: jnp.sum(p.unpack()(jnp.ones(2)) ** 2))(packed)
    packed, state = opt.step(grads, state, packed)
    model = packed.unpack()  # the model again
    ```
    """
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(tree)
    if labels is None:
        label_leaves: list[Hashable] = [None] * len(with_paths)
    else:
        label_tree = labels(tree) if callable(labels) else labels
        try:  # a label at each leaf (whatever it is: it must hash, below)
            label_leaves = treedef.flatten_up_to(label_tree)
        except (ValueError, TypeError):
            label_leaves = _labels_of_prefix(label_tree, tree)
    keys: list[tuple] = []
    grouped: list[list[Any]] = []
    slots: list[_Slot] = []
    for (path, leaf), label in zip(with_paths, label_leaves):
        if not _is_array(leaf):
            slots.append(("static", static_key(leaf)))
            continue
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.extended):
            # Typed PRNG keys (and other extended dtypes) have no flat form that a
            # buffer of numbers could hold.
            what = "PRNG keys" if _is_key(leaf) else "an extended dtype"
            raise TypeError(
                f"pack: tree{jax.tree_util.keystr(path)} holds {what} "
                f"({leaf.dtype}), which cannot go into a flat buffer; keep it out "
                "of the packed tree (eqx.partition), or pack its raw data "
                "(jax.random.key_data for keys)"
            )
        try:
            hash(label)
        except TypeError:
            raise TypeError(f"labels must be hashable, got {label!r}") from None
        key = (label, jnp.dtype(leaf.dtype).name)
        if key not in keys:
            keys.append(key)
            grouped.append([])
        index = keys.index(key)
        grouped[index].append(leaf)
        slots.append(("array", index, tuple(np.shape(leaf)), jnp.dtype(leaf.dtype)))
    buffers = tuple(_concat([jnp.ravel(x) for x in group]) for group in grouped)
    return Packed(buffers, _Layout(treedef, tuple(slots), tuple(keys)))


def refuse_leaf_reductions(opt: Any, params: PyTree) -> None:
    """Where `params` hold a `Packed`, a `ValueError` naming the first transform of
    `opt` (itself, or one it holds at any depth) whose own maths reduces over a
    leaf (`AbstractTransform.reduction`): on a packed model it would reduce over a
    buffer of many parameters, and its numbers would not be the tree's. Maths
    that reduces over nothing, or over the whole tree only, gives the tree's
    numbers (to rounding) on the buffers."""
    packed = [x for x in jax.tree.leaves(params, is_leaf=_is_packed) if _is_packed(x)]
    if not packed:
        return
    for transform, path in _transforms_in(opt, type(opt).__name__):
        if transform.reduction() != "leaf":
            continue
        name = type(transform).__name__
        where = "" if path == name else f" (in {path})"
        raise ValueError(
            f"{name}{where} reduces over each leaf of the parameters (norms, means, "
            "matrix statistics or noise drawn per leaf), and a packed model's "
            "leaves are buffers of many parameters: its numbers would not be the "
            f"tree's. Step the tree itself (opt.init(model)), or pack the model "
            "for an optimizer whose maths is element-wise (SGD, the Adam family, "
            "Lion, ...) or reduces over the whole tree only (ClipByGlobalNorm, ...)"
        )


def _is_packed(x: Any) -> bool:
    return isinstance(x, Packed)


def _transforms_in(opt: Any, path: str) -> list[tuple[Any, str]]:
    """`opt` and every transform it holds in its fields, at any depth, each with
    where it is (`Chain.links[1]`)."""
    found = [(opt, path)]
    for field in dataclasses.fields(opt):
        held = getattr(opt, field.name, None)
        items = held if isinstance(held, (list, tuple)) else [held]
        items = held.values() if isinstance(held, dict) else items
        for i, item in enumerate(items):
            if isinstance(item, eqx.Module) and hasattr(item, "reduction"):
                index = f"[{i}]" if isinstance(held, (list, tuple)) else ""
                found += _transforms_in(item, f"{path}.{field.name}{index}")
    return found
