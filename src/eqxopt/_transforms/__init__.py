"""Gradient transforms: clipping, non-finite handling, weight decay, noise,
centralisation, learning-rate reduction on plateau, differential privacy; and the
states of those that keep only their step count (`StepState`) or nothing
(`EmptyState`).

- `_blocks.py`: the building blocks for `Chain` (`Identity`, `Stateless`, `Trace`,
  `ScaleByAdam`, `ScaleByRms`, `ScaleBySign`, `ScaleByLearningRate`,
  `ScaleByTrustRatio`).
- `_clip.py`: `ClipByValue`, `ClipByGlobalNorm`, `ClipByBlockRMS`,
  `AdaptiveGradClip`, `global_norm`.
- `_decay.py`: `AddDecayedWeights`, `DecoupledWeightDecay`, `AddNoise`, `Centralize`.
- `_finite.py`: `SkipNonFinite`, `ZeroNans`, `apply_if_finite`.
- `_plateau.py`: `ReduceOnPlateau`.
- `_privacy.py`: `DifferentiallyPrivateAggregate`, `per_example_global_norm_clip`,
  `per_example_layer_norm_clip`.
- `_state.py`: `EmptyState`, `StepState`.

Nothing is re-exported here: `eqxopt/__init__.py` imports each public name from
the module that defines it.
"""
