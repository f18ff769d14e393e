"""`Cautious`: the masking of the cautious optimizers around any optimizer."""

from typing import Any

import jax

from .._core._base import AbstractTransform, Grads, Params, State, Updates
from .._core._leafwise import split_decoupled_decay
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

    The masking and its `+ 1` are `CAdamW`'s. A decoupled weight decay of `inner`
    is left out of the mask and added after, as the paper does: for an optimizer
    that declares it (`decoupled_decay`: `AdamW`, `NAdamW`, `AdamaxW`, `AMSGrad`,
    `RAdam`, `ACProp`, `AdEMAMix`, `SimplifiedAdEMAMix`, `Adan`, `Lion`, `MARS`,
    `AdamMini`, `CAdamW`), `u` above is the update without the decay, and the
    update is `u - lr * wd * p` at the leaves `inner` decays. So
    `Cautious(AdamW(lr, weight_decay=wd))` is `CAdamW(lr, weight_decay=wd)` and
    `Cautious(Lion(lr, weight_decay=wd))` the paper's C-Lion. Any other `inner`
    (a chain, an optimizer whose decay sits inside a trust ratio or is scaled by
    something besides the learning rate, such as `LAMB`, `StableAdamW` or
    `LaProp`) has its whole update masked; add the decay after to leave it alone:
    `Chain(Cautious(inner), DecoupledWeightDecay(lr, wd))`. The state is
    `inner`'s. A leaf without a gradient gets no update.

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
        self.check_keywords(extra)
        inner, decay = self.inner, None
        if (split := split_decoupled_decay(inner, grads, state, params)) is not None:
            inner, decay = split
        updates, state = inner.transform(grads, state, params, **extra)
        masked = [
            None if u is None or g is None else cautious_mask(u, -u, g.astype(u.dtype))
            for u, g in zip(leaves_of(updates, params), align_grads(grads, params))
        ]
        if decay is not None:
            masked = [u if d is None else u + d for u, d in zip(masked, decay)]
        return jax.tree.structure(params).unflatten(masked), state
