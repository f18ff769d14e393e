"""Gradient descent and its sign, noise, Polyak, optimistic, resilient and
schedule-free forms: SGD, NoisySGD, PolyakSGD, OptimisticGradientDescent, Rprop,
SignSGD, Signum, Lion, ScheduleFreeSGD, ScheduleFreeAdamW.
"""

from ._noisy_sgd import (
    NoisySGD as NoisySGD,
    NoisySGDState as NoisySGDState,
)
from ._optimistic import (
    OptimisticGradientDescent as OptimisticGradientDescent,
    OptimisticGradientDescentState as OptimisticGradientDescentState,
)
from ._polyak import (
    PolyakSGD as PolyakSGD,
    PolyakSGDState as PolyakSGDState,
)
from ._rprop import (
    Rprop as Rprop,
    RpropState as RpropState,
)
from ._schedule_free import (
    ScheduleFreeAdamW as ScheduleFreeAdamW,
    ScheduleFreeSGD as ScheduleFreeSGD,
    ScheduleFreeState as ScheduleFreeState,
)
from ._sgd import (
    SGD as SGD,
    SGDState as SGDState,
)
from ._sign import (
    Lion as Lion,
    LionState as LionState,
    SignSGD as SignSGD,
    SignSGDState as SignSGDState,
    Signum as Signum,
    SignumState as SignumState,
)
