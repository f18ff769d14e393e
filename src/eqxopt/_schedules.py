"""Learning-rate schedules: modules called on an integer step array."""

import abc
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from beartype import beartype
from jaxtyping import Array, ArrayLike, Float, Float32, Int, jaxtyped

from ._checks import hyperparameter, is_concrete


class AbstractSchedule(eqx.Module):
    """A learning-rate (or other hyperparameter) schedule.

    Called on an integer step of shape `()` or `(K,)`, it returns float32 values of the
    same shape. It must work on a traced step: no Python `if` on the step. Every float
    value it holds is an array field, so building a schedule with other values reuses
    the compiled training step.
    """

    @abc.abstractmethod
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float32[Array, "*k"]:
        """The value at each entry of `step`."""


class Constant(AbstractSchedule):
    """The same value at every step: `f(s) = value`.

    **Arguments:**

    - `value`: the value (a float or a scalar array; may be traced).
    """

    value: Float[Array, ""]

    def __init__(self, value: Any):
        self.value = hyperparameter("value", value)

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float32[Array, "*k"]:
        return jnp.broadcast_to(self.value, jnp.shape(step)).astype(jnp.float32)


class WarmupCosine(AbstractSchedule):
    """Linear warmup from 0 to `peak_lr`, then a half cosine down to `min_lr`.

    With `W = warmup_steps`, `S = total_steps`:

    ```
    f(s) = peak_lr * s / W                                           for s < W
    f(s) = min_lr + (peak_lr - min_lr) / 2 * (1 + cos(pi * p))       for s >= W
           where p = min((s - W) / (S - W), 1)
    ```

    Equal to `optax.warmup_cosine_decay_schedule(0.0, peak_lr, W, S, min_lr)`, but
    with `peak_lr == 0` it gives zeros rather than NaN, and all four values are array
    fields: changing any of them does not recompile.

    **Arguments:**

    - `peak_lr`: the value reached at the end of warmup, `>= 0`.
    - `min_lr`: the floor after `total_steps`, `0 <= min_lr <= peak_lr`.
    - `warmup_steps`: length of the linear ramp, `>= 0`.
    - `total_steps`: the step at which the floor is reached, `> warmup_steps`.
    """

    peak_lr: Float[Array, ""]
    min_lr: Float[Array, ""]
    warmup_steps: Int[Array, ""]
    total_steps: Int[Array, ""]

    def __init__(self, peak_lr: Any, min_lr: Any, warmup_steps: Any, total_steps: Any):
        self.peak_lr = hyperparameter("peak_lr", peak_lr, low=0.0)
        self.min_lr = hyperparameter("min_lr", min_lr, low=0.0)
        self.warmup_steps = _step_count("warmup_steps", warmup_steps)
        self.total_steps = _step_count("total_steps", total_steps)
        if is_concrete(self.peak_lr) and is_concrete(self.min_lr):
            if float(self.min_lr) > float(self.peak_lr):
                raise ValueError(
                    f"min_lr must be <= peak_lr, got min_lr={float(self.min_lr)!r} "
                    f"and peak_lr={float(self.peak_lr)!r}"
                )
        if is_concrete(self.warmup_steps) and is_concrete(self.total_steps):
            if int(self.warmup_steps) >= int(self.total_steps):
                raise ValueError(
                    "warmup_steps must be < total_steps, got "
                    f"warmup_steps={int(self.warmup_steps)} and "
                    f"total_steps={int(self.total_steps)}"
                )

    @jaxtyped(typechecker=beartype)
    def __call__(self, step: Int[ArrayLike, "*k"]) -> Float32[Array, "*k"]:
        s = jnp.asarray(step).astype(jnp.float32)
        peak = self.peak_lr.astype(jnp.float32)
        floor = self.min_lr.astype(jnp.float32)
        warmup = self.warmup_steps.astype(jnp.float32)
        total = self.total_steps.astype(jnp.float32)
        # max(., 1) keeps the unselected branch finite when W == 0 or S == W.
        ramp = peak * s / jnp.maximum(warmup, 1.0)
        progress = jnp.clip((s - warmup) / jnp.maximum(total - warmup, 1.0), 0.0, 1.0)
        decay = floor + (peak - floor) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
        return jnp.where(s < warmup, ramp, decay)


def _step_count(name: str, value: Any) -> Int[Array, ""]:
    if isinstance(value, bool) or jnp.ndim(value) != 0:
        raise ValueError(f"{name} must be an integer scalar, got {value!r}")
    if not jnp.issubdtype(jnp.result_type(value), jnp.integer):
        raise TypeError(
            f"{name} must be an integer, got dtype {jnp.result_type(value)}"
        )
    if is_concrete(value) and int(np.asarray(value)) < 0:
        raise ValueError(f"{name} must be >= 0, got {int(np.asarray(value))}")
    return jnp.asarray(value, dtype=jnp.int32)


def as_schedule(name: str, value: Any) -> AbstractSchedule:
    """A schedule as given, or a `Constant` (checked to be `>= 0`) for a number."""
    if isinstance(value, AbstractSchedule):
        return value
    if callable(value):
        raise TypeError(
            f"{name} must be a float, a scalar array or an eqxopt schedule module; "
            f"got the callable {value!r}. Wrap plain functions of the step in an "
            "eqxopt.AbstractSchedule subclass so their values stay array fields"
        )
    return Constant(hyperparameter(name, value, low=0.0))
