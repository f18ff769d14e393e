"""Gradient transforms: clipping, non-finite handling, weight decay, noise,
centralisation, learning-rate reduction on plateau; and the states of those that
keep only their step count (`StepState`) or nothing (`EmptyState`). The
differentially private aggregate lives with DP-SGD (`_optimizers/_sgd/_privacy.py`),
which is built on it.

- `_blocks.py`: the building blocks for `Chain` (`Identity`, `Stateless`, `Trace`,
  `ScaleByAdam`, `ScaleByRms`, `ScaleBySign`, `ScaleByLearningRate`, `EMA`,
  `ScaleByTrustRatio`, `KeepParamsNonnegative`).
- `_blocks_adaptive.py`: the adaptive blocks (`ScaleByAdamax`, `ScaleByAmsgrad`,
  `ScaleByAdadelta`, `ScaleByAdan`, `ScaleByBelief`, `ScaleByLion`,
  `ScaleByNovograd`, `ScaleByRadam`, `ScaleByRss`, `ScaleByYogi`), on the per-leaf
  maths of the fused optimizers in `_optimizers`.
- `_blocks_structured.py`: the blocks with structured state or that read the
  parameters or the loss (`ScaleByRprop`, `ScaleBySm3`, `ScaleByStddev`,
  `ScaleByFactoredRms`, `ScaleByParamBlockNorm`, `ScaleByParamBlockRms`,
  `ScaleByOptimisticGradient`, `ScaleByPolyak`, `ScaleByDistanceOverGradients`),
  on the maths of the fused optimizers in `_optimizers` where there is one.
- `_clip.py`: `ClipByValue`, `ClipByGlobalNorm`, `ClipByBlockRMS`,
  `AdaptiveGradClip`, `NormalizeByUpdateNorm`, `global_norm`.
- `_decay.py`: `AddDecayedWeights`, `DecoupledWeightDecay`, `AddNoise`, `Centralize`.
- `_finite.py`: `SkipNonFinite`, `ZeroNans`, `apply_if_finite`.
- `_linesearch.py`: `ScaleByBacktrackingLinesearch`.
- `_measure.py`: `Snapshot`, `MeasureWithEMA`.
- `_plateau.py`: `ReduceOnPlateau`.
- `_scale_gradient.py`: `scale_gradient`.
- `_state.py`: `EmptyState`, `StepState`.
- `_target.py`: `incremental_update`, `periodic_update` (target networks).

Nothing is re-exported here: `eqxopt/__init__.py` imports each public name from
the module that defines it.
"""
