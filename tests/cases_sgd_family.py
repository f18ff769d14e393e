"""Catalog cases for the adaptive-rate and sign/SGD-like optimizers: Adagrad,
Adadelta, RMSProp, Rprop, SignSGD, Signum, Lion, NoisySGD, optimistic gradient
descent and Polyak SGD."""

import eqxopt
from catalog import CatalogCase


def _loss_value(loss_fn, params):
    return {"value": loss_fn(params)}


CASES = [
    CatalogCase(
        "Adagrad",
        lambda **kw: eqxopt.Adagrad(**{"learning_rate": 0.1, **kw}),
        vary=("initial_accumulator_value", 0.5),
        invalid=(
            ("learning_rate", -0.1),
            ("initial_accumulator_value", -1.0),
            ("eps", -1e-7),
            ("weight_decay", -0.1),
        ),
    ),
    CatalogCase(
        "Adadelta",
        lambda **kw: eqxopt.Adadelta(**{"learning_rate": 1.0, **kw}),
        vary=("rho", 0.5),
        invalid=(("rho", 1.0), ("rho", -0.1), ("eps", 0.0), ("weight_decay", -1.0)),
    ),
    CatalogCase(
        "RMSProp",
        lambda **kw: eqxopt.RMSProp(**{"learning_rate": 0.01, **kw}),
        vary=("decay", 0.99),
        invalid=(
            ("decay", 1.0),
            ("eps", 0.0),
            ("initial_scale", -1.0),
            ("learning_rate", -0.01),
            ("weight_decay", -0.1),
        ),
    ),
    CatalogCase(
        "RMSProp-centered-nesterov",
        lambda **kw: eqxopt.RMSProp(
            **{
                "learning_rate": 0.01,
                "centered": True,
                "momentum": 0.9,
                "nesterov": True,
                **kw,
            }
        ),
        vary=("momentum", 0.5),
        invalid=(("momentum", 1.0), ("momentum", -0.1)),
    ),
    CatalogCase(
        "Rprop",
        lambda **kw: eqxopt.Rprop(**{"learning_rate": 0.01, **kw}),
        vary=("eta_plus", 1.5),
        invalid=(
            ("learning_rate", 0.0),
            ("eta_minus", 1.0),
            ("eta_minus", 0.0),
            ("eta_plus", 1.0),
            ("min_step_size", -1.0),
            ("max_step_size", 0.0),
            ("min_step_size", 100.0),
        ),
    ),
    CatalogCase(
        "SignSGD",
        lambda **kw: eqxopt.SignSGD(**{"learning_rate": 0.01, **kw}),
        vary=("learning_rate", 0.02),
        invalid=(("learning_rate", -0.01),),
    ),
    CatalogCase(
        "Signum",
        lambda **kw: eqxopt.Signum(**{"learning_rate": 0.01, **kw}),
        vary=("learning_rate", 0.02),
        invalid=(("beta", 1.0), ("beta", -0.5)),
    ),
    CatalogCase(
        "Lion",
        lambda **kw: eqxopt.Lion(**{"learning_rate": 0.01, "weight_decay": 0.1, **kw}),
        vary=("weight_decay", 1.0),
        invalid=(("b1", 1.0), ("b2", 1.0), ("b2", -0.1), ("weight_decay", -0.1)),
    ),
    CatalogCase(
        "NoisySGD",
        lambda **kw: eqxopt.NoisySGD(**{"learning_rate": 0.05, "key": 0, **kw}),
        vary=("eta", 0.1),
        invalid=(("eta", -0.01), ("gamma", -0.55), ("learning_rate", -1.0)),
    ),
    CatalogCase(
        "OptimisticGradientDescent",
        lambda **kw: eqxopt.OptimisticGradientDescent(**{"learning_rate": 0.05, **kw}),
        vary=("alpha", 0.5),
        invalid=(("alpha", -1.0), ("beta", -1.0), ("learning_rate", -0.05)),
    ),
    CatalogCase(
        "PolyakSGD",
        lambda **kw: eqxopt.PolyakSGD(**{"max_learning_rate": 0.1, **kw}),
        vary=("max_learning_rate", 0.05),
        invalid=(
            ("max_learning_rate", 0.0),
            ("eps", -1.0),
            ("scaling", -1.0),
            ("f_min", float("nan")),
        ),
        extra=_loss_value,
    ),
]
