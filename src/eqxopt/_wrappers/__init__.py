"""Transforms that hold other transforms: Chain, Partition, Masked, Freeze,
MultiSteps, Lookahead, ParamEMA.
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
    EmptyState as EmptyState,
)
from ._partition import (
    Freeze as Freeze,
    Masked as Masked,
    MaskedState as MaskedState,
    Partition as Partition,
    PartitionState as PartitionState,
)
