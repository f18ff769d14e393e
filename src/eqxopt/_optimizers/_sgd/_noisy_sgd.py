"""SGD with annealed Gaussian gradient noise."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int, UInt32

from ..._core._base import Grads, Params, Updates
from ..._core._checks import renames
from ..._core._fields import ScalarOrSchedule, hyper, learning_rate_field, values_at
from ..._core._keys import key_data
from ..._core._leafwise import AbstractEngineTransform, map_leaves
from ..._core._tree import (
    align_grads,
    compute_dtype,
    increment,
    is_float_leaf,
    zero_step,
)


class NoisySGDState(eqx.Module):
    """State of `NoisySGD`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `key`: the PRNG key for the next step's noise, as raw `uint32` key data
      (`jax.random.key_data`); `jax.random.wrap_key_data(state.key, impl=
      opt.key_impl)` gives the typed key.
    """

    step: Int[Array, ""]
    key: UInt32[Array, "..."]


class NoisySGD(AbstractEngineTransform):
    r"""SGD with annealed Gaussian noise added to the gradient (Neelakantan et al.,
    2015).

    For each leaf, with `t = step` (0 for the first update) and `lr` the learning
    rate at `step`:

    $$
    \begin{aligned}
    \sigma^2 &= \eta / (1 + t)^\gamma && \text{(the noise variance)} \\
    p &\leftarrow p - \mathrm{lr} \cdot (g + \sigma n),
        && n \sim \mathcal{N}(0, 1) \text{ elementwise}
    \end{aligned}
    $$

    The noise comes from the key in the state: each step splits it into the next
    state's key and a sampling key, and the sampling key is split once more into
    one key per leaf of `params` (in `jax.tree.leaves` order). This is exactly what
    `optax.noisy_sgd` does, so with the same key and float32 parameters the
    results are identical; the noise is drawn in the compute dtype (float32 for
    bf16 parameters, where optax draws bf16 noise). A leaf without a gradient
    gets no noise and no update, and leaves the other leaves' noise unchanged.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `eta`: the noise variance at the first step, `>= 0`.
    - `gamma`: the decay exponent of the variance, `>= 0`.
    - `key`: an integer seed (a Python int or a 0-d integer array, as
      `optax.inject_hyperparams` passes it), or a JAX PRNG key (typed, from
      `jax.random.key`, or raw `uint32` data, from `jax.random.PRNGKey`).
      Required: there is no hidden global seed. The key is an array field, so a
      new key does not recompile.
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    # optax's spellings (`_checks.refuse_renamed`)
    renamed_arguments = renames(seed=("key",))

    learning_rate: ScalarOrSchedule = learning_rate_field()
    eta: ScalarOrSchedule = hyper(0.01, low=0.0)
    gamma: ScalarOrSchedule = hyper(0.55, low=0.0)
    key: UInt32[Array, "..."] = eqx.field(kw_only=True)
    key_impl: str = eqx.field(static=True, init=False)

    def __post_init__(self):
        # Two fields from one argument: the raw key data and its implementation.
        self.key, self.key_impl = key_data("key", self.key)

    def init(self, params: Params) -> NoisySGDState:
        # A copy: a donated step must not delete the optimizer's own key.
        return NoisySGDState(step=zero_step(), key=jnp.array(self.key, copy=True))

    def run(
        self, grads: Grads, state: NoisySGDState, params: Params, *, apply: bool
    ) -> tuple[Updates, NoisySGDState]:
        h = values_at(self, state.step)
        t = increment(state.step)
        sigma = jnp.sqrt(h.eta / t.astype(jnp.float32) ** h.gamma)
        key = jax.random.wrap_key_data(state.key, impl=self.key_impl)
        next_key, sample_key = jax.random.split(key)
        param_leaves, param_def = jax.tree.flatten(params)
        leaf_keys = jax.random.split(sample_key, len(param_leaves))
        noise = [
            None
            if g is None or not is_float_leaf(p)
            else jax.random.normal(leaf_keys[i], p.shape, compute_dtype(p.dtype))
            for i, (g, p) in enumerate(zip(align_grads(grads, params), param_leaves))
        ]

        def rule(g, p, n):
            return -h.learning_rate * (g + sigma * n), n

        updates, _ = map_leaves(
            rule,
            grads,
            params,
            (param_def.unflatten(noise),),
            elementwise=True,
            apply=apply,
        )
        return updates, NoisySGDState(step=t, key=jax.random.key_data(next_key))
