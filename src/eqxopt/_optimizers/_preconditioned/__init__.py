"""Optimizers with structured preconditioners: Adafactor, SM3, SOAP, Shampoo,
PSGD-Kron, Muon, L-BFGS."""

from ._adafactor import (
    Adafactor as Adafactor,
    AdafactorState as AdafactorState,
)
from ._lbfgs import (
    LBFGS as LBFGS,
    LBFGSState as LBFGSState,
)
from ._muon import (
    Muon as Muon,
    MuonState as MuonState,
)
from ._psgd import (
    PSGDKron as PSGDKron,
    PSGDKronState as PSGDKronState,
)
from ._shampoo import (
    Shampoo as Shampoo,
    ShampooState as ShampooState,
)
from ._sm3 import (
    SM3 as SM3,
    SM3State as SM3State,
)
from ._soap import (
    SOAP as SOAP,
    SOAPState as SOAPState,
)
