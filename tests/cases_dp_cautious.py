"""Catalog cases for ACProp, SimplifiedAdEMAMix, OptimisticAdamV1 and the `Cautious`
wrapper."""

import eqxopt
from catalog import CatalogCase

BAD_UNIT = (
    ("b1", 1.0),
    ("b2", 0.0),
    ("b2", 1.5),
    ("eps", 0.0),
    ("learning_rate", -1.0),
)
BAD_DECAY = (("weight_decay", -0.01),)


def _make(cls, **defaults):
    return lambda **kw: cls(**{"learning_rate": 0.05, **defaults, **kw})


CASES = [
    CatalogCase(
        "ACProp",
        # After a step of zero gradients the next gradient is divided by about
        # `eps` (the rule's, as optax's): 1e-3 keeps that finite in float16.
        _make(eqxopt.ACProp, eps=1e-3, weight_decay=0.01),
        vary=("b2", 0.9),
        invalid=(*BAD_UNIT, *BAD_DECAY, ("eps_root", -1.0)),
    ),
    CatalogCase(
        "SimplifiedAdEMAMix",
        _make(eqxopt.SimplifiedAdEMAMix, learning_rate=0.005, alpha=2.0),
        vary=("alpha", 1.0),
        invalid=(*BAD_UNIT, *BAD_DECAY, ("alpha", -1.0)),
    ),
]

CASES += [
    CatalogCase(
        "OptimisticAdamV1",
        _make(eqxopt.OptimisticAdamV1, optimism=0.02),
        vary=("optimism", 0.01),
        invalid=(*BAD_UNIT, ("optimism", -0.5)),
    ),
    CatalogCase(
        "Cautious-AdamW",
        lambda **kw: eqxopt.Cautious(
            eqxopt.AdamW(**{"learning_rate": 0.05, "weight_decay": 0.01, **kw})
        ),
        vary=("b2", 0.9),
        invalid=(*BAD_UNIT, *BAD_DECAY),
    ),
    CatalogCase(
        "Cautious-Lion-then-decay",
        lambda **kw: eqxopt.Chain(
            eqxopt.Cautious(
                eqxopt.Lion(**{"learning_rate": 0.01, "weight_decay": 0.0, **kw})
            ),
            eqxopt.DecoupledWeightDecay(0.01, 0.1),
        ),
        # (With the same gradient at every step `b1` leaves Lion's sign alone.)
        vary=("learning_rate", 0.02),
        invalid=(("b1", 1.0), ("learning_rate", -1.0)),
    ),
]
