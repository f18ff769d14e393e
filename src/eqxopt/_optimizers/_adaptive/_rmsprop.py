"""RMSProp, plain or centered, with optional (Nesterov) momentum."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._fields import (
    ScalarOrSchedule,
    flag_field,
    hyper,
    learning_rate_field,
    weight_decay_field,
)
from ..._core._leafwise import AbstractLeafwiseOptimizer
from ..._core._moments import Moment, fields_of
from ..._core._tree import abs_sq, step_power


class RMSPropState(eqx.Module):
    """State of `RMSProp`.

    **Fields:**

    - `step`: int32 scalar, the number of updates done.
    - `nu`: running average of squared gradients, shaped like params (`None` at
      non-float leaves); starts at `initial_scale`.
    - `mu`: running average of gradients (`centered=True`), else `None`.
    - `momentum`: the momentum buffer of learning-rate-scaled steps (when
      `momentum` is given), else `None`.
    """

    step: Int[Array, ""]
    nu: PyTree[Float[Array, "..."] | None]
    mu: PyTree[Float[Array, "..."] | None] = None
    momentum: PyTree[Float[Array, "..."] | None] = None


class RMSProp(AbstractLeafwiseOptimizer):
    r"""RMSProp (Hinton, 2012), optionally centered (Graves, 2013) and with momentum.

    For each leaf, with `lr` the learning rate at the current step and `t = step +
    1`:

    $$
    \begin{aligned}
    g &\leftarrow g + \mathrm{weight\_decay} \cdot p && \text{(L2 penalty)} \\
    \nu &\leftarrow \mathrm{decay} \cdot \nu + (1 - \mathrm{decay})\, g^2 \\
    \mu &\leftarrow \mathrm{decay} \cdot \mu + (1 - \mathrm{decay})\, g
        && \text{(centered only)} \\
    v &= \begin{cases} \nu
        - \mu^2 & \text{centered} \\ \nu & \text{otherwise} \end{cases}
        && \text{(each divided by $1 - \mathrm{decay}^t$ if \texttt{bias\_correction})}
            \\
    s &= \mathrm{lr} \cdot g / \sqrt{v + \epsilon}
        && \text{(\texttt{eps\_in\_sqrt=True}, optax)} \\
    s &= \mathrm{lr} \cdot g / (\sqrt{v} + \epsilon)
        && \text{(\texttt{eps\_in\_sqrt=False}, torch)} \\
    b &\leftarrow \mathrm{momentum} \cdot b + s && \text{(momentum given)} \\
    p &\leftarrow p - s && \text{(no momentum)} \\
    p &\leftarrow p - b && \text{(momentum)} \\
    p &\leftarrow p - (s + \mathrm{momentum} \cdot b)
        && \text{(momentum, \texttt{nesterov=True})}
    \end{aligned}
    $$

    **Conventions.** The defaults are `optax.rmsprop`'s (`decay=0.9`, `eps=1e-8`
    inside the root) and the maths matches it in every option. `torch.optim.RMSprop`
    (`alpha` is `decay` here, default 0.99) puts `eps` outside the root: use
    `eps_in_sqrt=False` to match it. As in optax, the learning rate is applied
    before the momentum buffer, which therefore holds learning-rate-scaled steps;
    torch applies it after. The two agree for a constant learning rate and differ
    with a schedule. torch has no Nesterov RMSprop. The centered variance
    `nu - mu**2` is clipped at zero, so rounding can never take a root of a
    negative number (optax and torch would give NaN there).

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `decay`: decay of the running averages, in `[0, 1)`.
    - `eps`: added inside or outside the root (see `eps_in_sqrt`), `> 0`.
    - `initial_scale`: starting value of `nu`, `>= 0` (torch uses 0, TF1 used 1;
      a number, not a schedule).
    - `eps_in_sqrt`: where `eps` goes; `True` as optax, `False` as torch.
    - `centered`: divide by the root of the variance rather than of the second
      moment.
    - `momentum`: `None` for no momentum buffer, or the momentum in `[0, 1)`.
    - `nesterov`: use Nesterov momentum (needs `momentum`).
    - `bias_correction`: divide the running averages by `1 - decay**t` (optax's
      `bias_correction`). With `centered=True` the corrected variance of the
      first step is exactly zero, so that step is `lr * g / sqrt(eps)`: huge
      unless `eps` is large.
    - `weight_decay`: coupled L2 penalty added to the gradient first (torch's
      `weight_decay`), `>= 0`.
    """

    reads_params = None  # the parameters are not read (`params_needed`)

    learning_rate: ScalarOrSchedule = learning_rate_field()
    decay: ScalarOrSchedule = hyper(0.9, low=0.0, high=1.0, high_open=True)
    eps: ScalarOrSchedule = hyper(1e-8, low=0.0, low_open=True)
    # The state's starting value: used at `init`, so not a schedule.
    initial_scale: ScalarOrSchedule = hyper(0.0, low=0.0, schedule=False)
    eps_in_sqrt: bool = flag_field(True)
    centered: bool = flag_field(False)
    # `None` (no momentum buffer in the state) or a momentum, which may be a schedule.
    momentum: ScalarOrSchedule | None = hyper(
        None, low=0.0, high=1.0, high_open=True, optional=True, kw_only=True
    )
    nesterov: bool = flag_field(False)
    bias_correction: bool = flag_field(False)
    weight_decay: ScalarOrSchedule = weight_decay_field(0.0)

    state_type = RMSPropState
    elementwise = True

    def __check_init__(self):
        if self.nesterov and self.momentum is None:
            raise ValueError(
                "nesterov=True needs a momentum: pass momentum=0.9 (for example)"
            )

    @property
    def moments(self) -> tuple[Moment, ...]:  # pyright: ignore[reportIncompatibleVariableOverride]
        # The state's buffers depend on the options (the others are None).
        return (
            Moment("nu", nonnegative=True, fill=fields_of(RMSProp).initial_scale),
            *((Moment("mu"),) if self.centered else ()),
            *(() if self.momentum is None else (Moment("momentum"),)),
        )

    def leaf(self, h, t, g, p, nu, *rest):
        rest = list(rest)
        decay, eps = h.decay, h.eps
        correction = 1 - step_power(decay, t) if self.bias_correction else None
        g = g + h.weight_decay * p
        nu = (1 - decay) * abs_sq(g) + decay * nu
        # The order of operations is optax's, so rounding agrees too.
        var = nu if correction is None else nu / correction
        outs = []
        if self.centered:
            mu = (1 - decay) * g + decay * rest.pop(0)
            mean = mu if correction is None else mu / correction
            var = jnp.maximum(var - abs_sq(mean), 0.0)
            outs.append(mu)
        if self.eps_in_sqrt:
            s = h.learning_rate * g / jnp.sqrt(var + eps)
        else:
            s = h.learning_rate * g / (jnp.sqrt(var) + eps)
        if self.momentum is not None:
            buf = h.momentum * rest.pop(0) + s
            s = s + h.momentum * buf if self.nesterov else buf
            outs.append(buf)
        return (-s, nu, *outs)
