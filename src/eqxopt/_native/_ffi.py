"""The XLA custom calls into eqxopt's native code: whether they are used (the
switch), how they are made (`ffi_or_xla`, with XLA's own operations wherever a
custom call cannot go) and the two copies of packed buffers (`split`/`concat`).

The native path is used when it is switched on (`eqxopt.set_native_kernels`, the
environment variable `EQXOPT_NATIVE`), this JAX is one it was tested with
(`_compat.TESTED`), the default backend is the CPU and the handler library could be
built (`_build.handler`). How many devices the process sees does not matter: each
custom call is lowered as one only where its program runs as it is on each device
(a program of one device, any device of several, or the body of a `shard_map` over
every mesh axis: `_compat.lowering_per_device`), and as XLA's own operations
elsewhere, where XLA's partitioner, knowing nothing of the call, would gather its
operands. `_shard` wraps the kernels of sharded leaves in such a `shard_map`.
"""

import functools
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._core import _backend
from . import _build, _compat

_enabled = [_build.env_flag("EQXOPT_NATIVE", True)]


def set_enabled(enabled: bool) -> None:
    """The switch behind `eqxopt.set_native_kernels`: compiled steps traced with
    the kernels in the other state trace again (`_backend.changed`)."""
    if enabled != _enabled[0]:
        _enabled[0] = enabled
        _backend.changed()


def usable() -> bool:
    if not _enabled[0] or not _compat.backend_supported():
        return False
    if jax.default_backend() != "cpu":
        return False
    return _build.handler() is not None


def why_unusable() -> str:
    """Why `usable()` is false, in words."""
    if not _enabled[0]:
        return "they are switched off (set_native_kernels(False) or EQXOPT_NATIVE=0)"
    if not _compat.backend_supported():
        first, last = (".".join(map(str, v)) for v in _compat.TESTED)
        return (
            f"they are tested with JAX {first} to {last}.x and this is JAX "
            f"{jax.__version__}"
        )
    if jax.default_backend() != "cpu":
        return (
            f"the default JAX backend is {jax.default_backend()!r}: the kernels are "
            "for CPUs (XLA's own code is what runs on GPUs and TPUs)"
        )
    if _build.handler() is None:
        return "they could not be built here (see the warning eqxopt gave)"
    return "they are in use"


# --------------------------------------------------------------------------------------
# Custom calls, with XLA's code where one cannot go.
# --------------------------------------------------------------------------------------


def ffi_or_xla(
    target: str,
    xla: Callable[..., Any],
    shapes: Callable[..., list[tuple[tuple[int, ...], Any]]] | None = None,
) -> Any:
    """A primitive (multiple results) that runs the FFI target `target` of the
    handler on CPU, and `xla(*args, static=static)` (the same results from XLA's own
    operations) where the custom call cannot go: other platforms, programs that
    XLA partitions over several devices (outside a `shard_map`:
    `_compat.lowering_per_device`), and programs being exported (`jax.export`
    serializes only custom calls with compatibility guarantees, and these kernels
    live in this process only).

    Bound as `prim.bind(*args, static=..., aliases=((input, output), ...),
    attributes=((name, value), ...))`: `static` is hashable and passed to `xla`;
    `aliases` and `attributes` go to the custom call. `shapes(*avals,
    static=static)`, where given, returns the results' `(shape, dtype)` without
    tracing `xla` (which a trace would otherwise do once per call, for its shapes
    alone). Under `jax.vmap` it runs once per batch element. Derivatives are the
    caller's (`ad` rules or `custom_jvp`). Made only once the backend is in use
    (`usable()`), so that a JAX outside the tested range never reaches these
    internals."""
    prim = _compat.new_primitive(target)

    def fallback(static: Hashable, **_: Any) -> Callable[..., list]:
        return lambda *args: list(xla(*args, static=static))

    def abstract(*avals: Any, static: Hashable, **_: Any) -> list:
        if shapes is not None:
            results = shapes(*avals, static=static)
        else:
            results = [
                (x.shape, x.dtype) for x in jax.eval_shape(fallback(static), *avals)
            ]
        return [_compat.shaped_array(shape, dtype) for shape, dtype in results]

    def lower_xla(ctx: Any, *args: Any, static: Hashable, **_: Any) -> Any:
        return _compat.lower_fun(fallback(static))(ctx, *args)

    def lower_cpu(ctx: Any, *args: Any, static: Hashable, aliases, attributes) -> Any:
        if _compat.lowering_for_export(ctx) or not _compat.lowering_per_device(ctx):
            return lower_xla(ctx, *args, static=static)
        rule = jax.ffi.ffi_lowering(target, operand_output_aliases=dict(aliases))
        return rule(ctx, *args, **dict(attributes))

    def batch(args: Any, dims: Any, **params: Any) -> tuple[list, list]:
        size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
        if size == 0:
            outs = jax.vmap(fallback(params["static"]), in_axes=tuple(dims))(*args)
            return outs, [0] * len(outs)
        mapped = [i for i, d in enumerate(dims) if d is not None]

        def one(xs: list) -> list:
            full = list(args)
            for i, x in zip(mapped, xs):
                full[i] = x
            return prim.bind(*full, **params)

        moved = [jnp.moveaxis(args[i], dims[i], 0) for i in mapped]
        outs = jax.lax.map(one, moved)
        return outs, [0] * len(outs)

    @functools.cache
    def compiled(params: tuple) -> Callable[..., Any]:
        return jax.jit(functools.partial(prim.bind, **dict(params)))

    prim.def_impl(lambda *args, **params: compiled(tuple(params.items()))(*args))
    prim.def_abstract_eval(abstract)
    _compat.register_lowering(prim, lower_xla)
    _compat.register_lowering(prim, lower_cpu, platform="cpu")
    _compat.register_batching(prim, batch)
    return prim


