"""Complex parameters as pairs of real ones for an inner transform (optax's
`contrib.split_real_and_imaginary`)."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array

from .._core._base import AbstractTransform, Grads, Params, Updates
from ._wrapper import AbstractSingleWrapper, inner_field


class RealImaginaryPair(eqx.Module):
    """A complex leaf as its inner transform sees it inside
    `SplitRealAndImaginary`: two real arrays of its shape.

    **Fields:**

    - `real`: the real part.
    - `imaginary`: the imaginary part.
    """

    real: Array
    imaginary: Array


def _is_complex(x: Any) -> bool:
    return isinstance(x, jax.Array) and jnp.iscomplexobj(x)


def _split(tree: Any) -> Any:
    return jax.tree.map(
        lambda x: RealImaginaryPair(jnp.real(x), jnp.imag(x)) if _is_complex(x) else x,
        tree,
    )


def _merge(tree: Any, like: Any) -> Any:
    # `like`: the complex tree (the gradients), for each merged leaf's dtype.
    def merge(u: Any, x: Any) -> Any:
        if isinstance(u, RealImaginaryPair):
            return jax.lax.complex(u.real, u.imaginary).astype(x.dtype)
        return u

    return jax.tree.map(
        merge,
        tree,
        like,
        is_leaf=lambda x: x is None or isinstance(x, RealImaginaryPair),
    )


class SplitRealAndImaginaryState(eqx.Module):
    """State of `SplitRealAndImaginary`.

    **Fields:**

    - `inner`: the inner transform's state, for the parameters with every complex
      leaf as a `RealImaginaryPair` of real leaves.
    """

    inner: Any


class SplitRealAndImaginary(AbstractSingleWrapper):
    r"""Runs `inner` on complex leaves as pairs of real ones: each complex
    parameter and update `z = x + i y` is given to `inner` as a
    `RealImaginaryPair(x, y)` of real leaves, and `inner`'s pair of updates
    `(u_x, u_y)` becomes the complex update

    $$
    u = u_x + i\, u_y
    $$

    Real leaves pass to `inner` as they are. The same as
    `optax.contrib.split_real_and_imaginary`: for an optimizer that treats the two
    parts as separate parameters (Adam's second moment of each part, rather than
    of `|z|^2`), or one that takes real leaves only.

    **Arguments:**

    - `inner`: the transform to run on the real pairs.
    """

    reduces_over = "nothing"

    inner: AbstractTransform = inner_field()

    def init(self, params: Params) -> SplitRealAndImaginaryState:
        return SplitRealAndImaginaryState(inner=self.inner.init(_split(params)))

    def transform(
        self,
        grads: Grads,
        state: SplitRealAndImaginaryState,
        params: Params,
        **extra: Any,
    ) -> tuple[Updates, SplitRealAndImaginaryState]:
        split_params = None if params is None else _split(params)
        updates, inner_state = self.run_inner(
            _split(grads), state.inner, split_params, extra
        )
        return _merge(updates, grads), SplitRealAndImaginaryState(inner=inner_state)
