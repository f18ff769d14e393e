"""eqxopt: optimizers, gradient transforms and schedules as checked Equinox modules."""

from ._adam import Adam as Adam, AdamState as AdamState, AdamW as AdamW
from ._base import AbstractTransform as AbstractTransform
from ._leafwise import map_leaves as map_leaves
from ._schedules import (
    AbstractSchedule as AbstractSchedule,
    Constant as Constant,
    WarmupCosine as WarmupCosine,
)
from ._sgd import SGD as SGD, SGDState as SGDState
from ._tree import apply_updates as apply_updates

__version__ = "0.1.0"
