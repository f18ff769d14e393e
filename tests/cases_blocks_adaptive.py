"""Catalog cases for the adaptive building blocks (`_transforms/_blocks_adaptive.py`):
several of them chained into one working optimizer (the module's first case, swept
in `make test`), then each block before a learning rate (swept in `make test-slow`)."""

import eqxopt
from catalog import CatalogCase


def _with_lr(block, learning_rate):
    return eqxopt.Chain(block, eqxopt.ScaleByLearningRate(learning_rate))


CASES = [
    CatalogCase(
        "Blocks-Adadelta-Novograd-Yogi-Rss-as-chain",
        lambda rho=0.9, b2=0.99, weight_decay=0.01, learning_rate=0.05: eqxopt.Chain(
            eqxopt.ScaleByAdadelta(rho, 1e-4),
            eqxopt.ScaleByNovograd(0.5),
            eqxopt.ScaleByYogi(0.9, b2),
            eqxopt.ScaleByRss(0.1),
            eqxopt.AddDecayedWeights(weight_decay),
            eqxopt.ScaleByLearningRate(learning_rate),
        ),
        vary=("b2", 0.95),
        invalid=(("rho", 1.0), ("b2", 0.0), ("weight_decay", -1.0)),
    ),
    CatalogCase(
        "Blocks-Adamax",
        lambda b1=0.9, b2=0.999, eps=1e-8, learning_rate=0.05: _with_lr(
            eqxopt.ScaleByAdamax(b1, b2, eps), learning_rate
        ),
        vary=("b1", 0.8),
        invalid=(("b1", 1.0), ("b2", 0.0), ("eps", 0.0)),
    ),
    CatalogCase(
        "Blocks-Amsgrad",
        lambda b1=0.9, b2=0.999, eps_root=0.0, learning_rate=0.05: _with_lr(
            eqxopt.ScaleByAmsgrad(b1, b2, 1e-8, eps_root), learning_rate
        ),
        vary=("b2", 0.99),
        invalid=(("b1", -0.1), ("eps_root", -1.0)),
    ),
    CatalogCase(
        "Blocks-Adadelta",
        lambda rho=0.9, eps=1e-4, learning_rate=1.0: _with_lr(
            eqxopt.ScaleByAdadelta(rho, eps), learning_rate
        ),
        vary=("rho", 0.8),
        invalid=(("rho", 1.0), ("eps", 0.0)),
    ),
    CatalogCase(
        "Blocks-Adan",
        lambda b1=0.98, b2=0.92, b3=0.99, learning_rate=0.05: _with_lr(
            eqxopt.ScaleByAdan(b1, b2, b3), learning_rate
        ),
        vary=("b3", 0.95),
        invalid=(("b1", 1.0), ("b3", 1.5)),
    ),
    CatalogCase(
        "Blocks-Belief",
        lambda b1=0.9, b2=0.999, learning_rate=0.05: _with_lr(
            eqxopt.ScaleByBelief(b1, b2, nesterov=True), learning_rate
        ),
        vary=("b1", 0.8),
        invalid=(("b1", 1.0), ("b2", 1.0)),
    ),
    CatalogCase(
        "Blocks-Lion-smooth",
        lambda b1=0.9, smooth_beta=2.0, learning_rate=0.01: _with_lr(
            eqxopt.ScaleByLion(b1, mode="smooth", smooth_beta=smooth_beta),
            learning_rate,
        ),
        vary=("smooth_beta", 3.0),
        invalid=(("b1", 1.0), ("smooth_beta", 0.0)),
    ),
    CatalogCase(
        "Blocks-Novograd",
        lambda b1=0.9, b2=0.25, weight_decay=0.01, learning_rate=0.01: _with_lr(
            eqxopt.ScaleByNovograd(b1, b2, weight_decay=weight_decay), learning_rate
        ),
        # not b2: with a constant gradient (the property's) the norms' average is
        # the same for every b2
        vary=("b1", 0.8),
        invalid=(("b2", 1.0), ("weight_decay", -0.1)),
    ),
    CatalogCase(
        "Blocks-Radam",
        lambda b1=0.9, b2=0.99, threshold=5.0, learning_rate=0.05: _with_lr(
            eqxopt.ScaleByRadam(b1, b2, threshold=threshold), learning_rate
        ),
        # not threshold: rho_t < 4 in the property's first steps, unrectified
        vary=("b1", 0.8),
        invalid=(("b2", 0.0), ("threshold", -1.0)),
    ),
    CatalogCase(
        "Blocks-Rss",
        lambda initial_accumulator_value=0.1, eps=1e-7, learning_rate=0.1: _with_lr(
            eqxopt.ScaleByRss(initial_accumulator_value, eps), learning_rate
        ),
        vary=("eps", 1e-6),
        invalid=(("initial_accumulator_value", -1.0), ("eps", -1.0)),
    ),
    CatalogCase(
        "Blocks-Yogi",
        lambda b1=0.9, b2=0.999, eps=1e-3, learning_rate=0.05: _with_lr(
            eqxopt.ScaleByYogi(b1, b2, eps), learning_rate
        ),
        vary=("b1", 0.8),
        invalid=(("b2", 1.0), ("eps", 0.0)),
    ),
]
