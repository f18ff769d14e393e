"""Reduce-on-plateau: scale updates down when the loss stops improving."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .._core._base import AbstractTransform, Grads, Params, Updates
from .._core._checks import hyperparameter, is_concrete
from .._core._leafwise import map_leaves
from .._core._tree import increment


class ReduceOnPlateauState(eqx.Module):
    """State of `ReduceOnPlateau` (the fields of optax's).

    **Fields:**

    - `scale`: float32 scalar, the factor the updates are multiplied by now.
    - `best_value`: float32 scalar, the best (lowest) averaged loss seen.
    - `plateau_count`: int32 scalar, evaluations without improvement.
    - `cooldown_count`: int32 scalar, evaluations left in the cooldown.
    - `count`: int32 scalar, losses accumulated into `avg_value` so far.
    - `avg_value`: float32 scalar, the mean of those losses.
    """

    scale: Float[Array, ""]
    best_value: Float[Array, ""]
    plateau_count: Int[Array, ""]
    cooldown_count: Int[Array, ""]
    count: Int[Array, ""]
    avg_value: Float[Array, ""]


def _count(name: str, value: Any, low: int) -> Int[Array, ""]:
    if (
        isinstance(value, bool)
        or jnp.ndim(value) != 0
        or not jnp.issubdtype(jnp.result_type(value), jnp.integer)
    ):
        raise TypeError(f"{name} must be an integer scalar, got {value!r}")
    if is_concrete(value) and int(np.asarray(value)) < low:
        raise ValueError(f"{name} must be >= {low}, got {int(np.asarray(value))}")
    return jnp.asarray(value, jnp.int32)


class ReduceOnPlateau(AbstractTransform):
    """Multiplies the incoming updates by a scale that drops by `factor` when the
    loss has not improved for `patience` evaluations, as
    `optax.contrib.reduce_on_plateau`. It also gives the learning-rate factor of
    `torch.optim.lr_scheduler.ReduceLROnPlateau(mode="min", threshold=rtol)`
    with torch's `patience` one less: torch reduces once the bad evaluations
    exceed `patience`, optax and eqxopt once they reach it.

    Place it after the optimizer, `Chain(Adam(lr), ReduceOnPlateau(...))`, and pass
    the loss to every `update`/`step` as `value=loss`. Every `accumulation_size`
    calls, the mean of the losses given is one evaluation:

    ```
    improved = mean < (1 - rtol) * best - atol
    best = mean if improved;  plateau = 0 if improved else plateau + 1
    if cooldown > 0:   cooldown -= 1, plateau = 0
    elif plateau >= patience:   scale = max(scale * factor, min_scale),
                                plateau = 0, cooldown = cooldown_steps
    u = scale * g
    ```

    `patience`, `cooldown` and `accumulation_size` may change between calls (a new
    `ReduceOnPlateau` with other values reuses the compiled step). Raised, the
    counts so far count towards the new values. Lowered to or below them, the next
    evaluation reduces (a plateau that has reached the new `patience`), the next
    call evaluates the mean of all the losses accumulated (`accumulation_size`),
    and a cooldown running has at most the new `cooldown` evaluations left. From
    then on it counts as a fresh `ReduceOnPlateau` with the new values would.
    `patience=0` reduces at every evaluation (optax compares with `==` and then
    reduces only at evaluations that improve).

    **Arguments:**

    - `factor`: the multiplier at each reduction, in `(0, 1)`.
    - `patience`: evaluations without improvement before a reduction, int `>= 0`.
    - `rtol`, `atol`: relative (in `[0, 1]`) and absolute (`>= 0`) improvement
      needed; not both zero.
    - `cooldown`: evaluations to wait after a reduction, int `>= 0`.
    - `accumulation_size`: calls averaged into one evaluation, int `>= 1` (use more
      than 1 when `value` is a noisy minibatch loss).
    - `min_scale`: the scale never goes below this, `>= 0`.
    """

    factor: Float[Array, ""]
    patience: Int[Array, ""]
    rtol: Float[Array, ""]
    atol: Float[Array, ""]
    cooldown: Int[Array, ""]
    accumulation_size: Int[Array, ""]
    min_scale: Float[Array, ""]

    def __init__(
        self,
        factor: Any = 0.1,
        patience: Any = 10,
        rtol: Any = 1e-4,
        atol: Any = 0.0,
        cooldown: Any = 0,
        accumulation_size: Any = 1,
        min_scale: Any = 0.0,
    ):
        self.factor = hyperparameter(
            "factor", factor, low=0.0, high=1.0, low_open=True, high_open=True
        )
        self.patience = _count("patience", patience, 0)
        self.rtol = hyperparameter("rtol", rtol, low=0.0, high=1.0)
        self.atol = hyperparameter("atol", atol, low=0.0)
        if (
            is_concrete(self.rtol)
            and is_concrete(self.atol)
            and float(self.rtol) == 0.0
            and float(self.atol) == 0.0
        ):
            raise ValueError("rtol and atol must not both be 0")
        self.cooldown = _count("cooldown", cooldown, 0)
        self.accumulation_size = _count("accumulation_size", accumulation_size, 1)
        self.min_scale = hyperparameter("min_scale", min_scale, low=0.0)

    def init(self, params: Params) -> ReduceOnPlateauState:
        return ReduceOnPlateauState(
            scale=jnp.ones((), jnp.float32),
            best_value=jnp.full((), jnp.inf, jnp.float32),
            plateau_count=jnp.zeros((), jnp.int32),
            cooldown_count=jnp.zeros((), jnp.int32),
            count=jnp.zeros((), jnp.int32),
            avg_value=jnp.zeros((), jnp.float32),
        )

    def _evaluate(self, s: ReduceOnPlateauState) -> ReduceOnPlateauState:
        improved = s.avg_value < (1 - self.rtol) * s.best_value - self.atol
        best = jnp.where(improved, s.avg_value, s.best_value)
        plateau = jnp.where(improved, 0, increment(s.plateau_count))
        # `>=` and the clamped cooldown: counts past a lowered hyperparameter act
        # now; with `==` they would never match again.
        cooldown_left = jnp.minimum(s.cooldown_count, self.cooldown)
        cooling = cooldown_left > 0
        reduce = jnp.logical_and(~cooling, plateau >= self.patience)
        scale = jnp.where(
            cooling,
            s.scale,
            jnp.maximum(
                jnp.where(reduce, s.scale * self.factor, s.scale), self.min_scale
            ),
        )
        return ReduceOnPlateauState(
            scale=scale.astype(jnp.float32),
            best_value=best.astype(jnp.float32),
            plateau_count=jnp.where(cooling | reduce, 0, plateau).astype(jnp.int32),
            cooldown_count=jnp.where(
                cooling, cooldown_left - 1, jnp.where(reduce, self.cooldown, 0)
            ).astype(jnp.int32),
            count=jnp.zeros((), jnp.int32),
            avg_value=jnp.zeros((), jnp.float32),
        )

    def transform(
        self,
        grads: Grads,
        state: ReduceOnPlateauState,
        params: Params,
        *,
        value: Any = None,
    ) -> tuple[Updates, ReduceOnPlateauState]:
        if value is None:
            raise TypeError(
                "ReduceOnPlateau needs the loss: pass value=loss to update/step"
            )
        if jnp.ndim(value) != 0:  # checked here, to say what `value` is
            raise ValueError(
                f"value (the loss) must be a scalar, got shape {jnp.shape(value)}"
            )
        count = increment(state.count)
        avg = (
            state.count.astype(jnp.float32) * state.avg_value
            + jnp.asarray(value).astype(jnp.float32)
        ) / count.astype(jnp.float32)
        new = ReduceOnPlateauState(
            scale=state.scale,
            best_value=state.best_value,
            plateau_count=state.plateau_count,
            cooldown_count=state.cooldown_count,
            count=count,
            avg_value=avg.astype(jnp.float32),
        )
        new = jax.lax.cond(
            count >= self.accumulation_size,
            lambda s: self._evaluate(s),
            lambda s: s,
            new,
        )
        scale = new.scale
        updates, _ = map_leaves(
            lambda g, p: (scale.astype(g.dtype) * g,), grads, params, elementwise=True
        )
        return updates, new
