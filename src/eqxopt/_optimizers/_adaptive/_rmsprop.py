"""RMSProp, plain or centered, with optional (Nesterov) momentum."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..._core._base import AbstractTransform, Grads, Params, Updates
from ..._core._checks import hyperparameter
from ..._core._leafwise import map_leaves
from ..._core._schedule import AbstractSchedule, as_schedule
from ..._core._tree import (
    abs_sq,
    float_leaves_like,
    increment,
    zero_step,
)


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
    mu: PyTree[Float[Array, "..."] | None]
    momentum: PyTree[Float[Array, "..."] | None]


class RMSProp(AbstractTransform):
    """RMSProp (Hinton, 2012), optionally centered (Graves, 2013) and with momentum.

    For each leaf, with `lr` the learning rate at the current step and `t = step +
    1`:

    ```
    g   = g + weight_decay * p                         (L2 penalty)
    nu  = decay * nu + (1 - decay) * g**2
    mu  = decay * mu + (1 - decay) * g                 (centered only)
    v   = nu - mu**2  if centered  else nu             (each divided by 1 - decay**t
                                                         if bias_correction)
    s   = lr * g / sqrt(v + eps)                       (eps_in_sqrt=True, optax)
    s   = lr * g / (sqrt(v) + eps)                     (eps_in_sqrt=False, torch)
    buf = momentum * buf + s                           (momentum given)
    p   = p - s                                        (no momentum)
    p   = p - buf                                      (momentum)
    p   = p - (s + momentum * buf)                     (momentum, nesterov=True)
    ```

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
    - `initial_scale`: starting value of `nu`, `>= 0` (torch uses 0, TF1 used 1).
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

    learning_rate: AbstractSchedule
    decay: Float[Array, ""]
    eps: Float[Array, ""]
    initial_scale: Float[Array, ""]
    momentum: Float[Array, ""] | None
    weight_decay: Float[Array, ""]
    eps_in_sqrt: bool = eqx.field(static=True)
    centered: bool = eqx.field(static=True)
    nesterov: bool = eqx.field(static=True)
    bias_correction: bool = eqx.field(static=True)

    def __init__(
        self,
        learning_rate: Any,
        decay: Any = 0.9,
        eps: Any = 1e-8,
        initial_scale: Any = 0.0,
        *,
        eps_in_sqrt: bool = True,
        centered: bool = False,
        momentum: Any = None,
        nesterov: bool = False,
        bias_correction: bool = False,
        weight_decay: Any = 0.0,
    ):
        self.learning_rate = as_schedule("learning_rate", learning_rate)
        self.decay = hyperparameter("decay", decay, low=0.0, high=1.0, high_open=True)
        self.eps = hyperparameter("eps", eps, low=0.0, low_open=True)
        self.initial_scale = hyperparameter("initial_scale", initial_scale, low=0.0)
        self.momentum = (
            None
            if momentum is None
            else hyperparameter("momentum", momentum, low=0.0, high=1.0, high_open=True)
        )
        self.weight_decay = hyperparameter("weight_decay", weight_decay, low=0.0)
        for name, flag in (
            ("eps_in_sqrt", eps_in_sqrt),
            ("centered", centered),
            ("nesterov", nesterov),
            ("bias_correction", bias_correction),
        ):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
        if nesterov and momentum is None:
            raise ValueError(
                "nesterov=True needs a momentum: pass momentum=0.9 (for example)"
            )
        self.eps_in_sqrt = eps_in_sqrt
        self.centered = centered
        self.nesterov = nesterov
        self.bias_correction = bias_correction

    def init(self, params: Params) -> RMSPropState:
        return RMSPropState(
            step=zero_step(),
            nu=float_leaves_like(params, fill=self.initial_scale),
            mu=float_leaves_like(params) if self.centered else None,
            momentum=float_leaves_like(params) if self.momentum is not None else None,
        )

    def transform(
        self, grads: Grads, state: RMSPropState, params: Params
    ) -> tuple[Updates, RMSPropState]:
        lr = self.learning_rate(state.step)
        decay, eps, weight_decay, momentum = (
            self.decay,
            self.eps,
            self.weight_decay,
            self.momentum,
        )
        t = increment(state.step)
        correction = 1 - decay**t if self.bias_correction else None

        def rule(g, p, nu, *rest):
            rest = list(rest)
            g = g + weight_decay * p
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
                s = lr * g / jnp.sqrt(var + eps)
            else:
                s = lr * g / (jnp.sqrt(var) + eps)
            if momentum is not None:
                buf = momentum * rest.pop(0) + s
                s = s + momentum * buf if self.nesterov else buf
                outs.append(buf)
            return (-s, nu, *outs)

        moments = [state.nu]
        if self.centered:
            moments.append(state.mu)
        if momentum is not None:
            moments.append(state.momentum)
        updates, new = map_leaves(rule, grads, params, moments, elementwise=True)
        new = list(new)
        nu = new.pop(0)
        mu = new.pop(0) if self.centered else None
        buf = new.pop(0) if momentum is not None else None
        return updates, RMSPropState(step=t, nu=nu, mu=mu, momentum=buf)
