"""`Packed`: a parameter tree kept as a few flat buffers (an explicit layout option).

Every array that crosses a `jax.jit` boundary costs JAX a few microseconds, and XLA
runs at least one kernel per leaf: a step over 2000 leaves of 1000 floats spends
most of its time on that, not on arithmetic (an identity function over such a tree
already takes about 8 ms a call here). Packed, the same parameters are one buffer
per dtype (and per label), so the optimizer sees a handful of large leaves.

The model gets its tree back with `packed.unpack()` inside the loss function;
`jax.grad` through it gives the gradients packed the same way. With the native
kernels, cutting the buffer into leaves and gluing the gradients back are each one
copy (`eqxopt_split`/`eqxopt_concat`, linear, so every mode of differentiation
works), so neither compile time nor run time grows with the number of leaves the way
XLA's slices do; elsewhere, and in programs exported with `jax.export`, XLA's slices
and concatenation are used (correct, but slow to compile for thousands of leaves).
"""

from collections.abc import Callable, Hashable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad
from jaxtyping import Array, PyTree

from .._native import _build as _native_ffi, _fused
from ._dispatch import _Static

# One leaf of the original tree: ("array", buffer index, shape, dtype) or
# ("static", key) for anything that is not an array (kept as it is in the key, which
# compares by type and value, or by identity when it is unhashable).
_Slot = tuple[Any, ...]


class _Layout:
    """Where each leaf lives: hashable, so a `Packed` of the same layout reuses
    compiled code."""

    __slots__ = ("keys", "slots", "treedef")

    def __init__(self, treedef: Any, slots: tuple[_Slot, ...], keys: tuple):
        self.treedef, self.slots, self.keys = treedef, slots, keys

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Layout)
            and self.treedef == other.treedef
            and self.slots == other.slots
            and self.keys == other.keys
        )

    def __hash__(self) -> int:
        return hash((self.treedef, self.slots, self.keys))

    def members(self, index: int) -> list[tuple[int, ...]]:
        return [s[2] for s in self.slots if s[0] == "array" and s[1] == index]


class Packed(eqx.Module):
    """Parameters (or gradients, or a moment) stored as one flat buffer per dtype and
    label: make it with `eqxopt.pack(tree)`, read it with `.unpack()`.

    Any optimizer takes a `Packed` as its parameters; its state then holds `Packed`
    moments with the same layout (`state.mu.unpack()` is params-shaped). Element-wise
    optimizers (SGD, the Adam family, Lion, ...) give the same numbers as on the
    tree. Optimizers that reduce over a leaf (LAMB, LARS, Adafactor, Muon, SOAP,
    `ClipByBlockRMS`, ...) would see one leaf per buffer instead of one per
    parameter: use the tree for those.

    **Fields:**

    - `buffers`: the flat buffers (1-D arrays), in the order of `labels()`.
    - `layout`: static: the tree structure and where each leaf lives.
    """

    buffers: tuple[Any, ...]
    layout: _Layout = eqx.field(static=True)

    def unpack(self) -> PyTree:
        """The tree this was packed from (leaves in their shapes and dtypes). Inside
        `jax.grad`, the gradient with respect to the `Packed` comes back packed."""
        pieces = [split(b, self.layout.members(k)) for k, b in enumerate(self.buffers)]
        iterators = [iter(p) for p in pieces]
        leaves = [
            next(iterators[slot[1]]) if slot[0] == "array" else slot[1].obj
            for slot in self.layout.slots
        ]
        return jax.tree.unflatten(self.layout.treedef, leaves)

    def labels(self) -> "Packed":
        """A `Packed` with the same structure whose buffers are replaced by their
        labels (see `pack`): with bool labels, a weight-decay mask for
        `AdamW(mask=...)` and the like."""
        return Packed(tuple(key[0] for key in self.layout.keys), self.layout)


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


