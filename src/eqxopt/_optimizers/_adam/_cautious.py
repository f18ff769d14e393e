"""C-AdamW: cautious AdamW, which drops update coordinates that disagree with the
current gradient."""

from ..._core._moments import fields_of
from ..._core._tree import cautious_mask
from ._adam_like import AbstractAdamW, adam_direction


class CAdamW(AbstractAdamW):
    r"""Cautious AdamW (C-AdamW; Liang et al., 2024, "Cautious Optimizers").

    AdamW, except that each coordinate of the Adam direction whose sign disagrees
    with the current gradient is set to zero, and the rest are scaled up so the
    step keeps its size. Per leaf (tensor) `P` with `d` elements, with `t = step + 1`
    and `lr`, `wd` the learning rate and weight decay at `step`:

    $$
    \begin{aligned}
    \mu &\leftarrow b_1 \mu + (1 - b_1)\, g \\
    \nu &\leftarrow b_2 \nu + (1 - b_2)\, g^2 \\
    u &= \frac{\mu / (1 - b_1^t)}{\sqrt{\nu / (1 - b_2^t) + \epsilon_\mathrm{root}} +
        \epsilon} \\
    \phi &= \begin{cases} 1 & u\, g > 0 \\ 0 & \text{otherwise} \end{cases} \\
    p &\leftarrow p - \mathrm{lr} \left(
        \frac{u\, \phi\, d}{\sum \phi + 1} + \mathrm{wd} \cdot p \right)
    \end{aligned}
    $$

    This is Algorithm 1 of the paper as the authors' code (`kyleliang919/C-Optim`,
    `c_adamw.py`) implements it: the paper writes `u * g >= 0`, the code `> 0`
    (coordinates with a zero product are dropped here too), and the `+ 1` keeps the
    scale finite when every coordinate is dropped (so a 1-element leaf moves half as
    far as AdamW would move it). The decay uses the parameter from before the update
    (the authors' code, derived from an older Hugging Face AdamW, decays the updated
    parameter: a difference of order `lr**2 * wd`). Neither optax nor torch.optim
    has this optimizer. `Cautious(AdamW(lr, weight_decay=wd))` is `CAdamW(lr,
    weight_decay=wd)` (the wrapper leaves AdamW's decay out of the mask too).

    **Arguments:**

    - `learning_rate`: a float `>= 0`, a scalar array, or a schedule module.
    - `b1`, `b2`, `eps`, `eps_root`: as for `Adam`.
    - `weight_decay`, `mask`: as for `AdamW`.
    - `mu_dtype`, `nu_dtype`: as for `Adam`.
    """

    # Not elementwise: the rescaling counts the agreeing coordinates per leaf.
    elementwise = False
    decoupled_decay = fields_of(AbstractAdamW).weight_decay

    def direction(self, h, g, mu, nu):
        u, mu, nu, _ = adam_direction(h, g, mu, nu)
        return cautious_mask(u, mu, g), h.learning_rate, mu, nu
