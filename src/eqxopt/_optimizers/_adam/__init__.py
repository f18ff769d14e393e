"""The Adam family: Adam, AdamW, NAdam(W), AMSGrad, Adamax(W), RAdam, Yogi,
AdaBelief, ADOPT, AdEMAMix, CAdamW, StableAdamW, OptimisticAdam.
"""

from ._adabelief import (
    AdaBelief as AdaBelief,
)
from ._adam import (
    Adam as Adam,
    Adamax as Adamax,
    AdamaxW as AdamaxW,
    AdamW as AdamW,
    AMSGrad as AMSGrad,
    AMSGradState as AMSGradState,
    NAdam as NAdam,
    NAdamState as NAdamState,
    NAdamW as NAdamW,
)
from ._adam_like import (
    AdamState as AdamState,
)
from ._ademamix import (
    AdEMAMix as AdEMAMix,
    AdEMAMixState as AdEMAMixState,
)
from ._adopt import (
    ADOPT as ADOPT,
)
from ._cautious import (
    CAdamW as CAdamW,
)
from ._optimistic_adam import (
    OptimisticAdam as OptimisticAdam,
    OptimisticAdamState as OptimisticAdamState,
)
from ._radam import (
    RAdam as RAdam,
)
from ._stable_adamw import (
    StableAdamW as StableAdamW,
)
from ._yogi import (
    Yogi as Yogi,
)
