"""StableAdamW: AdamW with per-tensor update clipping."""

import jax.numpy as jnp

from ..._core._tree import abs_sq
from ._adam_like import AbstractAdamW, adam_direction


class StableAdamW(AbstractAdamW):
    r"""StableAdamW (Wortsman et al., 2023, "Stable and low-precision training for
    large-scale vision-language models", Algorithm 2): AdamW whose step size is cut,
    per tensor, when the gradient is large compared with the second moment (the
    AdaFactor-style update clipping that prevents loss spikes).

    Per leaf, with `t = step + 1` and `lr`, `wd` the learning rate and weight decay
    at `step`:

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, g \\
    \nu &\leftarrow b_2 \nu + (1 - b_2)\, g^2 \\
    \hat m &= \mu / (1 - b_1^t), \quad \hat v = \nu / (1 - b_2^t) \\
    \mathrm{rms} &=
        \sqrt{\operatorname{mean}\left(g^2 / \max(\hat v, \epsilon^2)\right)}
        && \text{(over the leaf)} \\
    \eta &= \mathrm{lr} / \max(1, \mathrm{rms}) \\
    p &\leftarrow p - \eta \left(
        \frac{\hat m}{\sqrt{\hat v + \epsilon_\mathrm{root}} + \epsilon}
        + \mathrm{wd} \cdot p \right)
    \end{aligned}
    $$

    The paper writes the moments with bias-corrected decays
    `b_hat = b * (1 - b**(t-1)) / (1 - b**t)`, which gives exactly `m_hat` and
    `v_hat` above. The decay is clipped with the step, as in the paper, and uses the
    parameter from before the update. Neither optax nor torch.optim has this
    optimizer.

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`, `b2`, `eps`, `eps_root`: as for `Adam`.
    - `weight_decay`, `mask`: as for `AdamW`.
    - `mu_dtype`, `nu_dtype`: as for `Adam`.
    """

    # Not elementwise: the clipping factor is a mean over each leaf.
    elementwise = False

    def direction(self, h, g, mu, nu):
        u, mu, nu, v_hat = adam_direction(h, g, mu, nu)
        rms = jnp.sqrt(jnp.mean(abs_sq(g) / jnp.maximum(v_hat, h.eps * h.eps)))
        return u, h.learning_rate / jnp.maximum(1.0, rms), mu, nu
