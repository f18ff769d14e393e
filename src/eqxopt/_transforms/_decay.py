"""Gradient transforms: weight decay (coupled and decoupled), gradient noise,
gradient centralisation."""

import abc
from typing import Any, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int, UInt32

from .._core._base import AbstractTransform, Grads, Params, Updates
from .._core._checks import renames
from .._core._fields import (
    MaskLike,
    ScalarOrSchedule,
    checked_field,
    hyper,
    learning_rate_field,
    mask_field,
    values_at,
    weight_decay_field,
)
from .._core._leafwise import map_leaves
from .._core._masks import decay_flags
from .._core._tree import (
    align_grads,
    compute_dtype,
    increment,
    is_float_leaf,
    zero_step,
)
from ._state import EmptyState, StepState

_D = TypeVar("_D", bound="AbstractWeightDecay")


class DecoupledWeightDecayState(eqx.Module):
    """State of `DecoupledWeightDecay`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done (for the learning-rate
      schedule).
    """

    step: Int[Array, ""]


class AbstractWeightDecay(AbstractTransform):
    """Adds a multiple of each masked parameter to its gradient or update,
    `u = g + c * p`, with the coefficient `c` from the hyperparameters at the step
    (`coefficient`); a subclass declares `weight_decay`, `mask` and its
    `state_type` (a module holding only `step`)."""

    reads_params = None  # the parameters are not read (`params_needed`)

    weight_decay: eqx.AbstractVar[ScalarOrSchedule]
    mask: eqx.AbstractVar[MaskLike]
    state_type: eqx.AbstractClassVar[type[StepState | DecoupledWeightDecayState]]

    @abc.abstractmethod
    def coefficient(self: _D, h: _D) -> Array:
        """`c`, from `h`, this transform at the step (`values_at`)."""

    def init(self, params: Params) -> Any:
        decay_flags(self.mask, params)  # a bad mask fails here, not mid-training
        return self.state_type(step=zero_step())

    def transform(
        self, grads: Grads, state: Any, params: Params
    ) -> tuple[Updates, Any]:
        c = self.coefficient(values_at(self, state.step))
        flags = decay_flags(self.mask, params)

        def rule(g, p, decayed):
            return (g + c * p if decayed else g,)

        updates, _ = map_leaves(rule, grads, params, elementwise=True, flags=flags)
        return updates, self.state_type(step=increment(state.step))


class AddDecayedWeights(AbstractWeightDecay):
    r"""Adds `weight_decay * p` to the gradient of every masked leaf:

    $$
    u = g + \mathrm{weight\_decay} \cdot p
    $$

    Placed before an optimizer this is L2
    regularisation (coupled decay: `Chain(AddDecayedWeights(wd), SGD(lr))` is
    `torch.optim.SGD(weight_decay=wd)`); the same as `optax.add_decayed_weights`.
    For decay decoupled from an adaptive optimizer use `DecoupledWeightDecay`.

    **Arguments:**

    - `weight_decay`: the coefficient, `>= 0`, or a schedule (read at the step).
    - `mask`: which leaves to decay: `None` (all), a tree of bools shaped like the
      parameters (or a prefix of them), or a function of the parameters returning
      one. An Equinox module is always read as a tree, never called. The mask is
      static (part of the compiled step's key), checked at `init`: reuse one
      function rather than writing a new lambda for every optimizer you build.
    """

    reduces_over = "nothing"

    weight_decay: ScalarOrSchedule = weight_decay_field(kw_only=False)
    mask: MaskLike = mask_field(kw_only=False)

    state_type = StepState

    def coefficient(self, h) -> Array:
        return h.weight_decay


