"""`Cautious`: the masking of the cautious optimizers around any optimizer."""

from typing import Any

import jax

from .._core._base import AbstractTransform, Grads, Params, State, Updates
from .._core._tree import align_grads, cautious_mask
from ._wrapper import AbstractSingleWrapper, inner_field, leaves_of


class Cautious(AbstractSingleWrapper):
    r"""A cautious optimizer (Liang et al., 2024, "Cautious Optimizers: Improving
    Training with One Line of Code") made from any optimizer: each coordinate of
    `inner`'s update that does not descend along the current gradient is set to
    zero, and the rest are scaled up so the step keeps its size. Per leaf with
    `d` elements, for `u` the update `inner` gives and `g` the gradient:

    $$
    \phi = \begin{cases} 1 & -u\, g > 0 \\ 0 & \text{otherwise} \end{cases}
    \qquad
    u \leftarrow \frac{u\, \phi\, d}{\sum \phi + 1}
    $$

    The masking and its `+ 1` are `CAdamW`'s: `Cautious(AdamW(lr,
    weight_decay=0))` is `CAdamW(lr, weight_decay=0)`. The whole update of
    `inner` is masked, a weight decay inside it included; to leave the decay
    unmasked, as the paper does, add it after: `Chain(Cautious(Adam(lr)),
    DecoupledWeightDecay(lr, wd))` is `CAdamW(lr, weight_decay=wd)`, and
    `Chain(Cautious(Lion(lr)), DecoupledWeightDecay(lr, wd))` the paper's C-Lion.
    The state is `inner`'s. A leaf without a gradient gets no update.

    **Arguments:**

    - `inner`: the optimizer to make cautious (any eqxopt optimizer or chain
      whose updates include the learning rate).
    """

    inner: AbstractTransform = inner_field()

    def init(self, params: Params) -> State:
        return self.inner.init(params)

    def transform(
        self, grads: Grads, state: State, params: Params, **extra: Any
    ) -> tuple[Updates, State]:
        updates, state = self.run_inner(grads, state, params, extra)
        masked = [
            None if u is None or g is None else cautious_mask(u, -u, g.astype(u.dtype))
            for u, g in zip(leaves_of(updates, params), align_grads(grads, params))
        ]
        return jax.tree.structure(params).unflatten(masked), state
