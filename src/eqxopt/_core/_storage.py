"""Block-wise quantized optimizer state: 8-bit, 4-bit and fp8 moments.

A storage option (`Blockwise8bit()`, `Blockwise4bit()`, `BlockwiseFp8()`) goes where
a dtype goes today (`mu_dtype=`, `nu_dtype=`, ...). At `init` each large enough float
leaf of that moment is stored as a `QuantizedArray` at the parameter's position in
the state tree; `map_leaves` dequantizes it on load (the rule sees float32 arrays)
and quantizes the new value on store, so every optimizer that runs through the
per-leaf engine gets it without code of its own.

The maps and block sizes are those of torchao 0.18 (`torchao.optim.AdamW8bit`,
`AdamW4bit`, `AdamWFp8`), after bitsandbytes (Dettmers et al. 2021, arXiv 2110.02861)
and Li et al. 2023 (arXiv 2309.01507): a leaf is flattened and cut into blocks; each
block is divided by its absmax (so its values lie in [-1, 1]) and each value is
stored as the index of the nearest entry of a fixed table, the map.
`Companded8bit` (FlashOptim, arXiv 2602.23349) computes its codes instead: groups
of 32 scaled by a float16 absmax, a softsign-companded int8 or a square root in a
uint8.

On a mesh: for a parameter split along its leading dimension (FSDP) into shards
whose element count divides by the block size, no block straddles two shards, and
`init` splits `codes`/`absmax` over the same mesh axes along their block dimension
(`_placed_like`), so a step reads and writes each shard's blocks where the shard
lies, with no gather. The layout is the unsharded one (codes equal torchao's); a
parameter whose shards would cut a block keeps its state replicated (its step
gathers): choose `block_size` dividing the shard size.
"""

import abc
import functools
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from jaxtyping import Array, Float, Float32, Shaped

from ._param_sharding import where

# The 4-bit maps: two codes per byte.
_PACKED = ("dynamic4_signed", "linear4_unsigned")

# torchao clips each block's absmax at this, so an all-zero block divides by it.
_TINY_SCALE = 1e-12

# FlashOptim's companded maps (`Companded8bit`): codes are computed, not looked up
# by search; the scale is stored as float16.
_COMPANDED = ("companded8_signed", "companded8_unsigned")

# The largest finite float16, and the least float32 that rounds to float16's
# infinity (65504 + half of float16's spacing of 32 there).
_F16_MAX = 65504.0
_F16_OVERFLOW = 65520.0


def _scale_dtype(map_name: str) -> Any:
    """The dtype a map's block scales are stored in."""
    return jnp.float16 if map_name in _COMPANDED else jnp.float32


@functools.cache
def companded_table(name: str) -> np.ndarray:
    """The value each code of a companded map reads back as before its group's
    scale, by code (float32, indexed by the stored `uint8` bit pattern), computed
    as FlashOptim's dequantize kernel does in float32: signed, `t = int8(code) /
    127` and `t / (2 - |t|)` (the softsign's inverse); unsigned, `code / 255`
    (the square root of the value over the scale). A table of 256, so that XLA's
    rewrite of a division by a constant (a multiplication by its rounded
    reciprocal) cannot change the values."""
    if name == "companded8_signed":
        q = np.arange(256, dtype=np.uint8).view(np.int8).astype(np.float32)
        t = q / np.float32(127.0)
        return (t / (np.float32(2.0) - np.abs(t))).astype(np.float32)
    if name == "companded8_unsigned":
        q = np.arange(256, dtype=np.float32)
        return (q / np.float32(255.0)).astype(np.float32)
    raise ValueError(f"unknown companded map {name!r}")


def _dynamic_map(signed: bool, exponent_bits: int, total_bits: int) -> np.ndarray:
    """bitsandbytes' dynamic map (`create_dynamic_map`, as torchao 0.18 has it, with
    no zero padding): for each decade `10**-(exponent_bits-1+k)`, `k = 0..e-1`, the
    midpoints of a linear grid on [0.1, 1] with `2**(k + total_bits - 1 - e) + 1`
    points (twice as many when unsigned), scaled by the decade, mirrored to the
    negatives when `signed`, plus 0 and 1. Computed in float64 and rounded once to
    float32 (torchao rounds `torch.linspace` in float32: its table can differ from
    this one by one float32 ulp)."""
    non_sign_bits = total_bits - 1
    values = [0.0, 1.0]
    for i in range(exponent_bits):
        power = i + non_sign_bits - exponent_bits
        points = 2**power + 1 if signed else 2 ** (power + 1) + 1
        grid = np.linspace(0.1, 1.0, points, dtype=np.float64)
        means = (grid[:-1] + grid[1:]) / 2.0
        decade = 10.0 ** (-(exponent_bits - 1) + i)
        values.extend(decade * means)
        if signed:
            values.extend(-decade * means)
    assert len(values) == 2**total_bits
    return np.sort(np.asarray(values, np.float64)).astype(np.float32)


