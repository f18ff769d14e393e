"""Native steps of leaves whose moments are stored in a narrower form: block-wise
quantized (8-bit and 4-bit `QuantizedArray`s), companded (`Companded8bit`) or bf16
with an int8 residual (`ErrorCorrectedArray`): the dequantize, the rule and the
quantize in one pass.

XLA's code for such a leaf dequantizes every moment into a float32 array the size
of the leaf, runs the rule, and quantizes the new moments (a block's absmax is a
reduction, then a search per element), so a step with 8-bit state moved more bytes
and did more work than one with float32 state. Here one custom call per leaf
(`_kernels/quantized.cc`, in `_build`'s one library) walks the leaf in chunks of a
few blocks: it dequantizes the chunk's codes into a small buffer, runs the rule's C
function (the one `_fused.py` writes for float32 leaves), and stores each block's
absmax and codes over the old ones. The codes are torchao's: the number of
`_storage.search_tables` thresholds at most each value, found by a binary search
over the thresholds held in registers (AVX-512) or by its two look-ups, and
every float operation is XLA's (`_storage.quantize` multiplies by the absmax's
reciprocal as XLA's own rewrite of the division does), so the state is bit for
bit what XLA's code makes. Companded moments are read as `table[code] * scale`
(squared, unsigned) and stored by `_storage._compand`'s float operations, their
float16 scales rounded as XLA's conversion rounds; error-corrected ones by
`_storage.decode_residual` and `encode_residual`, with exact powers of two: the
same bits again.

Used where the float32 kernels are (`_ffi.usable()`, steps that write in place),
on float32 leaves whose moments are float32 or stored in one of those forms (fp8
moments, and anything else, keep XLA's code). Programs being exported and other
platforms get the same computation as XLA operations (`_ffi.ffi_or_xla`);
derivatives go through those too.
"""

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._core import _storage
from . import _build, _ffi, _fused

# The block-wise maps the kernel reads (fp8 codes are floats: XLA's code), and
# FlashOptim's companded ones (`Companded8bit`).
_MAPS = ("dynamic8_signed", "dynamic8_unsigned", "dynamic4_signed", "linear4_unsigned")
_COMPANDED = ("companded8_signed", "companded8_unsigned")
# The layout name of an `ErrorCorrectedBf16` moment (bf16 values, int8 residuals).
_ERROR_CORRECTED = "error_corrected_bf16"
_F32 = jnp.dtype(jnp.float32)


class _Layout(NamedTuple):
    """A moment of the leaf: `None` for float32, else its map (`_ERROR_CORRECTED`
    for an `ErrorCorrectedArray`), block and shape."""

    map_name: str
    block_size: int
    shape: tuple[int, ...]

    @property
    def n_buffers(self) -> int:
        """Its buffers among the call's arguments (`_buffers`)."""
        if self.map_name == _ERROR_CORRECTED:
            return 2
        if self.map_name in _COMPANDED:
            return 2 + _N_COMPANDED_CONSTANTS
        return 2 + _N_CONSTANTS


@dataclasses.dataclass(eq=False)
class _Spec:
    """Static data of one call (hashed by identity)."""

    program: _fused.Program
    layouts: tuple[_Layout | None, ...]
    kernel_id: int
    aliases: tuple[tuple[int, int], ...]


@functools.cache
def search_entries(map_name: str) -> np.ndarray:
    """`_storage.search_tables(map_name)` as one int32 per bucket, for one look-up
    per element: `base << 24 | offset`, where the code of `y` in the bucket is
    `base + (within >= offset)` and `within` is `y`'s place in its bucket (the low
    `shift` bits of its magnitude above `low << shift`, reversed for negative `y`,
    whose order is the reverse of their magnitudes'); `offset` is the threshold's
    place, or `2**shift` (never reached) in a bucket without one. (Magnitudes
    under `low << shift` read as the first bucket's start, which lies strictly
    below the least threshold: `search_tables`.)"""
    tables = _storage.search_tables(map_name)
    k = tables.buckets.shape[0] // 2
    mask = (1 << tables.shift) - 1
    entries = np.empty(2 * k, np.int64)
    for key in range(2 * k):
        base = int(tables.buckets[key])
        negative = key < k
        index = k - 1 - key if negative else key - k
        offset = mask + 1
        threshold = tables.thresholds[base]
        # The bucket holds its code's threshold if the code rounds up inside it.
        if not np.isnan(threshold) and (threshold < 0) == negative and threshold != 0:
            rel = int(np.abs(threshold).view(np.uint32)) - (tables.low << tables.shift)
            if max(rel, 0) >> tables.shift == index:
                within = max(rel, 0) & mask
                offset = mask - within if negative else within
        entries[key] = base << 24 | offset
    assert tables.shift <= 23 and np.all(entries < 2**32)
    return entries.astype(np.uint32).view(np.int32)  # read as uint32