def pack(tree: PyTree, labels: PyTree | Callable | None = None) -> Packed:
    """Packs the arrays of `tree` into one flat buffer per dtype (and per label).

    **Arguments:**

    - `tree`: any pytree (an Equinox model included); its non-array leaves
      (activation functions, ...) are kept as they are, outside the buffers.
    - `labels`: optional: a tree with the structure of `tree` (or a function of
      `tree` returning one) holding a hashable label per array leaf, such as a bool
      for "gets weight decay"; leaves with different labels go to different buffers,
      and `Packed.labels()` gives the labels back in the packed structure.

    **Returns:** a `Packed`; `pack(tree).unpack()` equals `tree`.
    """
    leaves, treedef = jax.tree.flatten(tree)
    if labels is None:
        label_leaves: list[Hashable] = [None] * len(leaves)
    else:
        label_tree = labels(tree) if callable(labels) else labels
        label_leaves = treedef.flatten_up_to(label_tree)
    keys: list[tuple] = []
    grouped: list[list[Any]] = []
    slots: list[_Slot] = []
    for leaf, label in zip(leaves, label_leaves):
        if not _is_array(leaf):
            slots.append(("static", _Static(leaf)))
            continue
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
    buffers = tuple(concat([jnp.ravel(x) for x in group]) for group in grouped)
    return Packed(buffers, _Layout(treedef, tuple(slots), tuple(keys)))


# --------------------------------------------------------------------------------------
# Split and concatenate: one FFI copy each on a single CPU device, XLA otherwise.
# --------------------------------------------------------------------------------------


def _native() -> bool:
    return _fused.usable()


def _split_xla(flat: Array, static: tuple) -> list[Array]:
    sizes = [int(np.prod(s)) for s in static]
    offsets = np.cumsum([0, *sizes]).tolist()
    return [
        jax.lax.slice(flat, (a,), (b,)).reshape(s)
        for a, b, s in zip(offsets[:-1], offsets[1:], static)
    ]


def _concat_xla(*parts: Array, static: tuple) -> list[Array]:
    return [jnp.concatenate([jnp.ravel(p) for p in parts])]


# One copy each (`eqxopt_split`/`eqxopt_concat`); XLA's slices in exported programs.
# `static` is the pieces' shapes. Both are linear, each the other's transpose, so
# every mode of differentiation works and stays one copy.
_split_p = _native_ffi.ffi_or_xla("eqxopt_split", _split_xla)
_concat_p = _native_ffi.ffi_or_xla("eqxopt_concat", _concat_xla)
_NO_FFI_PARAMS = {"aliases": (), "attributes": ()}


def _split_native(flat: Array, shapes: tuple) -> list[Array]:
    return _split_p.bind(flat, static=shapes, **_NO_FFI_PARAMS)


def _concat_native(shapes: tuple, *parts: Array) -> Array:
    return _concat_p.bind(*parts, static=shapes, **_NO_FFI_PARAMS)[0]


def _zero(x: Any) -> Any:
    return ad.Zero(jax.typeof(x).to_tangent_aval())


def _split_jvp(primals, tangents, *, static, **_):
    outs = _split_native(primals[0], static)
    if type(tangents[0]) is ad.Zero:
        return outs, [_zero(o) for o in outs]
    return outs, _split_native(tangents[0], static)


def _split_transpose(cotangents, flat, *, static, **_):
    parts = [ad.instantiate_zeros(c) for c in cotangents]
    return [_concat_native(static, *parts)]


def _concat_jvp(primals, tangents, *, static, **_):
    out = _concat_native(static, *primals)
    if all(type(t) is ad.Zero for t in tangents):
        return [out], [_zero(out)]
    return [out], [_concat_native(static, *map(ad.instantiate_zeros, tangents))]


def _concat_transpose(cotangents, *parts, static, **_):
    (cotangent,) = cotangents
    if type(cotangent) is ad.Zero:
        return [_zero(p) if ad.is_undefined_primal(p) else None for p in parts]
    pieces = _split_native(cotangent, static)
    return [c if ad.is_undefined_primal(p) else None for c, p in zip(pieces, parts)]


ad.primitive_jvps[_split_p] = _split_jvp
ad.primitive_transposes[_split_p] = _split_transpose
ad.primitive_jvps[_concat_p] = _concat_jvp
ad.primitive_transposes[_concat_p] = _concat_transpose


def split(flat: Array, shapes: list[tuple[int, ...]]) -> list[Array]:
    """`flat` cut into consecutive pieces of the given shapes."""
    if not shapes:
        return []
    shapes_t = tuple(tuple(s) for s in shapes)
    if _native() and len(shapes_t) > 1 and flat.dtype != jax.dtypes.float0:
        return _split_native(flat, shapes_t)
    return _split_xla(flat, static=shapes_t)


def concat(parts: list[Array]) -> Array:
    """The 1-D concatenation of `parts` (all of one dtype)."""
    if _native() and len(parts) > 1:
        arrays = [jnp.asarray(p) for p in parts]
        return _concat_native(tuple(a.shape for a in arrays), *arrays)
    return jnp.concatenate([jnp.ravel(p) for p in parts])