@functools.cache
def code_map(name: str) -> np.ndarray:
    """The table of a map, by name (ascending float32 values in [-1, 1])."""
    if name == "dynamic8_signed":
        return _dynamic_map(True, 7, 8)
    if name == "dynamic8_unsigned":
        return _dynamic_map(False, 7, 8)
    if name == "dynamic4_signed":
        return _dynamic_map(True, 3, 4)
    if name == "linear4_unsigned":
        # torchao's 4-bit second moment (from Li et al.'s lpmm): k/16, k = 1..16.
        # No zero: a value below 1/32 of its block's absmax is stored as 1/16 of it.
        return (np.arange(1, 17, dtype=np.float64) / 16).astype(np.float32)
    raise ValueError(f"unknown map {name!r}")


def map_resolution(name: str) -> float:
    """The largest distance from a value in the map's range ([-1, 1] signed, [0, 1]
    unsigned) to the nearest table entry: the round-trip error of a block is at most
    this times its absmax (plus float32 rounding)."""
    table = code_map(name).astype(np.float64)
    low = 0.0 if name.endswith("unsigned") else -1.0
    return float(max(np.max(np.diff(table)) / 2, table[0] - low, 1.0 - table[-1]))


def _nearest_code_search(y: Array, table: np.ndarray) -> Array:
    """The index of the nearest entry of `table` for every element of `y` (values
    in the table's range), as torchao's `quantize_8bit_with_qmap` finds it: a
    branch-free binary search (`y >= table[mid]`), then up by one when `y` is at
    least half-way to the next entry. `search_tables` gives the same codes with two
    look-ups (`_nearest_code`); this is its definition, kept for the tests."""
    n = table.shape[0]
    qmap = jnp.asarray(table)
    # uint8 throughout (n <= 256): the search's temporaries stay a byte an element.
    codes = jnp.zeros(y.shape, jnp.uint8)
    step = n // 2
    while step >= 1:
        codes = codes + jnp.where(y >= qmap[codes + step], step, 0).astype(jnp.uint8)
        step //= 2
    up = jnp.minimum(codes, n - 2) + 1
    down_value = qmap[codes]
    return jnp.where(y - down_value >= (qmap[up] - down_value) * 0.5, up, codes)


def _f32_bits(x: Any) -> int:
    return int(np.asarray(x, np.float32).view(np.uint32))


class SearchTables(NamedTuple):
    """torchao's rounding to a map, as look-ups (`search_tables`): the code of `y`
    is `base + (thresholds[base] <= y)` with `base = buckets[key(y)]` (0 for NaN),
    where `key` cuts float32 bit patterns into buckets of `2**shift` (sign,
    exponent, top mantissa bits; magnitudes under `low << shift` share the first
    bucket of their sign, those above 1 the last) in increasing order of value.
    Shared by XLA's code (`_nearest_code`) and the native kernel."""

    thresholds: np.ndarray  # float32 (n,): thresholds[c] rounds up to c + 1; NaN last
    buckets: np.ndarray  # uint8 (2 * k,): the code at each bucket's lowest value
    shift: int
    low: int


@functools.cache
def search_tables(name: str) -> SearchTables:
    """The look-up tables that give `_nearest_code_search`'s codes for the map
    `name` (torchao's search). The search returns `c + 1` for `y` in
    `[table[c], table[c + 1])` exactly when `fl(y - table[c]) >=
    fl(fl(table[c + 1] - table[c]) * 0.5)`, which is monotone in `y`: so the code
    is the number of thresholds `t_c` (the least float32 for which that holds) at
    most `y`. Buckets are made fine enough that each holds at most one threshold;
    then one comparison finishes the count."""
    table = code_map(name)
    n = table.shape[0]
    inf = np.float32(np.inf)
    thresholds = np.empty(n, np.float32)
    for c in range(n - 1):
        lo, hi = table[c], table[c + 1]
        half = np.float32(np.float32(hi - lo) * np.float32(0.5))

        def rounds_up(y: np.float32, lo=lo, half=half) -> bool:
            return bool(np.float32(y - lo) >= half)

        y = np.float32(lo + half)
        while y > lo and rounds_up(np.nextafter(y, -inf)):
            y = np.nextafter(y, -inf)
        while not rounds_up(y):
            y = np.nextafter(y, inf)
        thresholds[c] = y
    thresholds[n - 1] = np.nan  # never <= y: the last code does not round up
    finite = thresholds[:-1]
    tiny = float(np.min(np.abs(finite[finite != 0])))
    one = _f32_bits(1.0)
    for mantissa_bits in range(2, 20):
        shift = 23 - mantissa_bits
        # Strictly below the least threshold: the first bucket, which also takes
        # every smaller magnitude, then holds it above its start.
        low = (_f32_bits(tiny) - 1) >> shift
        k = (one >> shift) - low + 2  # buckets per sign; the last: above 1
        # Each bucket's magnitudes as bit patterns [start, end].
        starts = (np.arange(k, dtype=np.int64) + low) << shift
        starts[0] = 0
        ends = np.append(starts[1:] - 1, _f32_bits(inf))
        as_f32 = lambda bits: bits.astype(np.uint32).view(np.float32)  # noqa: E731
        neg_lo, neg_hi = -as_f32(ends)[::-1], -as_f32(starts)[::-1]
        pos_lo, pos_hi = as_f32(starts), as_f32(ends)
        lows = np.concatenate([neg_lo, pos_lo])
        highs = np.concatenate([neg_hi, pos_hi])
        base = np.searchsorted(finite, lows, side="right")
        top = np.searchsorted(finite, highs, side="right")
        if np.all(top - base <= 1):
            return SearchTables(thresholds, base.astype(np.uint8), shift, low)
    raise AssertionError(f"no bucket size separates the thresholds of {name}")