# --------------------------------------------------------------------------------------
# Split and concatenate (`Packed`): one copy each, linear, each the other's transpose,
# so every mode of differentiation works and stays one copy.
# --------------------------------------------------------------------------------------


def _split_xla(flat: jax.Array, static: tuple) -> list[jax.Array]:
    sizes = [int(np.prod(s)) for s in static]
    offsets = np.cumsum([0, *sizes]).tolist()
    return [
        jax.lax.slice(flat, (a,), (b,)).reshape(s)
        for a, b, s in zip(offsets[:-1], offsets[1:], static)
    ]


def _concat_xla(*parts: jax.Array, static: tuple) -> list[jax.Array]:
    del static
    return [jnp.concatenate([jnp.ravel(p) for p in parts])]


_NO_FFI_PARAMS = {"aliases": (), "attributes": ()}


@functools.cache
def _copies() -> tuple[Any, Any]:
    """The primitives `eqxopt_split` and `eqxopt_concat` (`static`: the pieces'
    shapes), with their derivative rules."""
    split_p = ffi_or_xla("eqxopt_split", _split_xla)
    concat_p = ffi_or_xla("eqxopt_concat", _concat_xla)

    def split(flat: jax.Array, shapes: tuple) -> list:
        return split_p.bind(flat, static=shapes, **_NO_FFI_PARAMS)

    def concat(shapes: tuple, *parts: jax.Array) -> jax.Array:
        return concat_p.bind(*parts, static=shapes, **_NO_FFI_PARAMS)[0]

    def split_jvp(primals, tangents, *, static, **_):
        outs = split(primals[0], static)
        if _compat.is_zero(tangents[0]):
            return outs, [_compat.zero_like(o) for o in outs]
        return outs, split(tangents[0], static)

    def split_transpose(cotangents, flat, *, static, **_):
        return [concat(static, *map(_compat.instantiate, cotangents))]

    def concat_jvp(primals, tangents, *, static, **_):
        out = concat(static, *primals)
        if all(map(_compat.is_zero, tangents)):
            return [out], [_compat.zero_like(out)]
        return [out], [concat(static, *map(_compat.instantiate, tangents))]

    def concat_transpose(cotangents, *parts, static, **_):
        (cotangent,) = cotangents
        linear = [_compat.is_undefined_primal(p) for p in parts]
        if _compat.is_zero(cotangent):
            return [_compat.zero_like(p) if t else None for p, t in zip(parts, linear)]
        pieces = split(cotangent, static)
        return [c if t else None for c, t in zip(pieces, linear)]

    _compat.register_linear(split_p, split_jvp, split_transpose)
    _compat.register_linear(concat_p, concat_jvp, concat_transpose)
    return split, concat


def _on_one_device(x: Any) -> bool:
    """Whether `x` is not sharded (its type names no mesh of several devices): the
    copies' abstract values carry no sharding, so sharded buffers take XLA's."""
    mesh = getattr(jax.typeof(x).sharding, "mesh", None)
    return mesh is None or mesh.empty or mesh.size == 1


def split(flat: jax.Array, shapes: tuple[tuple[int, ...], ...]) -> list | None:
    """`flat` cut into consecutive pieces of the given shapes as one native copy,
    or `None` where the copy does not apply (XLA's split then): the backend off,
    one piece, a `float0` buffer, or a sharded one."""
    if (
        usable()
        and len(shapes) > 1
        and flat.dtype != jax.dtypes.float0
        and _on_one_device(flat)
    ):
        return _copies()[0](flat, shapes)
    return None


def concat(parts: list[jax.Array]) -> jax.Array | None:
    """The 1-D concatenation of `parts` (all of one dtype) as one native copy, or
    `None` where the copy does not apply."""
    if usable() and len(parts) > 1 and all(map(_on_one_device, parts)):
        arrays = [jnp.asarray(p) for p in parts]
        return _copies()[1](tuple(a.shape for a in arrays), *arrays)
    return None
