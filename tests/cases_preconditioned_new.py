"""Catalog cases for Shampoo and PSGD-Kron."""

import eqxopt
from catalog import CatalogCase

CASES = [
    CatalogCase(
        "Shampoo",
        lambda **kw: eqxopt.Shampoo(
            **{
                "learning_rate": 0.05,
                "eps": 1e-6,
                "weight_decay": 0.01,
                # AdaGrad grafting here; Adam grafting is the reference test's.
                "grafting": "adagrad",
                "precondition_frequency": 2,
                "block_size": 2,
                **kw,
            }
        ),
        vary=("b1", 0.5),
        invalid=(
            ("learning_rate", -0.1),
            ("b1", 1.0),
            ("b2", 0.0),
            ("eps", 0.0),
            ("weight_decay", -0.1),
            ("graft_b2", 1.0),
            ("graft_eps", 0.0),
            ("precondition_frequency", 0),
            ("start_preconditioning_step", 0),
            ("inv_root_override", 0),
            ("block_size", 0),
        ),
    ),
    CatalogCase(
        "PSGDKron",
        lambda **kw: eqxopt.PSGDKron(
            **{
                "learning_rate": 0.05,
                "weight_decay": 0.01,
                "block_size": 2,
                "key": 0,
                **kw,
            }
        ),
        vary=("precond_lr", 0.2),
        invalid=(
            ("learning_rate", -0.1),
            ("b1", 1.0),
            ("weight_decay", -0.1),
            ("precond_lr", 0.0),
            ("precond_init_scale", 0.0),
            ("update_probability", 1.5),
            ("max_size_triangular", 0),
            ("min_ndim_triangular", 0),
            ("block_size", 0),
        ),
    ),
]
