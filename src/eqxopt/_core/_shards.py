"""Reductions over parameters inside `jax.shard_map`: the `axis_name` option.

Inside `shard_map` each device holds its own block of a split leaf, so a sum over a
leaf (a norm, a mean, a count of NaNs) taken there is a partial one. A transform whose
maths reduces over parameters takes `axis_name` (a mesh axis name or a tuple of
them), and passes every such partial reduction through `shard_sum`/`shard_total`:

- a value that varies over a named axis (its JAX type says so: `jax.typeof(x).vma`)
  holds a different block on each device along that axis, so its partial sums are
  added over that axis (`jax.lax.psum`);
- a value that does not vary over a named axis is the same on every device along it
  (a replicated leaf), so it is counted once, not once per device.

A reduction over some dimensions of a leaf only (a unit norm, a factored statistic)
needs to know which dimension is split, which JAX's types inside `shard_map` do not
say (a block of shape `(4, 16)` split 8 ways may be a `(32, 16)` leaf or a `(4, 128)`
one). Such a transform also takes `param_specs`: the `PartitionSpec` of each
parameter leaf (what was passed to `shard_map`'s `in_specs`), or a pytree prefix of
params of them. Without it, a leaf that varies over named axes is taken to be split
along its leading dimension (FSDP's convention, `PartitionSpec(axes)`). `leaf_layout`
gives, per dimension, the named axes it is split over (and raises naming the leaf
where a declared spec disagrees with what the leaf's type says varies), and a sum
over some dimensions is summed over the axes of those dimensions only
(`shard_sum_dims`). A transform that needs a split leaf whole (SOAP's rotations)
takes it with `gather_whole` and gives back this device's block with `local_block`.

So with FSDP, where some leaves are split over the axis and the others replicated
across it, the result equals the unsharded run's (up to the order of the float32
additions), and is the same on every device. On a JAX without varying-axes types
(before 0.6), or inside `shard_map(..., check_vma=False)` where every value is typed
invariant, nothing tells the two kinds apart: every value is then taken to be split
over every named axis (summed over all of them), so pass replicated leaves' gradients
only where that is what you mean (or use `check_vma=True`, JAX's default).

`cond` is the `lax.cond` for values that may vary: its branches' outputs are typed
alike (the held zeros and states of wrappers vary where the run branch's do).
"""

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec
from jaxtyping import Array, PyTree

from . import _jax_api
from ._structure import FrozenTree, is_none, structure_mismatch

AxisName = tuple[Hashable, ...] | None
# Per dimension of a leaf, the axes of `axis_name` it is split over.
Layout = tuple[tuple[Hashable, ...], ...]


def checked_axis_name(
    name: str, value: Hashable | tuple[Hashable, ...] | None
) -> AxisName:
    """`None`, or the mesh axis names as a tuple (a single name becomes a 1-tuple);
    else a `TypeError` naming the argument."""
    if value is None:
        return None
    names = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not names or not all(isinstance(n, str) for n in names):
        raise TypeError(
            f"{name} must be None, a mesh axis name (str) or a tuple of them, got "
            f"{value!r}"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"{name} names a mesh axis twice: {value!r}")
    return names


def _tracked(axis_name: tuple, owner: str) -> bool:
    """Whether this trace types which of `axis_name`'s axes a value varies over; a
    `ValueError` for an axis not bound here."""
    tracked = True
    for name in axis_name:
        try:
            index = jax.lax.axis_index(name)
        except NameError as e:
            raise ValueError(
                f"{owner}: axis_name {name!r} is not a mesh axis bound here; call "
                "it inside jax.shard_map over a mesh with that axis (or leave "
                "axis_name=None outside shard_map)"
            ) from e
        # axis_index varies over its axis exactly when this trace types what varies.
        seen = _jax_api.varying_axes(index)
        tracked = tracked and seen is not None and name in seen
    return tracked


def _axes_to_reduce(x: Array, axis_name: tuple, owner: str) -> tuple:
    """The axes of `axis_name` that `x` varies over (all of them when this trace
    does not type what varies); a `ValueError` for an axis not bound here."""
    if not _tracked(axis_name, owner):
        return axis_name
    varying = _jax_api.varying_axes(x) or frozenset()
    return tuple(n for n in axis_name if n in varying)


