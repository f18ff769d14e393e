"""Optimizers that set their own step size, or need no tuned learning rate: DoG,
DoWG, COCOB, MADGRAD, D-Adaptation, Momo, and averaged SGD (ASGD). The ones with a
global step size compute it from whole-tree sums (`_sums.tree_sums`) and then take
an element-wise step through the shared engine.
"""

from ._asgd import (
    ASGD as ASGD,
    ASGDState as ASGDState,
)
from ._cocob import (
    COCOB as COCOB,
    COCOBState as COCOBState,
)
from ._dadapt import (
    DAdaptAdamW as DAdaptAdamW,
    DAdaptAdamWState as DAdaptAdamWState,
    DAdaptSGD as DAdaptSGD,
    DAdaptSGDState as DAdaptSGDState,
)
from ._dog import (
    DoG as DoG,
    DoGState as DoGState,
    DoWG as DoWG,
    DoWGState as DoWGState,
)
from ._madgrad import (
    MADGRAD as MADGRAD,
    MADGRADState as MADGRADState,
)
from ._momo import (
    Momo as Momo,
    MomoAdam as MomoAdam,
    MomoAdamState as MomoAdamState,
    MomoState as MomoState,
)
