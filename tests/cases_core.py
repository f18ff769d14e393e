"""Catalog cases for the foundation optimizers: SGD, Adam, AdamW."""

import eqxopt
from catalog import CatalogCase

BAD_UNIT = (
    ("b1", 1.0),
    ("b2", 0.0),
    ("b2", 1.5),
    ("eps", 0.0),
    ("learning_rate", -1.0),
)

CASES = [
    CatalogCase(
        "SGD",
        lambda **kw: eqxopt.SGD(**{"learning_rate": 0.05, **kw}),
        vary=("learning_rate", 0.01),
        invalid=(("learning_rate", -0.1), ("momentum", 1.0), ("momentum", -0.5)),
    ),
    CatalogCase(
        "SGD-momentum",
        lambda **kw: eqxopt.SGD(**{"learning_rate": 0.05, "momentum": 0.9, **kw}),
        vary=("momentum", 0.5),
        invalid=(("momentum", 1.0),),
        tags=frozenset({"smoke"}),
    ),
    CatalogCase(
        "SGD-dampening",
        lambda **kw: eqxopt.SGD(
            **{"learning_rate": 0.05, "momentum": 0.9, "dampening": 0.3, **kw}
        ),
        vary=("dampening", 0.6),
        invalid=(("dampening", -0.1), ("dampening", 1.5)),
    ),
    CatalogCase(
        "SGD-nesterov",
        lambda **kw: eqxopt.SGD(
            **{"learning_rate": 0.05, "momentum": 0.9, "nesterov": True, **kw}
        ),
        vary=("learning_rate", 0.02),
    ),
    CatalogCase(
        "Adam",
        lambda **kw: eqxopt.Adam(**{"learning_rate": 0.05, **kw}),
        vary=("b2", 0.99),
        invalid=BAD_UNIT,
    ),
    CatalogCase(
        "AdamW",
        lambda **kw: eqxopt.AdamW(
            **{"learning_rate": 0.05, "weight_decay": 0.01, **kw}
        ),
        vary=("weight_decay", 0.1),
        invalid=(*BAD_UNIT, ("weight_decay", -0.01)),
        tags=frozenset({"smoke"}),
    ),
    CatalogCase(
        "AdamW-schedule",
        lambda **kw: eqxopt.AdamW(
            **{"learning_rate": eqxopt.WarmupCosine(0.05, 0.005, 3, 50), **kw}
        ),
        vary=("learning_rate", eqxopt.WarmupCosine(0.1, 0.0, 5, 60)),
    ),
]
