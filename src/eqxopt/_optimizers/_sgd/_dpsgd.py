"""DP-SGD: SGD on the clipped, noised average of per-example gradients."""

from typing import Any

import equinox as eqx
from jaxtyping import Array, Float, Int, PyTree, UInt32

from ..._core._base import AbstractTransform, Grads, Params
from ..._core._fields import ScalarOrSchedule
from ._privacy import (
    DifferentiallyPrivateAggregate,
    DifferentiallyPrivateAggregateState,
)
from ._sgd import SGD, SGDState


class DPSGDState(eqx.Module):
    """State of `DPSGD`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `velocity`: the momentum buffer, shaped like params (as `SGDState`).
    - `key`: the PRNG key for the next step's noise, as raw `uint32` key data
      (as `DifferentiallyPrivateAggregateState`).
    """

    step: Int[Array, ""]
    velocity: PyTree[Float[Array, "..."] | None]
    key: UInt32[Array, "..."]


class DPSGD(AbstractTransform):
    r"""DP-SGD (Abadi et al., 2016, "Deep Learning with Differential Privacy"): SGD,
    with (Nesterov) momentum, on the clipped and noised average of per-example
    gradients. With `u` the update of `DifferentiallyPrivateAggregate` (each
    example's gradient clipped to norm `l2_norm_clip`, summed, Gaussian noise of
    standard deviation `l2_norm_clip * noise_multiplier` added, divided by the
    batch size) and `lr` the learning rate at the current step:

    $$
    \begin{aligned}
    v &\leftarrow \mathrm{momentum} \cdot v + u \\
    p &\leftarrow p - \mathrm{lr} \cdot v && \text{(nesterov=False)} \\
    p &\leftarrow p - \mathrm{lr} \cdot (u + \mathrm{momentum} \cdot v)
        && \text{(nesterov=True)}
    \end{aligned}
    $$

    It takes per-example gradients: every gradient with a leading batch axis
    before its parameter's shape, as `jax.vmap(jax.grad(loss), in_axes=(None, 0,
    0))` gives (a gradient without it is a `ValueError` naming the leaf). The
    same as `optax.contrib.dpsgd` (its argument names and order), with the same
    noise from the same seed for float32 parameters.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `l2_norm_clip`: the bound on each example's gradient norm, `>= 0`.
    - `noise_multiplier`: the noise's standard deviation relative to
      `l2_norm_clip`, `>= 0`.
    - `seed`: an integer seed or a JAX PRNG key, as for
      `DifferentiallyPrivateAggregate`.
    - `momentum`: `None` (default: no momentum) or a float in `[0, 1)`.
    - `nesterov`: Nesterov momentum (default `False`).
    """

    reads_params = None  # the parameters are not read (`params_needed`)
    per_example = True

    aggregate: DifferentiallyPrivateAggregate
    sgd: SGD

    def __init__(
        self,
        learning_rate: ScalarOrSchedule,
        l2_norm_clip: float | Float[Array, ""],
        noise_multiplier: float | Float[Array, ""],
        seed: int | Array,
        momentum: ScalarOrSchedule | None = None,
        nesterov: bool = False,
    ):
        self.aggregate = DifferentiallyPrivateAggregate(
            l2_norm_clip,
            noise_multiplier,
            seed,  # pyright: ignore[reportArgumentType]  (its converter takes it)
        )
        # No momentum is a momentum of 0: `v = u`, whatever `nesterov` says.
        momentum = 0.0 if momentum is None else momentum
        self.sgd = SGD(learning_rate, momentum, nesterov=nesterov)  # pyright: ignore[reportCallIssue]

    def init(self, params: Params) -> DPSGDState:
        sgd = self.sgd.init(params)
        key = self.aggregate.init(params).key
        return DPSGDState(step=sgd.step, velocity=sgd.velocity, key=key)

    def transform(
        self, grads: Grads, state: DPSGDState, params: Params, **extra: Any
    ) -> tuple[Any, DPSGDState]:
        return self._run("transform", grads, state, params, extra)

    def transform_step(
        self, grads: Grads, state: DPSGDState, params: Params, **extra: Any
    ) -> tuple[Params, DPSGDState]:
        return self._run("transform_step", grads, state, params, extra)

    def _run(
        self, method: str, grads: Grads, state: DPSGDState, params: Params, extra: dict
    ) -> tuple[Any, DPSGDState]:
        # `transform_step` for SGD: the engine forms the new parameters in the pass
        # that makes the updates.
        averaged, aggregate = self.aggregate.transform(
            grads, DifferentiallyPrivateAggregateState(key=state.key), params
        )
        sgd_state = SGDState(step=state.step, velocity=state.velocity)
        # SGD takes no keywords: it refuses any `extra`, naming it.
        out, sgd = getattr(self.sgd, method)(averaged, sgd_state, params, **extra)
        return out, DPSGDState(step=sgd.step, velocity=sgd.velocity, key=aggregate.key)
