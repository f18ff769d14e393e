"""PRNG keys given as options: an integer seed, a typed key or raw key data, kept as
raw `uint32` key data (an array field, so a new key does not recompile)."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array


def key_data(name: str, key: Any) -> tuple[Array, str]:
    """Raw key data and the name of its PRNG implementation, for the option `name`
    (an int seed, a 0-d integer array seed, a typed key, or raw `uint32` data)."""
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        key = jax.random.key(int(key))
    if not isinstance(key, (jax.Array, np.ndarray)):
        raise TypeError(
            f"{name} must be an integer seed or a JAX PRNG key, got "
            f"{type(key).__name__}"
        )
    if key.ndim == 0 and jnp.issubdtype(key.dtype, jnp.integer):
        key = jax.random.key(key)
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise ValueError(f"{name} must be a single key, got shape {key.shape}")
        return jax.random.key_data(key), str(jax.random.key_impl(key))
    if key.dtype != np.uint32 or key.ndim != 1:
        raise ValueError(
            f"{name} must be an integer seed, a typed key (jax.random.key) or raw "
            f"uint32 key data (jax.random.PRNGKey), got dtype {key.dtype} and "
            f"shape {key.shape}"
        )
    try:
        typed = jax.random.wrap_key_data(jnp.asarray(key))
    except (ValueError, TypeError) as err:
        raise ValueError(f"{name} is not valid raw key data: {err}") from None
    return jnp.asarray(key), str(jax.random.key_impl(typed))
