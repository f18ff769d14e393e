"""Blocking of a parameter into equal blocks stacked on a leading axis, shared by
Shampoo and PSGD-Kron: every axis longer than `block_size` is cut into blocks of
`block_size` (the last one zero-padded), so per-block matrices stay small and every
block has the same shape. The block axis leads, so preconditioner state can be
sharded along it (and each block's maths is batched over it)."""

import math
from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array


class Layout(NamedTuple):
    """How a parameter of `shape` is blocked: `counts[i]` blocks of `block[i]` along
    axis `i`, `blocks` blocks in all."""

    shape: tuple[int, ...]
    counts: tuple[int, ...]
    block: tuple[int, ...]

    @property
    def blocks(self) -> int:
        return math.prod(self.counts)


def layout(shape: tuple[int, ...], block_size: int | None) -> Layout:
    """The blocking of `shape` (no blocking with `block_size=None`)."""
    if block_size is None:
        return Layout(tuple(shape), (1,) * len(shape), tuple(shape))
    block = tuple(min(d, block_size) for d in shape)
    counts = tuple(-(-d // b) if b else 1 for d, b in zip(shape, block))
    return Layout(tuple(shape), counts, block)


def to_blocks(x: Array, lay: Layout) -> Array:
    """`x` (shaped `lay.shape`) as `(blocks, *block)`, padded with zeros."""
    padded = [n * b for n, b in zip(lay.counts, lay.block)]
    if any(p != d for p, d in zip(padded, lay.shape)):
        x = jnp.pad(x, [(0, p - d) for p, d in zip(padded, lay.shape)])
    k = len(lay.shape)
    x = x.reshape([s for pair in zip(lay.counts, lay.block) for s in pair])
    x = x.transpose([*range(0, 2 * k, 2), *range(1, 2 * k, 2)])
    return x.reshape((lay.blocks, *lay.block))


def from_blocks(x: Array, lay: Layout) -> Array:
    """The inverse of `to_blocks` (the padding dropped)."""
    k = len(lay.shape)
    x = x.reshape((*lay.counts, *lay.block))
    inverse = [j for i in range(k) for j in (i, k + i)]
    x = x.transpose(inverse)
    x = x.reshape([n * b for n, b in zip(lay.counts, lay.block)])
    return x[tuple(slice(0, d) for d in lay.shape)]