def shard_sum(x: Array, axis_name: AxisName, owner: str) -> Array:
    """`x`, a sum taken over this device's block, summed over the axes of
    `axis_name` it varies over (see the module docstring); `x` itself for
    `axis_name=None`. `owner` names the transform in error messages."""
    if axis_name is None:
        return x
    axes = _axes_to_reduce(x, axis_name, owner)
    return jax.lax.psum(x, axes) if axes else x


def shard_total(
    partials: Sequence[Array], axis_name: AxisName, owner: str, dtype: Any
) -> Array:
    """The sum of `partials` (per-leaf sums, each over this device's block), each
    summed over the axes of `axis_name` it varies over: one `psum` per distinct set
    of axes, of the local sum of the partials that share it. `0` (of `dtype`) for
    none."""
    total = jnp.zeros((), dtype)
    if axis_name is None:
        for x in partials:
            total = total + x.astype(dtype)
        return total
    groups: dict[tuple, Array] = {}
    for x in partials:
        axes = _axes_to_reduce(x, axis_name, owner)
        groups[axes] = groups.get(axes, jnp.zeros((), dtype)) + x.astype(dtype)
    for axes, part in groups.items():
        total = total + (jax.lax.psum(part, axes) if axes else part)
    return total


def shard_size(x: Array, axis_name: AxisName, owner: str) -> int:
    """The number of elements of the whole leaf whose block on this device is `x`:
    `x.size` times the sizes of the axes of `axis_name` it varies over (a Python
    int, for means over a split leaf)."""
    if axis_name is None:
        return x.size
    size = x.size
    for name in _axes_to_reduce(x, axis_name, owner):
        size *= jax.lax.psum(1, name)
    return size


def shard_max(x: Array, axis_name: AxisName, owner: str) -> Array:
    """`x`, a maximum taken over this device's block, maximised over the axes of
    `axis_name` it varies over; `x` itself for `axis_name=None`."""
    if axis_name is None:
        return x
    axes = _axes_to_reduce(x, axis_name, owner)
    return jax.lax.pmax(x, axes) if axes else x


def checked_param_specs(
    name: str, value: PartitionSpec | PyTree[PartitionSpec | None] | None
) -> FrozenTree | None:
    """`None`, or a `PartitionSpec` or pytree of them (`None` in the tree: not
    split), frozen; else a `TypeError` naming the argument and the entry."""
    if value is None:
        return None
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(value, is_leaf=is_none)
    leaves = []
    for path, spec in with_paths:
        spec = PartitionSpec() if spec is None else spec
        if not isinstance(spec, PartitionSpec):
            raise TypeError(
                f"{name}{jax.tree_util.keystr(path)} must be a "
                f"jax.sharding.PartitionSpec (or None), got {spec!r}"
            )
        leaves.append(spec)
    return FrozenTree("param_specs", treedef, tuple(leaves))


def resolve_specs(
    specs: FrozenTree | None, params: PyTree, name: str = "param_specs"
) -> list[PartitionSpec | None]:
    """One spec per leaf of `params` (in `jax.tree.leaves` order), each entry of
    `specs` covering its whole subtree; `None` everywhere for `specs=None`."""
    n_leaves = len(jax.tree.leaves(params))
    if specs is None:
        return [None] * n_leaves
    try:
        subtrees = specs.treedef.flatten_up_to(params)
    except (ValueError, TypeError):
        raise structure_mismatch(specs.tree(), name, params, "params") from None
    out: list[PartitionSpec | None] = []
    for spec, sub in zip(specs.leaves, subtrees):
        out.extend([spec] * len(jax.tree.leaves(sub)))
    return out


def _named(entry: Any, axis_name: tuple) -> tuple:
    """The axes of `axis_name` in one entry of a `PartitionSpec`."""
    names = entry if isinstance(entry, tuple) else (entry,)
    return tuple(n for n in names if isinstance(n, str) and n in axis_name)