def _nearest_code(y: Array, table: np.ndarray, name: str) -> Array:
    """`_nearest_code_search(y, table)` (torchao's codes) by `search_tables`: two
    look-ups and a comparison instead of a search, for every element of `y`."""
    del table
    tables = search_tables(name)
    k = tables.buckets.shape[0] // 2
    bits = jax.lax.bitcast_convert_type(y, jnp.uint32)
    magnitude = (bits & 0x7FFFFFFF) >> tables.shift
    index = jnp.clip(magnitude.astype(jnp.int32) - tables.low, 0, k - 1)
    key = jnp.where(bits >> 31 == 1, k - 1 - index, k + index)
    base = jnp.asarray(tables.buckets)[key]
    up = jnp.asarray(tables.thresholds)[base.astype(jnp.int32)] <= y
    codes = base + up.astype(jnp.uint8)
    return jnp.where(jnp.isnan(y), jnp.uint8(0), codes)


def _blocks(x: Array, block_size: int) -> Array:
    """`x` flattened, zero-padded to whole blocks, as `(n_blocks, block_size)`."""
    flat = x.reshape(-1)
    pad = -flat.size % block_size
    if pad:
        flat = jnp.pad(flat, (0, pad))
    return flat.reshape(-1, block_size)


class QuantizedArray(eqx.Module):
    """One leaf of a moment, stored block-wise quantized: what a `Blockwise8bit`,
    `Blockwise4bit` or `BlockwiseFp8` moment holds at each large float parameter.

    The leaf is flattened and cut into blocks of `block_size` (the last zero-padded);
    block `b` is stored as `codes[b]` and `absmax[b]`, and element `i` of it reads

    $$x_i = \\text{map}[\\text{code}_i] \\cdot \\text{absmax}_b$$

    (fp8: $x_i = \\text{float}(\\text{code}_i) \\cdot \\text{absmax}_b$, where
    `absmax` holds the block's absmax over 448; the companded maps of
    `Companded8bit` compute the value from the code, see there, and hold `absmax`
    in float16). 4-bit codes are packed two to a byte, the first in the high
    nibble. A value that is not finite (NaN, an
    infinity) is stored as 0 and left out of its block's scale (`quantize` says
    why). fp8 codes are held as the `uint8` bit
    patterns of their `float8_e4m3fn` values, so that every checkpoint format
    stores them as they are (NumPy's `.npy`, which `eqx.tree_serialise_leaves`
    writes, has no float8 type and reads one back as raw bytes).

    **Arguments:**

    - `codes`: `uint8` `(n_blocks, block_size)` (4-bit: `block_size // 2`; fp8:
      the bits of `float8_e4m3fn` values).
    - `absmax`: float32 `(n_blocks,)` (float16 for the companded maps): each
      block's scale.
    - `shape`: the leaf's shape (static).
    - `dtype`: the dtype the values are read in (float32; static).
    - `map_name`: the map (static): `"dynamic8_signed"`, `"dynamic8_unsigned"`,
      `"dynamic4_signed"`, `"linear4_unsigned"`, `"fp8_e4m3fn"`,
      `"companded8_signed"` or `"companded8_unsigned"`.
    """

    codes: Shaped[Array, "blocks width"]
    absmax: Float[Array, " blocks"]
    shape: tuple[int, ...] = eqx.field(static=True)
    dtype: Any = eqx.field(static=True)
    map_name: str = eqx.field(static=True)

    @property
    def block_size(self) -> int:
        width = self.codes.shape[-1]
        return 2 * width if self.map_name in _PACKED else width

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def dequantize(self) -> Float32[Array, "..."]:
        """The stored values, as a float32 array of `shape`."""
        codes = self.codes
        if self.map_name in _COMPANDED:
            table = jnp.asarray(companded_table(self.map_name))
            values = table[codes.astype(jnp.int32)]
            values = values * self.absmax.astype(jnp.float32)[:, None]
            if self.map_name == "companded8_unsigned":  # stored as a square root
                values = values * values
            return values.reshape(-1)[: self.size].reshape(self.shape)
        if self.map_name == "fp8_e4m3fn":
            values = _from_fp8_bits(codes).astype(jnp.float32)
        else:
            if self.block_size != codes.shape[-1]:  # 4-bit: unpack
                codes = jnp.stack([codes >> 4, codes & 0xF], axis=-1)
                # The width spelled out: a leaf of no elements has no blocks, and
                # `-1` cannot be inferred next to a dimension of 0.
                codes = codes.reshape(codes.shape[0], self.block_size)
            values = jnp.asarray(code_map(self.map_name))[codes.astype(jnp.int32)]
        values = values * self.absmax[:, None]
        return values.reshape(-1)[: self.size].reshape(self.shape)

    def requantize(self, x: Array) -> "QuantizedArray":
        """`x` (of `shape`) stored the way this leaf is (same map and blocks)."""
        return quantize(x, self.map_name, self.block_size)


def _to_fp8_bits(codes: Array) -> Array:
    return jax.lax.bitcast_convert_type(codes, jnp.uint8)


def _from_fp8_bits(codes: Array) -> Array:
    return jax.lax.bitcast_convert_type(codes, jnp.float8_e4m3fn)