# The buffers after a quantized moment's codes and absmax (`_constants`): four
# for a block-wise map, two for a companded one.
_N_CONSTANTS = 4
_N_COMPANDED_CONSTANTS = 2


def _constants(map_name: str) -> list[jax.Array]:
    if map_name in _COMPANDED:
        signed = map_name == "companded8_signed"
        return [
            jnp.asarray(_storage.companded_table(map_name)),
            jnp.asarray([int(signed)], jnp.int32),
        ]
    tables = _storage.search_tables(map_name)
    return [
        jnp.asarray(_storage.code_map(map_name)),
        jnp.asarray(search_entries(map_name)),
        jnp.asarray([tables.shift, tables.low], jnp.int32),
        jnp.asarray(tables.thresholds, jnp.float32),
    ]


def _moment_args(static: _Spec, args: tuple) -> list[tuple[Any, tuple]]:
    """Per moment of the call, its layout and its buffers among `args` (those after
    `g` and `p`): `(values,)` for a float32 moment, `(codes, absmax)` for a
    quantized one (its `_constants` follow them), `(value, residual)` for an
    error-corrected one."""
    per_moment, position = [], 0
    for layout in static.layouts:
        if layout is None:
            per_moment.append((None, args[position : position + 1]))
            position += 1
        else:
            per_moment.append((layout, args[position : position + 2]))
            position += layout.n_buffers
    return per_moment


def _stored(layout: _Layout, buffers: Sequence[Any]) -> Any:
    """The moment leaf that a layout's two buffers hold."""
    if layout.map_name == _ERROR_CORRECTED:
        return _storage.ErrorCorrectedArray(*buffers)
    codes, absmax = buffers
    return _storage.QuantizedArray(
        codes, absmax, layout.shape, jnp.float32, layout.map_name
    )


def _buffers(stored: Any) -> list[Any]:
    """`_stored`'s inverse."""
    if isinstance(stored, _storage.ErrorCorrectedArray):
        return [stored.value, stored.residual]
    return [stored.codes, stored.absmax]


def _xla(scalars: jax.Array, g: jax.Array, p: jax.Array, *args: Any, static: _Spec):
    """The call as XLA operations: what the engine's own code computes."""
    moments, stored = [], []
    for layout, buffers in _moment_args(static, args):
        if layout is None:
            moments.extend(buffers)
            stored.append(None)
        else:
            stored.append(_stored(layout, buffers))
            moments.append(stored[-1].dequantize())
    outs = _fused.reference(static.program, scalars, g, p, *moments)
    results = [outs[0]]
    for old, value in zip(stored, outs[1:]):
        results.extend([value] if old is None else _buffers(old.requantize(value)))
    return results


def _result_shapes(scalars: Any, g: Any, p: Any, *args: Any, static: _Spec) -> list:
    # The first result is float32 like `g`; each moment comes back in the shapes
    # and dtypes it came in (codes and scales are written over the old ones).
    results = [(g.shape, jnp.float32)]
    for layout, buffers in _moment_args(static, args):
        if layout is None:
            results.append((buffers[0].shape, jnp.float32))
        else:
            results += [(x.shape, x.dtype) for x in buffers]
    return results


@functools.cache
def _primitive() -> Any:
    return _ffi.ffi_or_xla(_build.QUANTIZED_TARGET, _xla, _result_shapes)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _call(spec: _Spec, *args: jax.Array) -> list:
    return _primitive().bind(
        *args,
        static=spec,
        aliases=spec.aliases,
        attributes=(
            ("kernel", np.int64(spec.kernel_id)),
            ("n_moments", np.int64(len(spec.layouts))),
        ),
    )


