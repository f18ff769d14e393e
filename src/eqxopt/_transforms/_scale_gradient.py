"""Scaling the gradient that flows back through a value (optax's
`scale_gradient`), with a `jax.custom_vjp`."""

from typing import Any

import equinox as eqx
import jax
from jaxtyping import PyTree

from .._core._checks import hyperparameter, is_concrete


@jax.custom_vjp
def _scaled(inputs: Any, scale: Any) -> Any:
    return inputs


def _scaled_fwd(inputs: Any, scale: Any) -> tuple[Any, Any]:
    return inputs, scale


def _scaled_bwd(scale: Any, cotangents: Any) -> tuple[Any, None]:
    # The scale's own cotangent is zero: it is a constant of the backward pass.
    return jax.tree.map(lambda g: g * scale.astype(g.dtype), cotangents), None


_scaled.defvjp(_scaled_fwd, _scaled_bwd)


def scale_gradient(inputs: PyTree, scale: Any) -> PyTree:
    r"""`inputs` unchanged in the forward pass, with the gradient flowing back
    through them multiplied by `scale`:

    $$
    f(x) = x, \qquad \frac{\partial L}{\partial x} \leftarrow
        \mathrm{scale} \cdot \frac{\partial L}{\partial f(x)}
    $$

    The same as `optax.scale_gradient`: `scale=0` is `jax.lax.stop_gradient`,
    `scale=-1` reverses the gradient (a gradient-reversal layer), a small scale
    slows one part of a model. Only float array leaves are scaled; the other
    leaves of a whole Equinox model pass through as they are.

    **Arguments:**

    - `inputs`: a pytree (arrays, an Equinox model).
    - `scale`: the gradient's factor, a number or scalar array (traced is fine).

    **Returns:** `inputs`, with the scaled backward pass.
    """
    scale = hyperparameter("scale", scale)
    floats, rest = eqx.partition(inputs, eqx.is_inexact_array)
    if is_concrete(scale) and float(scale) == 0.0:
        # as optax: no backward pass at all (an infinite cotangent gives 0, not NaN)
        return eqx.combine(jax.lax.stop_gradient(floats), rest)
    return eqx.combine(_scaled(floats, scale), rest)
