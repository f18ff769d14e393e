"""Gradient accumulation inside one step: a function of a batch evaluated on
microbatches in a `lax.scan` and averaged."""

from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from ._core._tree import compute_dtype


def microbatch(
    fn: Callable[..., Any],
    num_microbatches: int,
    batch_argnums: int | Sequence[int] = 1,
) -> Callable[..., Any]:
    """`fn` evaluated on `num_microbatches` slices of its batch, one after another
    (a `jax.lax.scan`, so the activations' memory is one microbatch's), with the results
    averaged: gradient accumulation inside one step.

    For a loss that is a mean over the batch, the average of the microbatches'
    gradients is the full batch's gradient (to rounding), so
    `microbatch(eqx.filter_value_and_grad(loss), 4)(model, x, y)` gives what
    `eqx.filter_value_and_grad(loss)(model, x, y)` gives with a quarter of the
    activations' memory.

    **Arguments:**

    - `fn`: the function (such as `eqx.filter_value_and_grad(loss)`); it returns
      a pytree whose float array leaves are averaged (summed in float32 or
      wider) and integer ones summed (counts); other leaves pass through.
    - `num_microbatches`: a positive int that divides the batch size.
    - `batch_argnums`: which positional arguments are batched (an int or a
      sequence of ints; default `1`, as in `fn(model, x, y)` with `y` listed too
      when it is: pass `(1, 2)`); every array leaf of those has the batch on its
      first axis.

    **Returns:** a function with `fn`'s arguments and result.

    **Example:**

    ```python
    import jax
    import jax.numpy as jnp
    import eqxopt


    def loss(w, x, y):
        return jnp.mean((x @ w - y) ** 2)


    w = jnp.ones(3)
    x = jax.random.normal(jax.random.key(0), (8, 3))
    y = jnp.arange(8.0)
    value, grad = jax.value_and_grad(loss)(w, x, y)
    # the same, as 4 microbatches of 2 rows: x and y (arguments 1 and 2) are split
    in_four = eqxopt.microbatch(jax.value_and_grad(loss), 4, batch_argnums=(1, 2))
    value4, grad4 = in_four(w, x, y)
    assert jnp.allclose(value, value4) and jnp.allclose(grad, grad4, atol=1e-6)
    ```
    """
    if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int):
        raise TypeError(
            f"num_microbatches must be an int, got {type(num_microbatches).__name__}"
        )
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")
    argnums = (batch_argnums,) if isinstance(batch_argnums, int) else batch_argnums
    argnums = tuple(argnums)
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in argnums):
        raise TypeError(f"batch_argnums must be ints, got {batch_argnums!r}")
    k = num_microbatches

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        for i in argnums:
            if not -len(args) <= i < len(args):
                raise ValueError(
                    f"batch_argnums holds {i}, but the function got {len(args)} "
                    "positional arguments"
                )

        def split(i: int, x: Any) -> Any:
            if not eqx.is_array(x):
                return x
            if x.ndim == 0 or x.shape[0] % k:
                raise ValueError(
                    f"argument {i} has a leaf of shape {x.shape}, whose first axis "
                    f"(the batch) does not split into num_microbatches={k}"
                )
            return x.reshape(k, x.shape[0] // k, *x.shape[1:])

        batched = {i % len(args): jax.tree.map(lambda x, i=i: split(i, x), args[i])
                   for i in argnums}  # fmt: skip
        dynamic = {i: eqx.partition(b, eqx.is_array) for i, b in batched.items()}

        def call(slices: dict) -> Any:
            full = list(args)
            for i, (_, static) in dynamic.items():
                full[i] = eqx.combine(slices[i], static)
            return fn(*full, **kwargs)

        xs = {i: d for i, (d, _) in dynamic.items()}
        shapes = eqx.filter_eval_shape(call, jax.tree.map(lambda x: x[0], xs))
        out_shapes, out_static = eqx.partition(
            shapes, lambda x: isinstance(x, jax.ShapeDtypeStruct)
        )

        def wide(dtype: Any) -> Any:
            if jnp.issubdtype(dtype, jnp.inexact):
                return compute_dtype(dtype)
            return dtype

        def body(total: Any, slices: dict) -> tuple[Any, None]:
            arrays, _ = eqx.partition(call(slices), eqx.is_array)
            return jax.tree.map(lambda t, a: t + a.astype(t.dtype), total, arrays), None

        start = jax.tree.map(lambda s: jnp.zeros(s.shape, wide(s.dtype)), out_shapes)
        total, _ = jax.lax.scan(body, start, xs)
        mean = jax.tree.map(
            lambda t, s: (
                (t / k).astype(s.dtype)
                if jnp.issubdtype(s.dtype, jnp.inexact)
                else t.astype(s.dtype)
            ),
            total,
            out_shapes,
        )
        return eqx.combine(mean, out_static)

    return wrapped