def quantize(x: Array, map_name: str, block_size: int) -> QuantizedArray:
    """`x` stored block-wise in the map `map_name` (see `QuantizedArray`); a value
    that is not finite is stored as 0 and left out of its block's scale."""
    blocks = _blocks(x.astype(jnp.float32), block_size)
    # A NaN or infinity (from one bad gradient element) has no code in a map, and
    # as its block's absmax it would make every element of the block read back NaN.
    # torchao does that (bitsandbytes too): after one NaN gradient element, the
    # next step turns the whole block NaN, 256 parameters (4-bit: 128) picked by
    # the storage's layout, not by the model. What a user needs after a NaN
    # gradient is to see it where it happened, and to keep what it did not touch:
    # so it is stored as 0 here, and the block is scaled by its finite values.
    # The parameter it reached is NaN already (a step forms its update from the
    # new moment, in float32, before storing it), so the same parameters turn NaN
    # as with float32 moments, whatever the block size, map or sharding, and the
    # rest of the block keeps its values and resolution; the native kernel does
    # the same (`_kernels/quantized.cc`, `Scale`). A quantized moment so only ever
    # holds finite numbers.
    blocks = jnp.where(jnp.isfinite(blocks), blocks, 0.0)
    if map_name in _COMPANDED:
        return _compand(blocks, tuple(x.shape), map_name)
    absmax = jnp.maximum(jnp.max(jnp.abs(blocks), axis=-1), _TINY_SCALE)
    if map_name == "fp8_e4m3fn":
        scale = absmax / float(jnp.finfo(jnp.float8_e4m3fn).max)
        codes = _to_fp8_bits((blocks / scale[:, None]).astype(jnp.float8_e4m3fn))
        return QuantizedArray(codes, scale, tuple(x.shape), jnp.float32, map_name)
    # The reciprocal, as XLA rewrites `blocks / absmax` anyway: one rounding more
    # than torch's division, spelled out so that the native kernel does the same.
    codes = _nearest_code(
        blocks * (1.0 / absmax)[:, None], code_map(map_name), map_name
    )
    if map_name in _PACKED:  # two 4-bit codes per byte
        codes = (codes[:, 0::2] << 4) | codes[:, 1::2]
    return QuantizedArray(codes, absmax, tuple(x.shape), jnp.float32, map_name)


def _compand(blocks: Array, shape: tuple[int, ...], map_name: str) -> QuantizedArray:
    """Finite float32 `blocks` in a companded map, as FlashOptim's quantize kernel
    computes them (float32 throughout): unsigned, the square root first; each
    group divided by its absmax (at least 1e-12); signed, companded by the
    softsign `2n / (1 + |n|)`; times 127 (unsigned 255), rounded as
    `floor(v + 0.5)`. The scale is the absmax rounded to float16. A group whose
    absmax would round to float16's infinity saturates (`Companded8bit` says
    why): it is divided by 65504 instead and its values clipped to [-1, 1]."""
    if map_name == "companded8_unsigned":
        # A value the optimizer declares non-negative cannot be below 0 but by
        # rounding; as the unsigned dynamic map, it reads back as 0.
        blocks = jnp.sqrt(jnp.maximum(blocks, 0.0))
    absmax = jnp.maximum(jnp.max(jnp.abs(blocks), axis=-1), _TINY_SCALE)
    over = absmax >= _F16_OVERFLOW
    divisor = jnp.where(over, jnp.float32(_F16_MAX), absmax)
    scale = jnp.where(over, _F16_MAX, absmax).astype(jnp.float16)
    # A true division, as the kernel's: XLA would rewrite a division by a
    # broadcast into a multiplication by the rounded reciprocal (one rounding
    # more, which moves a code now and then); the barrier hides the broadcast.
    divisors = jax.lax.optimization_barrier(
        jnp.broadcast_to(divisor[:, None], blocks.shape)
    )
    normalized = jnp.clip(blocks / divisors, -1.0, 1.0)
    if map_name == "companded8_signed":
        companded = 2.0 * normalized / (1.0 + jnp.abs(normalized))
        # The clip (the identity here) keeps the product from being fused with
        # the addition into one rounding (LLVM's contraction on XLA:CPU).
        scaled = jnp.clip(companded * 127.0, -127.0, 127.0)
        codes = jnp.floor(scaled + 0.5).astype(jnp.int8)
        codes = jax.lax.bitcast_convert_type(codes, jnp.uint8)
    else:
        scaled = jnp.clip(normalized * 255.0, 0.0, 255.0)
        codes = jnp.floor(scaled + 0.5).astype(jnp.uint8)
    return QuantizedArray(codes, scale, shape, jnp.float32, map_name)


