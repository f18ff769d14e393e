"""Per-coordinate adaptive step sizes without Adam's bias-corrected pair:
Adagrad, Adadelta, RMSProp, Adan, Prodigy.
"""

from ._adadelta import (
    Adadelta as Adadelta,
    AdadeltaState as AdadeltaState,
)
from ._adagrad import (
    Adagrad as Adagrad,
    AdagradState as AdagradState,
)
from ._adan import (
    Adan as Adan,
    AdanState as AdanState,
)
from ._prodigy import (
    Prodigy as Prodigy,
    ProdigyState as ProdigyState,
)
from ._rmsprop import (
    RMSProp as RMSProp,
    RMSPropState as RMSPropState,
)
