"""Learning-rate (and hyperparameter) schedules, by kind.

- `AbstractSchedule` and `Constant` live in `.._core._schedule` (every optimizer's
  hyperparameter fields take them); re-exported here.
- `_warmup.py`: `WarmupCosine`, `WarmupConstant`, `WarmupExponentialDecay`,
  `WarmupStableDecay`.
- `_decay.py`: `Polynomial`, `Linear`, `ExponentialDecay`, `CosineDecay`,
  `StepDecay`, `MultiStepDecay`.
- `_piecewise.py`: `PiecewiseConstant`, `PiecewiseInterpolate`, `Join`.
- `_cyclic.py`: `LinearOneCycle`, `CosineOneCycle`, `Cyclic`, `SGDR`.
- `_plot.py`: `plot_schedules`, drawing schedules to a PNG (matplotlib optional).
- `_common.py`: what they share: field declarations (a schedule's values are
  numbers, its lengths step counts), checks of step lists and of values in order,
  and pieces of curves (linear warmup, exponential decay, interpolation).
"""

from .._core._schedule import (
    AbstractSchedule as AbstractSchedule,
    Constant as Constant,
)
from ._cyclic import (
    SGDR as SGDR,
    CosineOneCycle as CosineOneCycle,
    Cyclic as Cyclic,
    LinearOneCycle as LinearOneCycle,
)
from ._decay import (
    CosineDecay as CosineDecay,
    ExponentialDecay as ExponentialDecay,
    Linear as Linear,
    MultiStepDecay as MultiStepDecay,
    Polynomial as Polynomial,
    StepDecay as StepDecay,
)
from ._piecewise import (
    Join as Join,
    PiecewiseConstant as PiecewiseConstant,
    PiecewiseInterpolate as PiecewiseInterpolate,
)
from ._plot import plot_schedules as plot_schedules
from ._warmup import (
    WarmupConstant as WarmupConstant,
    WarmupCosine as WarmupCosine,
    WarmupExponentialDecay as WarmupExponentialDecay,
    WarmupStableDecay as WarmupStableDecay,
)
