"""Learning-rate (and hyperparameter) schedules."""

from .._core._schedule import (
    AbstractSchedule as AbstractSchedule,
    Constant as Constant,
)
from ._schedules import (
    SGDR as SGDR,
    CosineDecay as CosineDecay,
    CosineOneCycle as CosineOneCycle,
    Cyclic as Cyclic,
    ExponentialDecay as ExponentialDecay,
    Join as Join,
    Linear as Linear,
    LinearOneCycle as LinearOneCycle,
    MultiStepDecay as MultiStepDecay,
    PiecewiseConstant as PiecewiseConstant,
    PiecewiseInterpolate as PiecewiseInterpolate,
    Polynomial as Polynomial,
    StepDecay as StepDecay,
    WarmupConstant as WarmupConstant,
    WarmupCosine as WarmupCosine,
    WarmupExponentialDecay as WarmupExponentialDecay,
    WarmupStableDecay as WarmupStableDecay,
)
