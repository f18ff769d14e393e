"""MuonClip (Kimi K2): Muon followed by QK-clip."""

from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
from jaxtyping import Array, Float

from ..._core._base import AbstractTransform
from ..._core._fields import ScalarOrSchedule, hyper
from ..._wrappers._qk_clip import AbstractQKClip
from ._muon import Muon


class MuonClip(AbstractQKClip):
    r"""MuonClip (Kimi Team, 2025, "Kimi K2: Open Agentic Intelligence"): `Muon`
    with its update's RMS matched to AdamW's (`consistent_rms=0.2`), followed by
    QK-clip (`QKClip`): each attention head whose largest logit `S^h_max` passed
    `threshold` has its query and key rows scaled by `sqrt(min(1, tau / S^h_max))`
    after the step.

    **Arguments:**

    - `learning_rate`: Muon's learning rate (a float, scalar array or schedule).
    - `threshold`: `tau`, the largest logit allowed, `> 0` (Kimi K2: 100).
    - `attention`: as `QKClip`'s.
    - `consistent_rms`, `**muon_options`: `Muon`'s options (`weight_decay`,
      `beta`, `adam_learning_rate`, ...).

    The state is `Muon`'s; `max_logits=` as for `QKClip`.
    """

    inner: AbstractTransform
    threshold: Float[Array, ""] = hyper(100.0, low=0.0, low_open=True, schedule=False)
    attention: Callable[[Any], Sequence[Any]] | None = eqx.field(
        default=None, static=True
    )

    def __init__(
        self,
        learning_rate: ScalarOrSchedule,
        *,
        threshold: ScalarOrSchedule = 100.0,
        attention: Callable[[Any], Sequence[Any]] | None = None,
        consistent_rms: float | None = 0.2,
        **muon_options: Any,
    ):
        self.inner = Muon(learning_rate, consistent_rms=consistent_rms, **muon_options)
        self.threshold = threshold
        self.attention = attention
