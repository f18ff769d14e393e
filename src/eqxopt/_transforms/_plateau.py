"""Reduce-on-plateau: scale updates down when the loss stops improving."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from .._core import _shards
from .._core._base import AbstractTransform, Grads, Params, Supplied, Updates, supplies
from .._core._checks import is_concrete
from .._core._fields import count_field, hyper
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


class ReduceOnPlateau(AbstractTransform):
    r"""Multiplies the incoming updates by a scale that drops by `factor` when the
    loss has not improved for `patience` evaluations, as
    `optax.contrib.reduce_on_plateau`. It also gives the learning-rate factor of
    `torch.optim.lr_scheduler.ReduceLROnPlateau(mode="min", threshold=rtol)`
    with torch's `patience` one less: torch reduces once the bad evaluations
    exceed `patience`, optax and eqxopt once they reach it.

    Place it after the optimizer, `Chain(Adam(lr), ReduceOnPlateau(...))`, and pass
    the loss to every `update`/`step` as `value=loss`. Every `accumulation_size`
    calls, the mean of the losses given is one evaluation:

    $$
    \begin{aligned}
    \mathrm{improved} &= \mathrm{mean} < (1 - \mathrm{rtol}) \cdot \mathrm{best}
        - \mathrm{atol} \\
    \mathrm{best} &\leftarrow \mathrm{mean}, \quad \mathrm{plateau} \leftarrow 0
        && \text{if improved} \\
    \mathrm{plateau} &\leftarrow \mathrm{plateau} + 1 && \text{otherwise} \\
    \mathrm{cooldown} &\leftarrow \mathrm{cooldown} - 1, \quad \mathrm{plateau}
        \leftarrow 0 && \text{then, if } \mathrm{cooldown} > 0 \\
    \mathrm{scale} &\leftarrow
        \max(\mathrm{scale} \cdot \mathrm{factor}, \mathrm{min\_scale})
        && \text{else if } \mathrm{plateau} \ge \mathrm{patience}, \\
    \mathrm{plateau} &\leftarrow 0, \quad
        \mathrm{cooldown} \leftarrow \mathrm{cooldown\_steps} && \text{and then} \\
    u &= \mathrm{scale} \cdot g
    \end{aligned}
    $$

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

    reduces_over = "nothing"

    reads_params = None  # the parameters are not read (`params_needed`)

    # Not schedules: the state (optax's fields) keeps no step count to read them at.
    factor: Float[Array, ""] = hyper(
        0.1, low=0.0, high=1.0, low_open=True, high_open=True, schedule=False
    )
    patience: Int[Array, ""] = count_field(10, at_least_one=False)
    rtol: Float[Array, ""] = hyper(1e-4, low=0.0, high=1.0, schedule=False)
    atol: Float[Array, ""] = hyper(0.0, low=0.0, schedule=False)
    cooldown: Int[Array, ""] = count_field(0, at_least_one=False)
    accumulation_size: Int[Array, ""] = count_field(1)
    min_scale: Float[Array, ""] = hyper(0.0, low=0.0, schedule=False)

    keywords = supplies(value=Supplied.LOSS)

    def __check_init__(self):
        rtol, atol = self.rtol, self.atol
        if is_concrete(rtol) and is_concrete(atol) and float(rtol) == float(atol) == 0:
            raise ValueError("rtol and atol must not both be 0")

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
        new = _shards.cond(
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
