"""Transforms that hold other transforms (`AbstractWrapper`, which passes them the
keyword arguments they take): Chain, Partition, Masked, Freeze, MultiSteps,
Lookahead, ParamEMA (and, among the transforms, SkipNonFinite).
"""

from ._accumulate import (
    MultiSteps as MultiSteps,
    MultiStepsState as MultiStepsState,
)
from ._averaging import (
    Lookahead as Lookahead,
    LookaheadState as LookaheadState,
    ParamEMA as ParamEMA,
    ParamEMAState as ParamEMAState,
)
from ._chain import (
    Chain as Chain,
    ChainState as ChainState,
)
from ._monitor import (
    Monitor as Monitor,
    MonitorState as MonitorState,
    hyperparameters as hyperparameters,
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
from ._skip import (
    SkipLargeUpdates as SkipLargeUpdates,
    SkipLargeUpdatesState as SkipLargeUpdatesState,
)
from ._wrapper import (
    AbstractSingleWrapper as AbstractSingleWrapper,
    AbstractWrapper as AbstractWrapper,
)
