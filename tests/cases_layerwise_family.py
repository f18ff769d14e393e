"""Catalog cases for the layer-wise, factored and multi-moment optimizers: LAMB, LARS,
Fromage, NovoGrad, Adan, SM3 and Adafactor."""

import equinox as eqx
import jax

import eqxopt
from catalog import CatalogCase


def _matrices(params):
    # Functions (activations) in a model are leaves too: they get no decay.
    return jax.tree.map(lambda p: eqx.is_array(p) and p.ndim >= 2, params)


CASES = [
    CatalogCase(
        "LAMB",
        lambda **kw: eqxopt.LAMB(
            **{"learning_rate": 0.05, "weight_decay": 0.01, "mask": _matrices, **kw}
        ),
        vary=("b1", 0.5),
        invalid=(
            ("learning_rate", -0.1),
            ("b1", 1.0),
            ("b2", 0.0),
            ("eps", 0.0),
            ("eps_root", -1e-8),
            ("weight_decay", -0.1),
        ),
    ),
    CatalogCase(
        "LARS",
        lambda **kw: eqxopt.LARS(
            **{"learning_rate": 5.0, "weight_decay": 1e-4, "nesterov": True, **kw}
        ),
        vary=("trust_coefficient", 0.01),
        invalid=(
            ("trust_coefficient", 0.0),
            ("momentum", 1.0),
            ("eps", -1.0),
            ("weight_decay", -0.1),
        ),
    ),
    CatalogCase(
        "Fromage",
        lambda **kw: eqxopt.Fromage(**{"learning_rate": 0.05, **kw}),
        vary=("learning_rate", 0.02),
        invalid=(("learning_rate", -0.01), ("min_norm", -1.0)),
    ),
    CatalogCase(
        "NovoGrad",
        lambda **kw: eqxopt.NovoGrad(
            **{"learning_rate": 0.02, "weight_decay": 1e-3, **kw}
        ),
        vary=("b1", 0.5),
        invalid=(("b1", 1.0), ("b2", -0.1), ("eps", 0.0), ("eps_root", -1.0)),
    ),
    CatalogCase(
        "Adan",
        lambda **kw: eqxopt.Adan(
            **{"learning_rate": 0.05, "weight_decay": 0.01, "mask": _matrices, **kw}
        ),
        vary=("b3", 0.9),
        invalid=(
            ("b1", 1.0),
            ("b2", -0.5),
            ("b3", 1.5),
            ("eps", -1e-8),
            ("weight_decay", -1.0),
        ),
    ),
    CatalogCase(
        "SM3",
        lambda **kw: eqxopt.SM3(**{"learning_rate": 0.1, **kw}),
        vary=("momentum", 0.5),
        invalid=(("momentum", 1.0), ("eps", -1.0), ("learning_rate", -1.0)),
    ),
    CatalogCase(
        "Adafactor",
        lambda **kw: eqxopt.Adafactor(**kw),
        vary=("clipping_threshold", 0.5),
        invalid=(
            ("decay_rate", -0.5),
            ("clipping_threshold", 0.0),
            ("eps", 0.0),
            ("weight_decay_rate", -1.0),
            ("learning_rate", -1.0),
            ("min_dim_size_to_factor", 0),
        ),
    ),
    CatalogCase(
        # min_dim_size_to_factor=2 factors the test trees' matrices and 3-d leaves.
        "Adafactor-factored-momentum",
        lambda **kw: eqxopt.Adafactor(
            **{
                "learning_rate": 0.05,
                "min_dim_size_to_factor": 2,
                "momentum": 0.9,
                "weight_decay_rate": 1e-4,
                "weight_decay_mask": _matrices,
                **kw,
            }
        ),
        vary=("momentum", 0.5),
        invalid=(("momentum", 1.0), ("momentum", -0.1)),
    ),
]