def leaf_layout(
    x: Array,
    axis_name: AxisName,
    owner: str,
    spec: PartitionSpec | None = None,
    where: str = "",
) -> Layout:
    """Per dimension of the leaf whose block here is `x`, the axes of `axis_name` it
    is split over: as `spec` declares (its `PartitionSpec` in `shard_map`), or, for
    `spec=None`, every axis it varies over along dimension 0. A `ValueError` naming
    the leaf (`params{where}`) when the spec has more entries than `x` dimensions,
    or names other axes of `axis_name` than `x`'s type says it varies over."""
    ndim = jnp.ndim(x)
    if axis_name is None:
        return ((),) * ndim
    varying = _axes_to_reduce(x, axis_name, owner)
    if spec is None:
        if not varying or not ndim:
            return ((),) * ndim
        return (varying,) + ((),) * (ndim - 1)
    if len(spec) > ndim:
        raise ValueError(
            f"{owner}: param_specs{where} is {spec}, with more entries than "
            f"params{where} has dimensions ({ndim})"
        )
    layout = tuple(_named(e, axis_name) for e in spec) + ((),) * (ndim - len(spec))
    declared = {n for axes in layout for n in axes}
    if _tracked(axis_name, owner) and declared != set(varying):
        raise ValueError(
            f"{owner}: param_specs{where} is {spec}, which splits params{where} "
            f"over {sorted(declared, key=str)} of axis_name, but inside shard_map "
            f"it varies over {sorted(varying, key=str)}; give the PartitionSpec "
            "passed to shard_map's in_specs for it"
        )
    return layout


def leaf_layouts(
    params: PyTree, axis_name: AxisName, owner: str, specs: FrozenTree | None
) -> list[Layout | None]:
    """`leaf_layout` of every leaf of `params` (`None` for non-array leaves), from
    the `param_specs` option `specs`."""
    leaves_with_paths = jax.tree.leaves_with_path(params)
    per_leaf = resolve_specs(specs, params)
    return [
        leaf_layout(x, axis_name, owner, spec, jax.tree_util.keystr(path))
        if hasattr(x, "ndim")
        else None
        for (path, x), spec in zip(leaves_with_paths, per_leaf)
    ]


def global_shape(x: Array, layout: Layout) -> tuple[int, ...]:
    """The shape of the whole leaf whose block here is `x`, split as `layout`
    says (from `leaf_layout`)."""
    shape = []
    for size, axes in zip(x.shape, layout):
        for name in axes:
            size *= jax.lax.psum(1, name)
        shape.append(size)
    return tuple(shape)


def shard_sum_dims(
    x: Array, dims: int | tuple[int, ...] | None, layout: Layout, keepdims: bool = False
) -> Array:
    """`jnp.sum(x, dims)` over the whole leaf whose block here is `x`, split as
    `layout` says (from `leaf_layout`): summed over the axes of the dimensions
    summed (`None`: all)."""
    total = jnp.sum(x, axis=dims, keepdims=keepdims)
    if not x.ndim:
        return total
    if dims is None:
        listed: tuple[int, ...] = tuple(range(x.ndim))
    else:
        listed = (dims,) if isinstance(dims, int) else tuple(dims)
    axes: list[Hashable] = []
    for d in listed:
        axes.extend(n for n in layout[d % x.ndim] if n not in axes)
    return jax.lax.psum(total, tuple(axes)) if axes else total


def drop_dim(layout: Layout, dim: int) -> Layout:
    """The layout of a statistic that summed `dim` away."""
    dim %= len(layout)
    return layout[:dim] + layout[dim + 1 :]


def _block_starts(x: Array, layout: Layout) -> list[Any]:
    """Where this device's block starts in the whole leaf, per dimension (the
    axes of a dimension counted major to minor, as a `PartitionSpec` lists them)."""
    starts: list[Any] = []
    for size, axes in zip(x.shape, layout):
        index: Any = 0
        for name in axes:
            index = index * jax.lax.psum(1, name) + jax.lax.axis_index(name)
        starts.append(index * size)
    return starts


def gather_whole(x: Array, layout: Layout) -> Array:
    """The whole leaf whose block here is `x`, split as `layout` says, the same on
    every device along its axes (and typed so: each device writes its block into
    zeros at its place and the results are `psum`med, which adds only zeros to each
    element, so it is exact). `x` itself for a leaf that is not split."""
    axes = tuple(dict.fromkeys(n for dim in layout for n in dim))
    if not axes:
        return x
    whole = jnp.zeros(global_shape(x, layout), x.dtype)
    whole = jax.lax.dynamic_update_slice(whole, x, _block_starts(x, layout))
    return jax.lax.psum(whole, axes)


def local_block(whole: Array, like: Array, layout: Layout) -> Array:
    """This device's block (shaped like `like`, split as `layout` says) of a
    leaf-shaped `whole`; `whole` itself for a leaf that is not split."""
    if not any(layout):
        return whole
    return jax.lax.dynamic_slice(whole, _block_starts(like, layout), like.shape)


