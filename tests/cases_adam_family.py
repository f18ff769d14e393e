"""Catalog cases for the Adam family beyond the core Adam/AdamW (cases_core.py):
Adam/AdamW options, NAdam(W), AMSGrad, Adamax(W), AdaBelief, RAdam, Yogi, ADOPT,
AdEMAMix, OptimisticAdam, CAdamW, StableAdamW."""

import equinox as eqx
import jax
import jax.numpy as jnp

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


def _matrices(params):
    # Works on whole Equinox models too: non-array leaves get False.
    return jax.tree.map(lambda x: eqx.is_array(x) and x.ndim >= 2, params)


def _make(cls, **defaults):
    return lambda **kw: cls(**{"learning_rate": 0.05, **defaults, **kw})


CASES = [
    CatalogCase(
        "Adam-nesterov",
        _make(eqxopt.Adam, nesterov=True),
        vary=("b1", 0.5),
        invalid=(("eps_root", -1.0),),
    ),
    CatalogCase(
        "AdamW-mask-nu32",
        _make(eqxopt.AdamW, weight_decay=0.1, mask=_matrices, nu_dtype=jnp.float32),
        vary=("weight_decay", 0.5),
    ),
    CatalogCase(
        "AdamW-wd-schedule",
        _make(eqxopt.AdamW, weight_decay=eqxopt.WarmupCosine(0.1, 0.01, 2, 50)),
        vary=("weight_decay", eqxopt.WarmupCosine(0.5, 0.05, 2, 50)),
    ),
    CatalogCase(
        "NAdam",
        _make(eqxopt.NAdam),
        vary=("b2", 0.9),
        invalid=(*BAD_UNIT, ("momentum_decay", -0.004)),
    ),
    CatalogCase(
        "NAdam-torch-schedule",
        _make(eqxopt.NAdam, momentum_decay=0.004),
        vary=("momentum_decay", 0.5),
    ),
    CatalogCase(
        "NAdamW",
        _make(eqxopt.NAdamW, weight_decay=0.1),
        vary=("weight_decay", 0.5),
        invalid=(*BAD_UNIT, *BAD_DECAY, ("momentum_decay", -1.0)),
    ),
    CatalogCase(
        "AMSGrad",
        _make(eqxopt.AMSGrad),
        vary=("b2", 0.9),
        invalid=(*BAD_UNIT, *BAD_DECAY),
    ),
    CatalogCase(
        "AMSGrad-torch",
        _make(eqxopt.AMSGrad, weight_decay=0.1, nu_correction="after_max"),
        vary=("weight_decay", 0.5),
    ),
    CatalogCase(
        "Adamax",
        _make(eqxopt.Adamax),
        vary=("b1", 0.5),
        invalid=BAD_UNIT,
    ),
    CatalogCase(
        "AdamaxW",
        _make(eqxopt.AdamaxW, weight_decay=0.1),
        vary=("weight_decay", 0.5),
        invalid=(*BAD_UNIT, *BAD_DECAY),
    ),
    CatalogCase(
        "AdaBelief",
        _make(eqxopt.AdaBelief),
        vary=("b1", 0.5),
        invalid=(*BAD_UNIT, ("eps_root", -1e-16)),
    ),
    CatalogCase(
        "RAdam",
        _make(eqxopt.RAdam, weight_decay=0.01),
        vary=("b1", 0.5),
        invalid=(*BAD_UNIT, *BAD_DECAY, ("threshold", -1.0)),
    ),
    CatalogCase(
        "Yogi",
        _make(eqxopt.Yogi),
        vary=("b1", 0.5),
        invalid=(*BAD_UNIT, ("initial_accumulator_value", -1.0)),
    ),
    CatalogCase(
        "ADOPT",
        _make(eqxopt.ADOPT),
        vary=("b1", 0.5),
        invalid=BAD_UNIT,
    ),
    CatalogCase(
        "AdEMAMix",
        _make(eqxopt.AdEMAMix, b3=0.999, weight_decay=0.01),
        vary=("alpha", 1.0),
        invalid=(*BAD_UNIT, *BAD_DECAY, ("b3", 1.0), ("alpha", -1.0)),
    ),
    CatalogCase(
        "OptimisticAdam",
        _make(eqxopt.OptimisticAdam),
        vary=("beta", 0.5),
        invalid=(*BAD_UNIT, ("alpha", -1.0), ("beta", -0.5)),
    ),
    CatalogCase(
        "CAdamW",
        _make(eqxopt.CAdamW, weight_decay=0.01),
        vary=("b2", 0.9),
        invalid=(*BAD_UNIT, *BAD_DECAY),
    ),
    CatalogCase(
        "StableAdamW",
        _make(eqxopt.StableAdamW, weight_decay=0.01),
        vary=("b2", 0.9),
        invalid=(*BAD_UNIT, *BAD_DECAY),
    ),
]