def _zeros(shape: tuple[int, ...], map_name: str, block_size: int) -> QuantizedArray:
    # All codes 0 with absmax 0: exactly zero under every map (as torchao's `zeros`;
    # quantizing zeros would store the 4-bit unsigned map's 1/16 times 1e-12).
    size = int(np.prod(shape, dtype=np.int64))
    n_blocks = -(-size // block_size)
    width = block_size // 2 if map_name in _PACKED else block_size
    codes = jnp.zeros((n_blocks, width), jnp.uint8)  # fp8's bits of 0.0 too
    absmax = jnp.zeros((n_blocks,), _scale_dtype(map_name))
    return QuantizedArray(codes, absmax, shape, jnp.float32, map_name)


def _check_int(owner: str, name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{owner}: {name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{owner}: {name} must be >= {low}, got {value}")
    return int(value)


class AbstractStateStorage(eqx.Module):
    """How a moment is stored: passed where a dtype goes (`mu_dtype=`, ...).

    Leaves with at least `min_size` elements (real floating point) are stored in
    the storage's own form (`init_leaf`: a `QuantizedArray`, an
    `ErrorCorrectedArray`), which `load` reads back as float32 and `store` writes;
    smaller leaves, and complex ones, stay float32 (complex64)."""

    min_size: eqx.AbstractVar[int]

    def __check_init__(self):
        _check_int(type(self).__name__, "min_size", self.min_size, 0)

    def quantizes(self, p: Any) -> bool:
        """Whether a leaf like `p` is stored quantized."""
        return jnp.issubdtype(p.dtype, jnp.floating) and p.size >= self.min_size

    @abc.abstractmethod
    def init_leaf(self, p: Array, fill: Any, nonnegative: bool) -> Any:
        """The stored form of `fill` shaped like `p` (a leaf `quantizes` takes),
        placed like `p`. `nonnegative`: the optimizer declares this moment never
        negative."""


class AbstractBlockwiseStorage(AbstractStateStorage):
    """A storage of `QuantizedArray`s: blocks of `block_size` elements, each
    scaled by its absmax, coded in `signed_map` (`unsigned_map` for a moment
    that is never negative)."""

    block_size: eqx.AbstractVar[int]
    signed_map: eqx.AbstractClassVar[str]
    unsigned_map: eqx.AbstractClassVar[str]

    def __check_init__(self):
        owner = type(self).__name__
        _check_int(owner, "block_size", self.block_size, 1)
        if self.signed_map in _PACKED and self.block_size % 2:
            raise ValueError(
                f"{owner}: block_size must be even (two 4-bit codes per byte), got "
                f"{self.block_size}"
            )

    def init_leaf(self, p: Array, fill: Any, nonnegative: bool) -> QuantizedArray:
        """The stored form of `fill` shaped like `p` (a leaf `quantizes` takes).
        `nonnegative`: the optimizer declares this moment never negative, which
        selects the unsigned map (twice the resolution on [0, 1])."""
        name = self.unsigned_map if nonnegative else self.signed_map
        if isinstance(fill, (int, float)) and fill == 0:
            return _placed_like(_zeros(tuple(p.shape), name, self.block_size), p)
        full = jnp.full(p.shape, fill, jnp.float32)
        return _placed_like(quantize(full, name, self.block_size), p)


def _placed_like(q: QuantizedArray, p: Any) -> QuantizedArray:
    """`q` with its blocks placed like the parameter `p`'s elements: for `p` split
    over mesh axes along its leading dimension only (FSDP), each device's shard is
    a contiguous run of the flattened leaf, so when the shard's element count
    divides by the block size its blocks are whole blocks of `q` (none straddles
    two shards), and `codes`/`absmax` are split over the same axes along their
    block dimension: a step then reads and writes them where the parameter lies,
    with no gather. The block layout is the unsharded one (so codes stay those of
    torchao). Where `p` lies is its concrete sharding, or, traced (`jax.jit` or
    `jax.eval_shape` of `init`), the sharding in its type on a mesh of Explicit
    axes. On `p`'s mesh but replicated, split along another dimension, or in
    shards that would cut a block, `q` is replicated there; elsewhere (on one
    device, or traced on Auto axes) it is left as it is."""
    found = where(p)
    if found is None:
        return q
    mesh, spec, put = found
    blocks = PartitionSpec()
    if spec[0] is not None and all(d is None for d in spec[1:]):
        axes = spec[0] if isinstance(spec[0], tuple) else (spec[0],)
        shards = int(np.prod([mesh.shape[a] for a in axes]))
        if p.shape[0] % shards == 0 and (p.size // shards) % q.block_size == 0:
            blocks = PartitionSpec(spec[0])
    sharding = NamedSharding(mesh, blocks)
    return QuantizedArray(
        codes=put(q.codes, sharding),
        absmax=put(q.absmax, sharding),
        shape=q.shape,
        dtype=q.dtype,
        map_name=q.map_name,
    )


class Blockwise8bit(AbstractBlockwiseStorage):
    """Block-wise 8-bit storage for a moment (bitsandbytes; torchao's `AdamW8bit`):
    1 byte per element plus a float32 absmax per block.

    Each block of `block_size` elements of the flattened leaf is divided by its
    absmax $s_b = \\max_{i \\in b} |x_i|$ and every value is stored as the index of
    the nearest entry of the dynamic map $M$ (256 float32 values in [-1, 1]:
    `QuantizedArray`); it reads back as $M[\\text{code}_i] \\, s_b$. The map is
    signed (bitsandbytes' dynamic map: 7 decades from $10^{-6}$ to 1, a sign bit)
    unless the optimizer declares the moment non-negative (Adam's `nu`, ...), then
    unsigned (the same decades with twice the points). The round-trip error of an
    element is at most $s_b$ times half the largest gap of the map ($s_b / 142$
    signed, $s_b / 284$ unsigned).

    **Arguments:**

    - `block_size`: elements per block (torchao's and bitsandbytes' 256 by
      default). A leaf's last block is zero-padded (torchao keeps a leaf whose size
      is not a multiple of the block in full precision instead).
    - `min_size`: leaves with fewer elements stay float32 (4096, as bitsandbytes
      and torchao: small leaves cost little and their scales would cost more).

    **Example:**

    ```python
    import jax
    import jax.numpy as jnp
    import eqxopt

    w = jax.random.normal(jax.random.key(0), (64, 128))
    params = {"w": w, "b": jnp.zeros(128)}
    opt = eqxopt.AdamW(
        1e-3, mu_dtype=eqxopt.Blockwise8bit(), nu_dtype=eqxopt.Blockwise8bit()
    )
    state = opt.init(params)
    assert isinstance(state.mu["w"], eqxopt.QuantizedArray)  # 8192 elements: 8-bit
    assert state.mu["b"].dtype == jnp.float32  # under min_size: stays float32
    grads = jax.tree.map(jnp.ones_like, params)
    params, state = opt.step(grads, state, params)
    ```
    """

    block_size: int = eqx.field(default=256, static=True)
    min_size: int = eqx.field(default=4096, static=True)
    signed_map = "dynamic8_signed"
    unsigned_map = "dynamic8_unsigned"


class Blockwise4bit(AbstractBlockwiseStorage):
    """Block-wise 4-bit storage for a moment (Li et al. 2023; torchao's
    `AdamW4bit`): half a byte per element (two codes per byte) plus a float32
    absmax per block.

    As `Blockwise8bit`, with 16-entry maps: signed moments use the dynamic map with
    3 exponent bits ($\\{0, \\pm 0.0055, \\pm 0.0325, \\pm 0.0775, \\pm 0.2125,
    \\pm 0.4375, \\pm 0.6625, \\pm 0.8875, 1\\}$); non-negative ones the linear map
    $k / 16$, $k = 1..16$, which has no zero (a value under $s_b / 32$ reads back
    as $s_b / 16$; torchao and Li et al. use it for Adam's second moment). Error
    bound: $0.1125 \\, s_b$ signed, $s_b / 16$ unsigned.

    **Arguments:**

    - `block_size`: elements per block (even; torchao's 128 by default).
    - `min_size`: leaves with fewer elements stay float32 (4096, as torchao).
    """

    block_size: int = eqx.field(default=128, static=True)
    min_size: int = eqx.field(default=4096, static=True)
    signed_map = "dynamic4_signed"
    unsigned_map = "linear4_unsigned"


class BlockwiseFp8(AbstractBlockwiseStorage):
    """Block-wise scaled fp8 storage for a moment (torchao's `AdamWFp8`): one
    `float8_e4m3fn` per element plus a float32 scale per block.

    Each block is divided by $s_b = \\max_{i \\in b} |x_i| / 448$ (448: the largest
    e4m3 value) and cast to `float8_e4m3fn` (round to nearest); it reads back as
    $\\text{float}(\\text{code}_i) \\, s_b$. The relative error of an element is at
    most $2^{-4}$ while it stays above e4m3's normal range ($2^{-6} s_b$); a plain
    `nu_dtype=jnp.float8_e4m3fn` has no scale, so a second moment below $2^{-10}$
    rounds to 0 (and is refused).

    **Arguments:**

    - `block_size`: elements per block (torchao's 256 by default).
    - `min_size`: leaves with fewer elements stay float32 (4096, as torchao).
    """

    block_size: int = eqx.field(default=256, static=True)
    min_size: int = eqx.field(default=4096, static=True)
    signed_map = "fp8_e4m3fn"
    unsigned_map = "fp8_e4m3fn"


class Companded8bit(AbstractBlockwiseStorage):
    r"""FlashOptim's companded 8-bit storage for a moment (Databricks, arXiv
    2602.23349): 1 byte per element plus a float16 scale per group of 32, so
    $1 + 2/32$ bytes per element.

    Each group $b$ of `block_size` elements of the flattened leaf is divided by
    its absmax $s_b = \max(\max_{i \in b} |x_i|, 10^{-12})$. A signed moment is
    then companded by the softsign, finer near zero, and stored as an int8:

    $$q_i = \left\lfloor 127 \, \frac{2 n_i}{1 + |n_i|} + \tfrac12 \right\rfloor,
    \qquad n_i = x_i / s_b,$$

    read back as $\frac{t}{2 - |t|} \, \hat s_b$ with $t = q_i / 127$ and
    $\hat s_b$ the float16 rounding of $s_b$. A moment the optimizer declares
    non-negative (Adam's `nu`, ...) is stored by its square root, with no
    softsign, as a uint8 $q_i = \lfloor 255 \sqrt{x_i} / s_b + \frac12 \rfloor$
    ($s_b$ the absmax of the square roots) and read back as
    $(q_i / 255 \cdot \hat s_b)^2$. All in float32, as FlashOptim's kernels
    (`quantize`, `dequantize`); the codes are kept as `uint8` (the int8's bits
    for a signed moment) in a `QuantizedArray` whose `absmax` is float16. The
    round-trip error of an element is at most $\hat s_b / 127$ signed
    ($\hat s_b / 508$ near zero, where the softsign is steepest), and
    $\hat s_b / 510$ in the square root unsigned, plus the scale's rounding.

    The float16 scale limits the range: its relative rounding is $2^{-11}$ for
    $s_b \geq 2^{-14} \approx 6.1 \times 10^{-5}$; below that it is a subnormal
    (steps of $2^{-24}$), and a group whose $s_b$ is under $2^{-25} \approx 3
    \times 10^{-8}$ reads back as zeros (for a non-negative moment $s_b$ is a
    square root: values under about $9 \times 10^{-16}$). FlashOptim does the
    same. Above, a group whose $s_b$ would round to float16's infinity (from
    65520 on: a signed moment beyond that, or a non-negative one beyond about
    $4.3 \times 10^9$) saturates, which FlashOptim does not (its scale turns
    infinite and the group reads back infinite or NaN): its scale is 65504 and
    its values are clipped to $\pm 65504$ ($65504^2$ non-negative), the others
    in the group keeping their codes on that scale. Every other group is stored
    bit for bit as FlashOptim's kernels store it (codes and scale). Not finite
    values are stored as 0 and left out of their group's scale, as in the other
    storages (`quantize`). In a donated step on the CPU, the native kernels
    read and write this storage in their one pass over the leaf, with XLA's
    codes and scales bit for bit.

    **Arguments:**

    - `block_size`: elements per group (FlashOptim's 32 by default). A leaf's
      last group is zero-padded, as FlashOptim's kernels pad it.
    - `min_size`: leaves with fewer elements stay float32 (4096, as the other
      storages; FlashOptim quantizes every leaf on a GPU).

    **Example:**

    ```python
    import jax
    import jax.numpy as jnp
    import eqxopt

    w = jax.random.normal(jax.random.key(0), (64, 128))
    params = {"w": w, "b": jnp.zeros(128)}
    q = eqxopt.Companded8bit()
    opt = eqxopt.AdamW(1e-3, mu_dtype=q, nu_dtype=q)
    state = opt.init(params)
    mu = state.mu["w"]  # 8192 elements: 256 groups of 32
    assert mu.codes.shape == (256, 32) and mu.absmax.dtype == jnp.float16
    assert state.mu["b"].dtype == jnp.float32  # under min_size: stays float32
    grads = jax.tree.map(jnp.ones_like, params)
    params, state = opt.step(grads, state, params)
    ```

    **Reference:** FlashOptim (github.com/databricks/flashoptim),
    `flashoptim/optimizers.py`: `quantize`, `dequantize` and their Triton
    kernels, `FlashAdam._quantized_state_spec`.
    """

    block_size: int = eqx.field(default=32, static=True)
    min_size: int = eqx.field(default=4096, static=True)
    signed_map = "companded8_signed"
    unsigned_map = "companded8_unsigned"


def is_quantized(x: Any) -> bool:
    """Whether `x` is a moment leaf in a storage's own form (`QuantizedArray`,
    `ErrorCorrectedArray`), which `dequantize` reads and `requantize` writes."""
    return isinstance(x, (QuantizedArray, ErrorCorrectedArray))


def load(stored: Any, dtype: Any) -> Array:
    """A moment leaf as the rule sees it: in `dtype` (the compute dtype), or in its
    real counterpart for a real moment of a complex leaf (a statistic of
    magnitudes, such as Adam-mini's per-block mean square)."""
    value = stored.dequantize() if is_quantized(stored) else stored
    if not jnp.iscomplexobj(value):
        dtype = jnp.finfo(dtype).dtype
    return value.astype(dtype)


def store(value: Array, stored: Any) -> Any:
    """The new value of a moment leaf, in the form the old one is stored in."""
    if is_quantized(stored):
        return stored.requantize(value)
    return value.astype(stored.dtype)


# Per low-precision dtype: its mantissa bits and exponent bias (for its ULP).
_ULP_LAYOUT = {jnp.dtype(jnp.bfloat16): (7, 127), jnp.dtype(jnp.float16): (10, 15)}

# The int8 residual's largest value, which stands for half a ULP.
RESIDUAL_MAX = 127.0


def log2_half_ulp(p: Array) -> Array:
    """log2 of half the spacing of `p`'s dtype (bf16 or float16) at `p`, as
    float32, read from the exponent bits as heavyball's `_log_ulp` (subnormals:
    the smallest spacing)."""
    mantissa, bias = _ULP_LAYOUT[jnp.dtype(p.dtype)]
    bits = jax.lax.bitcast_convert_type(p, jnp.uint16).astype(jnp.int32)
    exponent = (bits & 0x7FFF) >> mantissa
    log_ulp = jnp.where(
        exponent == 0, 1 - bias - mantissa, exponent - (bias + mantissa)
    )
    return (log_ulp - 1).astype(jnp.float32)


def _exp2(k: Array) -> Array:
    """`2**k` for float32 integers `k` in float32's normal range, exactly: from
    the exponent bits (XLA's `exp2` is an approximation, off in the last bits of
    some powers of two)."""
    biased = (k.astype(jnp.int32) + 127) << 23
    return jax.lax.bitcast_convert_type(biased, jnp.float32)


def _times_exp2(x: Array, log_scale: Array) -> Array:
    """`x * 2**log_scale` (`log_scale` a float32 integer) in two factors, so
    neither overflows (heavyball's `_scale_by_exp2`)."""
    half = jnp.floor(log_scale / 2.0)
    return (x * _exp2(half)) * _exp2(log_scale - half)


# 1/127 rounded to float32: the residual's unit, as a product (XLA rewrites a
# division by a constant into one anyway; spelled out, the native kernels
# compute the same).
_RESIDUAL_UNIT = np.float32(1.0) / np.float32(RESIDUAL_MAX)
_UNFUSED = 2.0**121


def decode_residual(p: Array, residual: Array) -> Array:
    """The float32 value that low-precision `p` with its int8 `residual` holds:
    `p + residual / 127 * (half p's ULP)`."""
    scaled = residual.astype(jnp.float32) * _RESIDUAL_UNIT
    correction = _times_exp2(scaled, log2_half_ulp(p))
    # The identity (the correction is at most 2**119): it keeps the product from
    # being fused with the addition into one rounding, which would keep a
    # correction that separate operations flush to zero (below float32's normal
    # range, for values under about 1e-33).
    correction = jnp.clip(correction, -_UNFUSED, _UNFUSED)
    return p.astype(jnp.float32) + correction


def encode_residual(x: Array, p: Array, noise: Any) -> Array:
    """The int8 residual of float32 `x` stored as `p`: `x - p` in units of half
    `p`'s ULP over 127, clipped to `[-127, 127]` and rounded down after adding
    `noise` (uniform in `[0, 1)`: stochastic rounding; 1/2: to nearest).
    Non-finite differences (infinite or NaN values) give 0."""
    e = x - p.astype(jnp.float32)
    # Clipped after the product (the same numbers as before it), so that the
    # product is never fused with the addition into one rounding (LLVM's
    # contraction on XLA:CPU).
    scaled = jnp.clip(
        _times_exp2(e, -log2_half_ulp(p)) * RESIDUAL_MAX, -RESIDUAL_MAX, RESIDUAL_MAX
    )
    rounded = jnp.floor(scaled + noise)
    return jnp.where(jnp.isfinite(rounded), rounded, 0.0).astype(jnp.int8)


class ErrorCorrectedArray(eqx.Module):
    """One leaf of a moment stored as bf16 with an int8 error-correction residual:
    what an `ErrorCorrectedBf16` moment holds at each float parameter.

    It reads back (float32) as `value + residual / 127 * (half value's ULP)`.

    **Arguments:**

    - `value`: the bf16 array, shaped like the parameter.
    - `residual`: the int8 array, shaped like it.
    """

    value: Array
    residual: Array

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    @property
    def size(self) -> int:
        return int(self.value.size)

    @property
    def dtype(self) -> Any:
        """The dtype the values are read in."""
        return jnp.dtype(jnp.float32)

    def dequantize(self) -> Float32[Array, "..."]:
        """The stored values, as a float32 array."""
        return decode_residual(self.value, self.residual)

    def requantize(self, x: Array) -> "ErrorCorrectedArray":
        """`x` stored this way: rounded to nearest bf16, the residual of what that
        lost rounded to nearest."""
        return encode_bf16_residual(x)


def encode_bf16_residual(x: Array) -> ErrorCorrectedArray:
    """float32 `x` as bf16 plus its int8 residual (both rounded to nearest)."""
    x = x.astype(jnp.float32)
    value = x.astype(jnp.bfloat16)
    return ErrorCorrectedArray(value, encode_residual(x, value, 0.5))


class ErrorCorrectedBf16(AbstractStateStorage):
    r"""bf16 storage with an int8 error-correction residual for a moment
    (heavyball's `ecc="bf16+8"`; FlashOptim, arXiv 2602.23349): 3 bytes per
    element, a float32 value to within $2^{-8}$ of its bf16 step.

    A value $x$ is stored as $v = \operatorname{round}(x)$ in bf16 and
    $r = \lfloor 127 \operatorname{clip}((x - v) / \ell(v), -1, 1) + 1/2 \rfloor$
    in int8, with $\ell(v)$ half the spacing of bf16 at $v$; it reads back as
    $v + \frac{r}{127}\,\ell(v)$ (`ErrorCorrectedArray`). heavyball rounds the
    residual stochastically; a storage has no random key, so here it is rounded
    to nearest (with heavyball's noise fixed at $1/2$ the two agree). A moment
    is rewritten as a whole each step (an exponential average), so the bias of
    rounding to nearest stays within the residual's resolution rather than
    building up as it would for small steps added to a parameter
    (`ErrorCorrection` rounds stochastically for that reason).

    No scales: every real float leaf of at least `min_size` elements is stored
    this way (complex ones, and smaller ones, stay float32); the state stays
    element-wise, so it shards like the parameters. In a donated step on the
    CPU, the native kernels decode, step and encode it in one pass, with XLA's
    values and residuals bit for bit.

    **Arguments:**

    - `min_size`: leaves with fewer elements stay float32 (0 by default: all).

    **Reference:** heavyball 3.2.1, `ECCConfig` and `_ULPState` (`chainable.py`,
    `utils.py`).
    """

    min_size: int = eqx.field(default=0, static=True)

    def init_leaf(self, p: Array, fill: Any, nonnegative: bool) -> ErrorCorrectedArray:
        # `full_like` places the values like `p` (a sharded parameter gets
        # sharded state), and so does the element-wise encoding.
        return encode_bf16_residual(jnp.full_like(p, fill, dtype=jnp.float32))
