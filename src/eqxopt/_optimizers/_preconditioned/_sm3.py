"""SM3: memory-efficient adaptive steps from per-axis accumulators."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import Params
from ..._core._fields import ScalarOrSchedule, hyper, learning_rate_field
from ..._core._leafwise import AbstractLeafwiseOptimizer
from ..._core._moments import Moment
from ..._core._param_sharding import split_like
from ..._core._real import RealOnly
from ..._core._tree import (
    abs_sq,
    float_leaves_like,
    full_like_leaf,
    is_float_leaf,
    zero_step,
)

_WHY = "its accumulators take the max of squared gradients over axes"


class SM3State(eqx.Module):
    """State of `SM3`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done (for learning-rate
      schedules).
    - `accumulators`: one vector per float leaf holding the leaf's per-axis
      accumulators end to end: for a leaf of shape `(d0, d1, ...)` the `d0` values
      of axis 0, then the `d1` of axis 1, ... (length `sum(shape)`; a scalar leaf
      has one value). `None` at non-float leaves.
    - `momentum`: the moving average of the preconditioned gradients, shaped like
      params.
    """

    step: Int[Array, ""]
    accumulators: PyTree[Float[Array, " n"] | None]
    momentum: PyTree[Float[Array, "..."] | None]


def _accumulator_size(shape: tuple[int, ...]) -> int:
    return sum(shape) if len(shape) > 0 else 1


def _expanded(shape: tuple[int, ...], axis: int) -> list[int]:
    return [1] * axis + [shape[axis]] + [1] * (len(shape) - axis - 1)


def sm3_accumulators(params: Params) -> PyTree:
    """The per-axis accumulators at `init`, zeros laid out as `SM3State` says."""

    def accumulator(p):
        if not is_float_leaf(p):
            return None
        size = _accumulator_size(jnp.shape(p))
        if (size,) == jnp.shape(p):  # a vector's: shaped and placed like it
            return full_like_leaf(p)
        # Split over the devices that hold the parameter: `split_like`.
        return split_like(jnp.zeros((size,), p.dtype), p)

    return jax.tree.map(accumulator, params)


def sm3_direction(
    g: Array, a: Array, m: Array, b1: Array, b2: Array | None, eps: Array
) -> tuple[Array, Array]:
    """`(m, a)`: one leaf's new momentum (the direction) and accumulators. `b2`
    weighs the old accumulators against `g**2` as `b2 * acc + (1 - b2) * g**2`
    (`1` or `None`: `acc + g**2`, SM3's sum). `SM3` and `ScaleBySm3`."""
    shape = g.shape
    sq = abs_sq(g)
    if b2 is not None:  # optax's weights: 1 for g**2 at b2 == 1
        sq = jnp.where(b2 == 1, 1.0, 1 - b2) * sq
    if g.ndim < 2:
        floor = a.reshape(shape)
    else:
        splits = np.cumsum(shape)[:-1].tolist()
        per_axis = jnp.split(a, splits)
        floor = functools.reduce(
            jnp.minimum,
            [v.reshape(_expanded(shape, i)) for i, v in enumerate(per_axis)],
        )
    acc = floor + sq if b2 is None else b2 * floor + sq
    if g.ndim < 2:
        new_a = acc.reshape(-1)
    else:
        axes = range(g.ndim)
        new_a = jnp.concatenate(
            [
                jnp.max(acc, axis=tuple(j for j in axes if j != i), initial=0.0)
                for i in axes
            ]
        )
    u = g * jnp.where(acc > 0, jax.lax.rsqrt(acc + eps), 0.0)
    return b1 * m + (1 - b1) * u, new_a


class SM3(AbstractLeafwiseOptimizer):
    """SM3-II (Anil et al., 2019) with momentum, as `optax.sm3`.

    For a leaf of rank `>= 2`, each axis `i` keeps one accumulator per index along
    it, `a_i`; with `lr` the learning rate at `step`:

    ```
    acc = min_i a_i (broadcast along the other axes) + g**2
    a_i = max of acc over all axes but i
    u   = g / sqrt(acc + eps)            (0 where acc == 0)
    m   = momentum * m + (1 - momentum) * u
    p   = p - lr * m
    ```

    Vectors and scalars keep a full accumulator (`acc = acc + g**2`, Adagrad).
    `optax.sm3` gives the same numbers, but fails on scalar (0-d) leaves; here they
    work like one-element vectors. Real parameters only. On a mesh, a leaf split
    over mesh axes has its accumulator vector split over them too (where they
    divide its length), so each device holds `1/N` of it; a step gathers it
    where it needs each axis' values whole (within the step only).

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `momentum`: decay of the momentum average, in `[0, 1)`; `0` gives plain SM3.
    - `eps`: added to the accumulator inside the root, `>= 0`.
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule = learning_rate_field()
    momentum: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True)
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0, kw_only=True)

    real_only = RealOnly(_WHY)

    state_type = SM3State
    moments = (Moment("accumulators", nonnegative=True), Moment("momentum"))
    elementwise = False

    def init(self, params: Params) -> SM3State:
        return SM3State(
            step=zero_step(),
            accumulators=sm3_accumulators(params),
            momentum=float_leaves_like(params),
        )

    def leaf(self, h, t, g, p, a, m):
        m, new_a = sm3_direction(g, a, m, h.momentum, None, h.eps)
        return -h.learning_rate * m, new_a, m
