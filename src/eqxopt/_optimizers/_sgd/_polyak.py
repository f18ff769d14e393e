"""SGD with the Polyak step size, which needs the loss value."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ..._core._base import Grads, Params, Supplied, Updates, supplies
from ..._core._fields import (
    ScalarOrSchedule,
    axis_name_field,
    choice_field,
    hyper,
    learning_rate_field,
    values_at,
)
from ..._core._leafwise import AbstractEngineTransform, map_leaves
from ..._core._norms import sum_of_squares
from ..._core._shards import AxisName
from ..._core._tree import (
    align_grads,
    increment,
    is_float_leaf,
    zero_step,
)

# optax's guard against a zero gradient: jnp.finfo(float).eps.
_TINY = float(np.finfo(np.float64).eps)


def polyak_rate(
    owner: Any, h: Any, grads: Grads, params: Params, value: Any
) -> Float[Array, ""]:
    """The Polyak step size `min(gap / (|g|**2 + eps), max_learning_rate)` (0 for a
    vanishing denominator) from the loss `value`, checked, and `owner`'s `f_min`,
    `eps`, `max_learning_rate` (their values `h`), `variant` and `axis_name`.
    `PolyakSGD` and `ScaleByPolyak`."""
    name = type(owner).__name__
    if value is None:
        raise TypeError(
            f"{name} needs the loss at the current parameters: call "
            "update/step with value=loss (a scalar)"
        )
    if jnp.ndim(value) != 0:
        raise ValueError(f"value must be the scalar loss, got shape {jnp.shape(value)}")
    if not jnp.issubdtype(jnp.result_type(value), jnp.floating):
        raise TypeError(
            f"value must be a float scalar, got dtype {jnp.result_type(value)}"
        )
    floats = [
        g
        for g, p in zip(align_grads(grads, params), jax.tree.leaves(params))
        if is_float_leaf(p)
    ]
    # In the precision of the leaves' maths (float64 for float64 gradients under
    # x64), as optax takes the gap in the norm's dtype.
    sq_norm = sum_of_squares(floats, owner.axis_name, name)
    gap = jnp.asarray(value).astype(sq_norm.dtype) - h.f_min.astype(sq_norm.dtype)
    if owner.variant == "sps+":
        gap = jnp.maximum(gap, 0.0)
    denominator = sq_norm + h.eps
    return jnp.where(
        denominator <= _TINY,
        0.0,
        jnp.minimum(
            gap / jnp.where(denominator <= _TINY, 1.0, denominator),
            h.max_learning_rate,
        ),
    )


class PolyakSGDState(eqx.Module):
    """State of `PolyakSGD`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done (the `scaling` schedule is
      evaluated at it).
    """

    step: Int[Array, ""]


class PolyakSGD(AbstractEngineTransform):
    r"""SGD with the stochastic Polyak step size (Loizou et al., 2021).

    With `f` the loss at the current parameters (passed as `value=`), `|g|**2`
    the squared norm of the whole gradient tree and `s` the scaling at the
    current step:

    $$
    \begin{aligned}
    \mathrm{gap} &= \begin{cases} f - f_\mathrm{min} & \text{(\texttt{"sps"})} \\
        \max(f - f_\mathrm{min}, 0) & \text{(\texttt{"sps+"})} \end{cases} \\
    \mathrm{rate} &= \min\left(\frac{\mathrm{gap}}{\|g\|^2 + \epsilon},
        \mathrm{max\_learning\_rate}\right)
        && \text{($0$ if $\|g\|^2 + \epsilon \le 2.2 \cdot 10^{-16}$)} \\
    p &\leftarrow p - s \cdot \mathrm{rate} \cdot g
    \end{aligned}
    $$

    so a zero gradient gives no step.

    **The loss is a keyword of `update` and `step`:**

    ```python
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
    model, state = opt.step(grads, state, model, value=loss)
    ```

    `value` may be the JAX array `value_and_grad` returns or a Python number
    (`update`/`step` turn numbers into arrays, so a new loss does not recompile).
    Leaving `value` out raises a `TypeError`. Only leaves with a gradient count
    towards `|g|**2`.

    **Conventions.** This is the formula `optax.polyak_sgd` documents, and equals
    optax for `scaling=1` (its default). For other `scaling`, optax 0.2.8 computes
    `|g|**2` of the already scaled gradient, i.e. it steps `s * min(gap / (s**2
    |g|**2 + eps), max_learning_rate) * g`; eqxopt keeps `s` a plain factor on the
    step, as documented there. torch has no equivalent.

    **Arguments:**

    - `max_learning_rate`: the largest step size `rate` may take, `> 0`.
    - `scaling`: a factor on every step (a float `>= 0`, a scalar array or a
      schedule module).
    - `f_min`: a lower bound on (a guess of) the minimum of the loss; `0` for
      models that can fit the data exactly.
    - `eps`: added to `|g|**2`, `>= 0`.
    - `variant`: `"sps"` or `"sps+"` (clip a negative gap to zero; Garrigos et
      al., 2023).
    - `axis_name`: inside `jax.shard_map`, a mesh axis name or tuple of them:
      `|g|**2` covers the whole model (each leaf summed over the named axes it is
      split over), as the unsharded run. `None` (default): this device's blocks
      only. (`value` is the caller's: pass the global loss.)
    """

    reduces_over = "tree"

    reads_params = None  # the parameters are not read (`params_needed`)

    max_learning_rate: ScalarOrSchedule = hyper(1.0, low=0.0, low_open=True)
    scaling: ScalarOrSchedule = learning_rate_field(1.0)
    f_min: ScalarOrSchedule = hyper(0.0)
    eps: ScalarOrSchedule = hyper(0.0, low=0.0)
    variant: str = choice_field("sps", ("sps", "sps+"), kw_only=False)
    axis_name: AxisName = axis_name_field()

    def init(self, params: Params) -> PolyakSGDState:
        return PolyakSGDState(step=zero_step())

    keywords = supplies(value=Supplied.LOSS)  # the loss

    def run(
        self,
        grads: Grads,
        state: PolyakSGDState,
        params: Params,
        *,
        apply: bool,
        value: Any = None,
    ) -> tuple[Updates, PolyakSGDState]:
        h = values_at(self, state.step)
        scale = h.scaling * polyak_rate(self, h, grads, params, value)

        def rule(g, p):
            return (-scale * g,)

        updates, _ = map_leaves(rule, grads, params, elementwise=True, apply=apply)
        return updates, PolyakSGDState(step=increment(state.step))
