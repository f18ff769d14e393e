"""Checks of the integer options of this family (sizes, iteration counts), for
`checked_field`; each error names the argument."""

from typing import Any

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int

from ..._core._checks import is_concrete


def static_count(name: str, value: Any) -> int:
    """A Python int `>= 1` that fixes shapes or unrolled loops (a static field)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int >= 1, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def array_count(name: str, value: Any) -> Int[Array, ""]:
    """An integer `>= 1` held as an int32 scalar array, so that a new value reuses
    the compiled step (a traced value is taken as it comes)."""
    if (
        isinstance(value, bool)
        or jnp.ndim(value) != 0
        or not jnp.issubdtype(jnp.result_type(value), jnp.integer)
        or (is_concrete(value) and int(np.asarray(value)) < 1)
    ):
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return jnp.asarray(value, dtype=jnp.int32)
