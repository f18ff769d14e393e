"""Restoring an Equinox checkpoint into the shardings of a template."""

from typing import Any

import equinox as eqx
import jax
import numpy as np

from .._core._jax_api import array_type


def sharded_deserialise_filter_spec(f: Any, x: Any) -> Any:
    """A `filter_spec` for `eqx.tree_deserialise_leaves` that restores each array
    with the sharding of its leaf in `like`: split leaves split, replicated leaves
    replicated, each device given only its shard (Equinox's default reads every
    array whole onto the default device).

    ```python
    restore = eqxopt.sharded_deserialise_filter_spec
    state = eqx.tree_deserialise_leaves("state.eqx", like, filter_spec=restore)
    ```

    A leaf of `like` that is committed to its devices (a `jax.Array` placed with
    `jax.device_put` or made by `opt.init` from placed parameters) or a
    `jax.ShapeDtypeStruct` with a `sharding` is restored there, through
    `jax.make_array_from_callback`, so it works in a process that sees only some of
    the devices; every other leaf as `eqx.default_deserialise_filter_spec` does
    (an uncommitted array stays uncommitted, such as an optimizer's
    hyperparameters, which then go wherever a step needs them).

    **Arguments:**

    - `f`: the open checkpoint file, as `eqx.tree_deserialise_leaves` passes it.
    - `x`: the leaf of `like` to restore.

    **Returns:** the restored leaf.
    """
    placed = type(x) is array_type() and x.committed
    if not placed and not (
        isinstance(x, jax.ShapeDtypeStruct) and x.sharding is not None
    ):
        return eqx.default_deserialise_filter_spec(f, x)
    sharding = x.sharding
    host = np.load(f)
    dtype = np.dtype(x.dtype)
    if host.dtype != dtype and host.dtype.kind == "V":
        # NumPy writes dtypes it does not know (bfloat16, float8) as raw bytes.
        host = host.view(dtype)
    return jax.make_array_from_callback(host.shape, sharding, lambda i: host[i])