def leaf_norm(x: Array, axis_name: AxisName, owner: str) -> Array:
    """The Euclidean (Frobenius) norm of the whole leaf whose block here is `x`."""
    return jnp.sqrt(shard_sum(jnp.sum(_abs_sq(x)), axis_name, owner))


def _abs_sq(x: Array) -> Array:
    return jnp.real(x * jnp.conj(x)) if jnp.iscomplexobj(x) else x * x


def shard_mean(x: Array, axis_name: AxisName, owner: str) -> Array:
    """The mean of all elements of the leaf whose block on this device is `x`."""
    return shard_sum(jnp.sum(x), axis_name, owner) / shard_size(x, axis_name, owner)


def like_varying(x: Any, like: Any) -> Any:
    """`x` typed as varying over the manual mesh axes `like` varies over too (its
    value unchanged): for a value computed from invariant inputs (a random
    tangent, a zero) that meets `like` where JAX needs the types to match."""
    have = _jax_api.varying_axes(x) or frozenset()
    want = _jax_api.varying_axes(like) or frozenset()
    return _jax_api.pvary(x, tuple(sorted(want - have, key=str)))


def match_carry(body: Callable, init: Any) -> Any:
    """`init`, each leaf typed as varying over the manual mesh axes that `body`'s
    output leaf varies over too, so that a loop (`lax.while_loop`, `lax.scan`)
    whose body mixes its carry with split values keeps the carry's type from
    step to step (its value unchanged). `body` maps a carry to a carry of the
    same structure; a few passes reach the fixed point (one per axis at most)."""
    for _ in range(8):
        try:
            out = jax.eval_shape(body, init)
        except (TypeError, ValueError):  # the loop itself says what is wrong
            return init
        extra = jax.tree.map(
            lambda x, o: (
                (_jax_api.varying_axes(o) or frozenset())
                - (_jax_api.varying_axes(x) or frozenset())
            ),
            init,
            out,
        )
        if not any(jax.tree.leaves(extra, is_leaf=_is_axes)):
            break
        init = jax.tree.map(
            lambda x, axes: _jax_api.pvary(x, tuple(sorted(axes, key=str))),
            init,
            extra,
            is_leaf=_is_axes,
        )
    return init


def _is_axes(x: Any) -> bool:
    return isinstance(x, frozenset)


def while_loop(cond_fun: Callable, body_fun: Callable, init: Any) -> Any:
    """`jax.lax.while_loop` whose carry may come to vary over manual mesh axes
    inside `shard_map` (`match_carry`)."""
    return jax.lax.while_loop(cond_fun, body_fun, match_carry(body_fun, init))


def scan(f: Callable, init: Any, xs: Any, reverse: bool = False) -> Any:
    """`jax.lax.scan` whose carry may come to vary over manual mesh axes inside
    `shard_map` (`match_carry`)."""

    def body(carry: Any) -> Any:
        return f(carry, jax.tree.map(lambda x: x[0], xs))[0]

    return jax.lax.scan(f, match_carry(body, init), xs, reverse=reverse)


def cond(pred: Any, true_fn: Callable, false_fn: Callable, *operands: Any) -> Any:
    """`jax.lax.cond(pred, true_fn, false_fn, *operands)` for branches whose outputs
    agree in shape and dtype but may differ in the manual mesh axes they vary over
    (inside `shard_map`: zeros or a held state in one branch, results computed from
    split gradients in the other). Each output is typed as varying over the union
    of the two branches' axes; elsewhere this is plain `lax.cond`."""
    try:
        yes = jax.eval_shape(true_fn, *operands)
        no = jax.eval_shape(false_fn, *operands)
        target = jax.tree.map(
            lambda a, b: (
                (_jax_api.varying_axes(a) or frozenset())
                | (_jax_api.varying_axes(b) or frozenset())
            ),
            yes,
            no,
        )
    except (TypeError, ValueError):  # mismatched branches: lax.cond says how
        return jax.lax.cond(pred, true_fn, false_fn, *operands)
    if not any(jax.tree.leaves(target)):
        return jax.lax.cond(pred, true_fn, false_fn, *operands)

    def cast(x: Any, axes: frozenset) -> Any:
        have = _jax_api.varying_axes(x) or frozenset()
        return _jax_api.pvary(x, tuple(sorted(axes - have, key=str)))

    def typed(fn: Callable) -> Callable:
        def run(*args: Any) -> Any:
            return jax.tree.map(cast, fn(*args), target)

        return run

    return jax.lax.cond(pred, typed(true_fn), typed(false_fn), *operands)
