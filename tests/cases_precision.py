"""Catalog cases for the low-precision wrappers (StochasticRounding,
KahanSummation). The catalog's float32 trees pass through them to the inner
optimizer; its bf16 runs exercise the rounding."""

import eqxopt
from catalog import CatalogCase

CASES = [
    CatalogCase(
        "StochasticRounding-AdamW",
        lambda **kw: eqxopt.StochasticRounding(
            eqxopt.AdamW(**{"learning_rate": 0.05, "weight_decay": 0.01, **kw}),
            key=0,
        ),
        vary=("learning_rate", 0.02),
        invalid=(("learning_rate", -1.0), ("weight_decay", -0.1)),
    ),
    CatalogCase(
        "KahanSummation-SGD-momentum",
        lambda **kw: eqxopt.KahanSummation(
            eqxopt.SGD(**{"learning_rate": 0.05, "momentum": 0.9, **kw})
        ),
        vary=("learning_rate", 0.02),
        invalid=(("learning_rate", -1.0), ("momentum", -0.5)),
    ),
]
