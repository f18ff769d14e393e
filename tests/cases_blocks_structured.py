"""Catalog cases for the structured building blocks
(`_transforms/_blocks_structured.py`), each chained with `ScaleByLearningRate`
and run through the shared property suite. The first case runs the costly
sweeps in `make test`; the others in `make test-slow`."""

import eqxopt
from catalog import CatalogCase


def _loss_value(loss_fn, params):
    return {"value": loss_fn(params)}


CASES = [
    CatalogCase(
        "Blocks-Stddev-OptimisticGradient-ParamBlockRms",
        lambda decay=0.9, alpha=1.0, min_scale=1e-3, learning_rate=0.01: eqxopt.Chain(
            eqxopt.ScaleByStddev(decay, eps=1e-6),
            eqxopt.ScaleByOptimisticGradient(alpha, 0.5),
            eqxopt.ScaleByParamBlockRms(min_scale),
            eqxopt.ScaleByLearningRate(learning_rate),
        ),
        vary=("decay", 0.8),
        invalid=(("decay", 1.0), ("alpha", -1.0), ("min_scale", -1.0)),
    ),
    CatalogCase(
        "Blocks-Rprop",
        lambda learning_rate=0.01, eta_plus=1.2: eqxopt.Chain(
            eqxopt.ScaleByRprop(learning_rate, eta_plus=eta_plus),
            eqxopt.ScaleByLearningRate(1.0),
        ),
        vary=("eta_plus", 1.1),
        invalid=(("learning_rate", 0.0), ("eta_plus", 1.0)),
    ),
    CatalogCase(
        "Blocks-Sm3",
        lambda b1=0.9, b2=1.0, learning_rate=0.1: eqxopt.Chain(
            eqxopt.ScaleBySm3(b1, b2), eqxopt.ScaleByLearningRate(learning_rate)
        ),
        vary=("b1", 0.8),
        invalid=(("b1", 1.0), ("b2", 1.5)),
    ),
    CatalogCase(
        "Blocks-FactoredRms-ParamBlockNorm",
        lambda decay_rate=0.8, min_scale=0.1, learning_rate=0.01: eqxopt.Chain(
            eqxopt.ScaleByFactoredRms(decay_rate=decay_rate, min_dim_size_to_factor=2),
            eqxopt.ScaleByParamBlockNorm(min_scale),
            eqxopt.ScaleByLearningRate(learning_rate),
        ),
        vary=("decay_rate", 0.7),
        invalid=(("decay_rate", -1.0), ("min_scale", -1.0)),
    ),
    CatalogCase(
        "Blocks-Polyak",
        lambda max_learning_rate=0.1, f_min=0.0: eqxopt.Chain(
            eqxopt.ScaleByPolyak(f_min, max_learning_rate),
            eqxopt.ScaleByLearningRate(1.0),
        ),
        vary=("max_learning_rate", 0.05),
        invalid=(("max_learning_rate", 0.0), ("f_min", float("nan"))),
        extra=_loss_value,
    ),
    CatalogCase(
        "Blocks-DistanceOverGradients",
        lambda reps_rel=1e-4, learning_rate=1.0: eqxopt.Chain(
            eqxopt.ScaleByDistanceOverGradients(reps_rel),
            eqxopt.ScaleByLearningRate(learning_rate),
        ),
        vary=("learning_rate", 0.5),
        invalid=(("reps_rel", 0.0), ("learning_rate", -1.0)),
    ),
    CatalogCase(
        "Blocks-LBFGS",
        lambda learning_rate=0.05, memory_size=5: eqxopt.Chain(
            eqxopt.ScaleByLBFGS(memory_size),
            eqxopt.ScaleByLearningRate(learning_rate),
        ),
        vary=("learning_rate", 0.02),
        invalid=(("learning_rate", -1.0), ("memory_size", 0)),
    ),
]