@_call.defjvp
def _call_jvp(spec: _Spec, primals: tuple, tangents: tuple) -> tuple:
    return jax.jvp(functools.partial(_xla, static=spec), primals, tangents)


def supported(stored: Any) -> bool:
    """Whether the kernel takes a moment stored like this."""
    if isinstance(stored, _storage.ErrorCorrectedArray):
        return stored.value.dtype == jnp.bfloat16 and stored.residual.dtype == jnp.int8
    return isinstance(stored, _storage.QuantizedArray) and (
        stored.map_name in (*_MAPS, *_COMPANDED) and jnp.dtype(stored.dtype) == _F32
    )


def _layout(stored: Any) -> _Layout:
    if isinstance(stored, _storage.ErrorCorrectedArray):
        return _Layout(_ERROR_CORRECTED, 1, stored.shape)
    return _Layout(stored.map_name, stored.block_size, stored.shape)


@dataclasses.dataclass
class Kernels:
    """As `_fused.Kernels`, for leaves with at least one quantized moment: runs
    `rule(g, p, *moments[, flag])` on each leaf `add`ed as one in-place call;
    `finish()` gives each leaf's `_fused.Result` (the update with `applying`
    unset, else the new parameter), its quantized moments as `QuantizedArray`s."""

    rule: Callable[..., Any]
    n_moments: int
    applying: bool
    grads: Sequence[Any]
    rules: dict[tuple, _fused.Rule] = dataclasses.field(
        default_factory=dict, init=False
    )
    results: dict[int, _fused.Result] = dataclasses.field(
        default_factory=dict, init=False
    )
    before: list[list[Any]] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.before = _fused.waits(self.grads)

    def takes(self, g: Any, p: Any, old: Sequence[Any]) -> bool:
        if g is None or g.dtype != _F32 or p.dtype != _F32 or g.shape != p.shape:
            return False

        def fits(m: Any) -> bool:
            if _storage.is_quantized(m):
                return supported(m) and m.shape == tuple(p.shape)
            return m is not None and m.dtype == _F32 and m.shape == p.shape

        return any(map(supported, old)) and all(map(fits, old))

    def add(self, index: int, g: Any, p: Any, old: Sequence[Any], flag: tuple) -> None:
        """Runs leaf `index` now; `Unsupported` (nothing run) if the rule cannot."""
        rule = _fused.checked_rule(self.rules, self.rule, self.n_moments, flag, p)
        program = rule.program("step" if self.applying else "update")
        # The rule's function, registered with the one library, which also holds
        # this handler (`_build`); `Unsupported` if either cannot be built.
        kernel_id = _fused.load(program)
        layouts: list[_Layout | None] = []
        args: list[Any] = [g, p]
        aliases = {2: 0} if self.applying else {}
        outputs = 1
        for m in old:
            if _storage.is_quantized(m):
                layout = _layout(m)
                layouts.append(layout)
                # Argument 0 is the scalar vector.
                aliases[len(args) + 1] = outputs
                aliases[len(args) + 2] = outputs + 1
                args += _buffers(m)
                if layout.map_name != _ERROR_CORRECTED:
                    args += _constants(layout.map_name)
                outputs += 2
            else:
                layouts.append(None)
                aliases[len(args) + 1] = outputs
                args.append(m)
                outputs += 1
        vector = program.vector
        if self.before[index]:
            vector = jnp.concatenate(
                [vector, *map(_fused.order_after, self.before[index])]
            )
        spec = _Spec(program, tuple(layouts), kernel_id, tuple(aliases.items()))
        outs = _call(spec, vector, *args)
        first, position, moments = outs[0], 1, []
        for layout in layouts:
            if layout is None:
                moments.append(outs[position])
                position += 1
            else:
                moments.append(_stored(layout, outs[position : position + 2]))
                position += 2
        if self.applying:
            self.results[index] = _fused.Result(None, first, moments)
        else:
            self.results[index] = _fused.Result(first, None, moments)

    def finish(self) -> dict[int, _fused.Result]:
        return self.results
