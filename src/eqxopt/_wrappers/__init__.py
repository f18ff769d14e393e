"""Transforms that hold other transforms (`AbstractWrapper`, which passes them the
keyword arguments they take): Chain, Partition, Masked, Freeze, MultiSteps,
Lookahead, ParamEMA, SWA, ConditionallyTransform, ConditionallyMask, Mechanic,
SAM, ScheduleFree, StochasticRounding, KahanSummation, ErrorCorrection,
LearningRateMultipliers, Maximize, Cautious, SkipLargeUpdates, Monitor, OffloadState,
QKClip, DiLoCo, SplitRealAndImaginary (and, among the transforms, SkipNonFinite).
"""

from ._accumulate import (
    MultiSteps as MultiSteps,
    MultiStepsState as MultiStepsState,
    skip_large_updates as skip_large_updates,
    skip_not_finite as skip_not_finite,
)
from ._averaging import (
    SWA as SWA,
    Lookahead as Lookahead,
    LookaheadState as LookaheadState,
    ParamEMA as ParamEMA,
    ParamEMAState as ParamEMAState,
    SWAState as SWAState,
)
from ._cautious import (
    Cautious as Cautious,
)
from ._chain import (
    Chain as Chain,
    ChainState as ChainState,
)
from ._complex import (
    RealImaginaryPair as RealImaginaryPair,
    SplitRealAndImaginary as SplitRealAndImaginary,
    SplitRealAndImaginaryState as SplitRealAndImaginaryState,
)
from ._conditional import (
    ConditionallyMask as ConditionallyMask,
    ConditionallyMaskState as ConditionallyMaskState,
    ConditionallyTransform as ConditionallyTransform,
    ConditionallyTransformState as ConditionallyTransformState,
)
from ._diloco import (
    DiLoCo as DiLoCo,
    DiLoCoState as DiLoCoState,
)
from ._mechanic import (
    Mechanic as Mechanic,
    MechanicState as MechanicState,
)
from ._monitor import (
    Monitor as Monitor,
    MonitorState as MonitorState,
    hyperparameters as hyperparameters,
)
from ._offload import (
    OffloadState as OffloadState,
)
from ._partition import (
    Freeze as Freeze,
    Masked as Masked,
    MaskedState as MaskedState,
    Partition as Partition,
    PartitionState as PartitionState,
)
from ._per_parameter import (
    LearningRateMultipliers as LearningRateMultipliers,
    Maximize as Maximize,
)
from ._precision import (
    ErrorCorrection as ErrorCorrection,
    ErrorCorrectionState as ErrorCorrectionState,
    KahanSummation as KahanSummation,
    KahanSummationState as KahanSummationState,
    StochasticRounding as StochasticRounding,
    StochasticRoundingState as StochasticRoundingState,
    round_stochastic_bf16 as round_stochastic_bf16,
)
from ._qk_clip import (
    MuonClip as MuonClip,
    QKClip as QKClip,
    max_attention_logits as max_attention_logits,
)
from ._sam import (
    SAM as SAM,
    SAMState as SAMState,
)
from ._schedule_free import (
    ScheduleFree as ScheduleFree,
    ScheduleFreeWrapperState as ScheduleFreeWrapperState,
)
from ._skip import (
    SkipLargeUpdates as SkipLargeUpdates,
    SkipLargeUpdatesState as SkipLargeUpdatesState,
)
from ._wrapper import (
    AbstractSingleWrapper as AbstractSingleWrapper,
    AbstractWrapper as AbstractWrapper,
)
