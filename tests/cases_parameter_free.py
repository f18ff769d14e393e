"""Catalog cases for the parameter-free family: DoG, DoWG, COCOB, ASGD, MADGRAD,
D-Adaptation AdamW/SGD, Momo and MomoAdam."""

import eqxopt
from catalog import CatalogCase


def _loss_value(loss_fn, params):
    return {"value": loss_fn(params)}


CASES = [
    CatalogCase(
        "DoG",
        lambda **kw: eqxopt.DoG(**{"init_value": 1e-2, "weight_decay": 1e-3, **kw}),
        vary=("learning_rate", 0.5),
        invalid=(
            ("learning_rate", -1.0),
            ("init_value", 0.0),
            ("eps", -1.0),
            ("weight_decay", -1.0),
            ("init_step", "guess"),
        ),
    ),
    CatalogCase(
        "DoWG",
        lambda **kw: eqxopt.DoWG(**{"weight_decay": 1e-3, **kw}),
        vary=("weight_decay", 1e-2),
        invalid=(
            ("learning_rate", -1.0),
            ("init_estim_sq_dist", 0.0),
            ("eps", 0.0),
            ("weight_decay", -1.0),
        ),
    ),
    CatalogCase(
        "COCOB",
        lambda **kw: eqxopt.COCOB(**{"weight_decay": 1e-3, **kw}),
        vary=("alpha", 20.0),
        invalid=(
            ("learning_rate", -1.0),
            ("alpha", 0.0),
            ("eps", 0.0),
            ("weight_decay", -1.0),
        ),
    ),
    CatalogCase(
        "ASGD",
        lambda **kw: eqxopt.ASGD(**{"learning_rate": 0.05, "t0": 1.0, **kw}),
        vary=("lambd", 0.1),
        invalid=(
            ("learning_rate", -1.0),
            ("lambd", -1.0),
            ("alpha", -1.0),
            ("t0", -1.0),
            ("weight_decay", -1.0),
        ),
    ),
    CatalogCase(
        "MADGRAD",
        lambda **kw: eqxopt.MADGRAD(**{"learning_rate": 0.05, **kw}),
        vary=("momentum", 0.5),
        invalid=(
            ("learning_rate", -1.0),
            ("momentum", 1.0),
            ("weight_decay", -1.0),
            ("eps", -1.0),
        ),
    ),
    CatalogCase(
        "DAdaptAdamW",
        lambda **kw: eqxopt.DAdaptAdamW(**{"d0": 1e-2, "weight_decay": 1e-3, **kw}),
        vary=("b1", 0.5),
        invalid=(
            ("learning_rate", -1.0),
            ("b1", 1.0),
            ("b2", 0.0),
            ("eps", 0.0),
            ("d0", 0.0),
            ("weight_decay", -1.0),
        ),
    ),
    CatalogCase(
        "Momo",
        lambda **kw: eqxopt.Momo(**{"learning_rate": 0.1, "weight_decay": 1e-3, **kw}),
        vary=("beta", 0.5),
        invalid=(
            ("learning_rate", -1.0),
            ("beta", 1.0),
            ("lower_bound", float("nan")),
            ("weight_decay", -1.0),
        ),
        extra=_loss_value,
    ),
    CatalogCase(
        "MomoAdam",
        lambda **kw: eqxopt.MomoAdam(
            **{"learning_rate": 0.05, "adapt_lower_bound": True, **kw}
        ),
        vary=("b2", 0.99),
        invalid=(
            ("learning_rate", -1.0),
            ("b1", 1.0),
            ("b2", 0.0),
            ("eps", 0.0),
            ("lower_bound", float("inf")),
            ("weight_decay", -1.0),
        ),
        extra=_loss_value,
    ),
    CatalogCase(
        "DAdaptSGD",
        lambda **kw: eqxopt.DAdaptSGD(
            **{"d0": 1e-2, "momentum": 0.9, "weight_decay": 1e-3, **kw}
        ),
        vary=("momentum", 0.5),
        invalid=(
            ("learning_rate", -1.0),
            ("momentum", 1.0),
            ("weight_decay", -1.0),
            ("d0", 0.0),
            ("growth_rate", 0.5),
        ),
    ),
]
