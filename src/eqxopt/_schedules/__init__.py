"""Learning-rate (and hyperparameter) schedules, by kind.

- `AbstractSchedule` and `Constant` live in `.._core._schedule` (every optimizer's
  hyperparameter fields take them).
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

Nothing is re-exported here: `eqxopt/__init__.py` imports each public name from
the module that defines it.
"""
