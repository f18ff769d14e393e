"""Optimizers that scale each layer's step by a norm of the layer: LAMB, LARS,
Fromage, NovoGrad.
"""

from ._fromage import (
    Fromage as Fromage,
    FromageState as FromageState,
)
from ._lamb import (
    LAMB as LAMB,
    LARS as LARS,
    LAMBState as LAMBState,
    LARSState as LARSState,
)
from ._novograd import (
    NovoGrad as NovoGrad,
    NovoGradState as NovoGradState,
)
