"""Gradient transforms: clipping, non-finite handling, weight decay, noise,
centralisation, learning-rate reduction on plateau; and the states of those that
keep only their step count (`StepState`) or nothing (`EmptyState`).

- `_blocks.py`: the building blocks for `Chain` (`Identity`, `Stateless`, `Trace`,
  `ScaleByAdam`, `ScaleByRms`, `ScaleBySign`, `ScaleByLearningRate`,
  `ScaleByTrustRatio`).
- `_blocks_structured.py`: the blocks with structured state or that read the
  parameters or the loss (`ScaleByRprop`, `ScaleBySm3`, `ScaleByStddev`,
  `ScaleByFactoredRms`, `ScaleByParamBlockNorm`, `ScaleByParamBlockRms`,
  `ScaleByOptimisticGradient`, `ScaleByPolyak`, `ScaleByDistanceOverGradients`),
  on the maths of the fused optimizers in `_optimizers` where there is one.
- `_clip.py`: `ClipByValue`, `ClipByGlobalNorm`, `ClipByBlockRMS`,
  `AdaptiveGradClip`, `global_norm`.
- `_decay.py`: `AddDecayedWeights`, `DecoupledWeightDecay`, `AddNoise`, `Centralize`.
- `_finite.py`: `SkipNonFinite`, `ZeroNans`, `apply_if_finite`.
- `_plateau.py`: `ReduceOnPlateau`.
- `_state.py`: `EmptyState`, `StepState`.

Nothing is re-exported here: `eqxopt/__init__.py` imports each public name from
the module that defines it.
"""
