"""Gradient transforms: clipping, non-finite handling, weight decay, noise,
centralisation, learning-rate reduction on plateau; and the states of those that
keep only their step count (`StepState`) or nothing (`EmptyState`).
"""

from ._blocks import (
    AbstractBlock as AbstractBlock,
    Identity as Identity,
    ScaleByAdam as ScaleByAdam,
    ScaleByAdamState as ScaleByAdamState,
    ScaleByLearningRate as ScaleByLearningRate,
    ScaleByRms as ScaleByRms,
    ScaleByRmsState as ScaleByRmsState,
    ScaleBySign as ScaleBySign,
    ScaleByTrustRatio as ScaleByTrustRatio,
    Stateless as Stateless,
    Trace as Trace,
    TraceState as TraceState,
)
from ._clip import (
    AdaptiveGradClip as AdaptiveGradClip,
    ClipByBlockRMS as ClipByBlockRMS,
    ClipByGlobalNorm as ClipByGlobalNorm,
    ClipByValue as ClipByValue,
    GlobalNormState as GlobalNormState,
    global_norm as global_norm,
)
from ._decay import (
    AddDecayedWeights as AddDecayedWeights,
    AddNoise as AddNoise,
    AddNoiseState as AddNoiseState,
    Centralize as Centralize,
    DecoupledWeightDecay as DecoupledWeightDecay,
    DecoupledWeightDecayState as DecoupledWeightDecayState,
)
from ._finite import (
    SkipNonFinite as SkipNonFinite,
    SkipNonFiniteState as SkipNonFiniteState,
    ZeroNans as ZeroNans,
    ZeroNansState as ZeroNansState,
    apply_if_finite as apply_if_finite,
)
from ._plateau import (
    ReduceOnPlateau as ReduceOnPlateau,
    ReduceOnPlateauState as ReduceOnPlateauState,
)
from ._state import (
    EmptyState as EmptyState,
    StepState as StepState,
)