class DecoupledWeightDecay(AbstractWeightDecay):
    r"""Decoupled weight decay (Loshchilov & Hutter, 2019) as a link placed after an
    optimizer, with `lr` the learning rate at the current step and `p` the
    parameter before the update:

    $$
    u \leftarrow u - \mathrm{lr} \cdot \mathrm{weight\_decay} \cdot p
    $$

    `Chain(Adam(lr), DecoupledWeightDecay(lr, wd, mask=m))` is `AdamW(lr, wd)`
    restricted to the leaves in `m`: the same as `optax.adamw(lr, weight_decay=wd,
    mask=m)` and `torch.optim.AdamW`. Pass the optimizer's own schedule as
    `learning_rate` so the decay follows it.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array or a schedule module.
    - `weight_decay`: the coefficient, `>= 0`, or a schedule (read at the step).
    - `mask`: which leaves to decay, as for `AddDecayedWeights`.
    """

    reduces_over = "nothing"

    learning_rate: ScalarOrSchedule = learning_rate_field()
    weight_decay: ScalarOrSchedule = weight_decay_field(kw_only=False)
    mask: MaskLike = mask_field(kw_only=False)

    state_type = DecoupledWeightDecayState

    def coefficient(self, h) -> Array:
        return -(h.learning_rate * h.weight_decay)


class AddNoiseState(eqx.Module):
    """State of `AddNoise`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `key`: the raw PRNG key data (`jax.random.key_data`) for the next step.
    """

    step: Int[Array, ""]
    key: UInt32[Array, "2"]


def _seed(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


class AddNoise(AbstractTransform):
    r"""Annealed Gaussian gradient noise (Neelakantan et al., 2015):

    $$
    u = g + \sqrt{\eta / (\mathrm{step} + 1)^\gamma} \cdot n,
        \qquad n \sim \mathcal{N}(0, 1)
    $$

    The same as `optax.add_noise(eta, gamma, key=seed)` with the same numbers drawn
    (leaf `i` of the parameters uses the `i`-th key split from the step's key).

    **Arguments:**

    - `eta`: the initial variance, `>= 0`.
    - `gamma`: the decay exponent of the variance, `>= 0`.
    - `seed`: an int seed for the noise.

    `eta` and `gamma` may be schedules, read at the step.
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    # optax's spellings (`_checks.refuse_renamed`)
    renamed_arguments = renames(key=("seed",))

    eta: ScalarOrSchedule = hyper(low=0.0)
    gamma: ScalarOrSchedule = hyper(0.55, low=0.0)
    seed: int = checked_field(_seed, 0, static=True, kw_only=True)

    def init(self, params: Params) -> AddNoiseState:
        return AddNoiseState(
            step=zero_step(), key=jax.random.key_data(jax.random.key(self.seed))
        )

    def transform(
        self, grads: Grads, state: AddNoiseState, params: Params
    ) -> tuple[Updates, AddNoiseState]:
        h = values_at(self, state.step)
        t = increment(state.step)
        std = jnp.sqrt(h.eta / t.astype(jnp.float32) ** h.gamma)
        next_key, sample_key = jax.random.split(jax.random.wrap_key_data(state.key))
        param_leaves, treedef = jax.tree.flatten(params)
        keys = iter(jax.random.split(sample_key, len(param_leaves)))
        updates = []
        for g, p in zip(align_grads(grads, params), param_leaves):
            key = next(keys)
            if g is None or not is_float_leaf(p):
                updates.append(None)
                continue
            g = g.astype(compute_dtype(p.dtype))
            noise = jax.random.normal(key, g.shape, g.dtype)
            updates.append(g + std.astype(g.dtype) * noise)
        return treedef.unflatten(updates), AddNoiseState(
            step=t, key=jax.random.key_data(next_key)
        )


class Centralize(AbstractTransform):
    r"""Gradient centralisation (Yong et al., 2020): every leaf with two or more
    dimensions has its mean over all axes but the first subtracted:

    $$
    u = g - \operatorname{mean}(g, \mathrm{axis} = (1, \ldots, \mathrm{ndim} - 1))
    $$

    Scalars and vectors pass unchanged. The same as `optax.centralize`. (The first
    axis is the output axis of Equinox `Linear` and `Conv` weights.)
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    def transform(
        self, grads: Grads, state: EmptyState, params: Params
    ) -> tuple[Updates, EmptyState]:
        def rule(g, p):
            if g.ndim > 1:
                return (g - g.mean(tuple(range(1, g.ndim)), keepdims=True),)
            return (g,)

        updates, _ = map_leaves(rule, grads, params, elementwise=False)
        return updates, state
