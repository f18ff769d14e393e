"""Catalog cases for the newer optimizers: Muon, AdaMuon, PolarGrad, Dion,
HyperBallAdamW, Scion, MuonClip, Schedule-Free, Prodigy."""

from collections.abc import Callable
from typing import Any

import eqxopt
from catalog import CatalogCase


def _no_attention(params):
    # The sweep's pytrees have no attention layers: MuonClip is Muon there, with
    # its keyword and wrapper on every path.
    return []


def _max_logits(loss_fn, params):
    return {"max_logits": []}


def second_moment_muon_case(
    name: str, make: Callable[..., eqxopt.AbstractTransform], vary: tuple[str, Any]
) -> CatalogCase:
    """The case of a Muon with a second moment (AdaMuon, NorMuon): the same
    configuration and the same options checked."""
    return CatalogCase(
        name,
        lambda **kw: make(**{"learning_rate": 0.05, "weight_decay": 0.01, **kw}),
        vary=vary,
        invalid=(
            ("learning_rate", -0.1),
            ("beta", 1.0),
            ("beta2", 1.0),
            ("eps", 0.0),
            ("weight_decay", -1.0),
            ("consistent_rms", 0.0),
            ("adam_b1", 1.0),
            ("adam_b2", 0.0),
            ("adam_weight_decay", -1.0),
            ("ns_steps", 0),
            ("ns_coeffs", (1.0, 2.0)),
        ),
    )


# A case varies a hyperparameter that changes the steps under the sweep's constant
# gradients: a bias-corrected moment of a constant gradient is that gradient for any
# decay, so AdaMuon, HyperBallAdamW and Scion vary their learning rate (and Dion,
# whose steps along a constant gradient are the same for any `mu`).
CASES = [
    CatalogCase(
        "Muon",
        lambda **kw: eqxopt.Muon(**{"learning_rate": 0.05, "weight_decay": 0.01, **kw}),
        vary=("beta", 0.5),
        invalid=(
            ("learning_rate", -0.1),
            ("beta", 1.0),
            ("eps", 0.0),
            ("weight_decay", -1.0),
            ("adam_b1", 1.0),
            ("adam_b2", 0.0),
            ("adam_eps_root", -1.0),
            ("adam_weight_decay", -1.0),
            ("adam_learning_rate", -1.0),
            ("ns_steps", 0),
            ("ns_coeffs", (1.0, 2.0)),
        ),
    ),
    second_moment_muon_case("AdaMuon", eqxopt.AdaMuon, ("learning_rate", 0.01)),
    CatalogCase(
        "Dion",
        lambda **kw: eqxopt.Dion(
            **{"learning_rate": 0.05, "rank_fraction": 0.5, "key": 1, **kw}
        ),
        vary=("learning_rate", 0.01),
        invalid=(
            ("learning_rate", -0.1),
            ("mu", 1.0),
            ("eps", 0.0),
            ("weight_decay", -1.0),
            ("rank_fraction", 0.0),
            ("rank_multiple_of", 0),
            ("power_iters", 0),
            ("qr_method", "svd"),
            ("adam_b1", 1.0),
            ("adam_b2", 0.0),
            ("adam_learning_rate", -1.0),
        ),
    ),
    CatalogCase(
        "HyperBallAdamW",
        lambda **kw: eqxopt.HyperBallAdamW(
            **{"learning_rate": 0.05, "weight_decay": 0.01, **kw}
        ),
        vary=("learning_rate", 0.01),
        invalid=(
            ("learning_rate", -0.1),
            ("b2", 1.0),
            ("b2", 0.0),
            ("eps", 0.0),
            ("weight_decay", -1.0),
        ),
    ),
    CatalogCase(
        "PolarGrad",
        lambda **kw: eqxopt.PolarGrad(
            **{"learning_rate": 0.05, "weight_decay": 0.01, **kw}
        ),
        vary=("beta", 0.5),
        invalid=(
            ("learning_rate", -0.1),
            ("beta", 1.0),
            ("eps", 0.0),
            ("weight_decay", -1.0),
            ("adam_b1", 1.0),
            ("adam_b2", 0.0),
            ("adam_eps_root", -1.0),
            ("adam_weight_decay", -1.0),
            ("adam_learning_rate", -1.0),
            ("polar_method", "cholesky"),
            ("qdwh_steps", 0),
            ("ns_steps", 0),
            ("ns_coeffs", (1.0, 2.0)),
        ),
    ),
    CatalogCase(
        "PolarGrad-polar-first-svd",
        lambda **kw: eqxopt.PolarGrad(
            **{
                "learning_rate": 0.05,
                "polar_first": True,
                "polar_method": "svd",
                **kw,
            }
        ),
        vary=("beta", 0.5),
    ),
    CatalogCase(
        "Scion",
        lambda **kw: eqxopt.Scion(
            **{"learning_rate": 0.02, "weight_decay": 0.01, **kw}
        ),
        vary=("learning_rate", 0.01),
        invalid=(
            ("learning_rate", -0.1),
            ("beta", 1.0),
            ("scale", 0.0),
            ("eps", 0.0),
            ("weight_decay", -1.0),
            ("ns_steps", 0),
            ("ns_coeffs", (1.0, 2.0)),
            ("norms", "frobenius"),
        ),
    ),
    CatalogCase(
        "ScheduleFreeSGD",
        lambda **kw: eqxopt.ScheduleFreeSGD(**{"learning_rate": 0.05, **kw}),
        vary=("b1", 0.5),
        invalid=(
            ("learning_rate", -0.1),
            ("b1", 0.0),
            ("b1", 1.5),
            ("weight_decay", -0.1),
            ("weight_lr_power", -1.0),
        ),
    ),
    CatalogCase(
        "ScheduleFreeAdamW",
        lambda **kw: eqxopt.ScheduleFreeAdamW(
            **{"learning_rate": 0.05, "weight_decay": 0.01, **kw}
        ),
        vary=("b2", 0.9),
        invalid=(
            ("b1", 0.0),
            ("b2", 1.0),
            ("eps", 0.0),
            ("weight_decay", -0.1),
        ),
    ),
    CatalogCase(
        "ScheduleFreeAdamW-schedule",
        lambda **kw: eqxopt.ScheduleFreeAdamW(
            **{"learning_rate": eqxopt.WarmupCosine(0.05, 0.05, 2, 3), **kw}
        ),
        vary=("learning_rate", eqxopt.WarmupCosine(0.1, 0.1, 1, 2)),
    ),
    CatalogCase(
        "Prodigy",
        lambda **kw: eqxopt.Prodigy(**{"d0": 1e-2, **kw}),
        vary=("d0", 1e-3),
        invalid=(
            ("learning_rate", -1.0),
            ("b1", 1.0),
            ("b2", 0.0),
            ("b3", 1.0),
            ("eps", 0.0),
            ("d0", 0.0),
            ("d_coef", 0.0),
            ("weight_decay", -1.0),
        ),
    ),
]

CASES.append(
    CatalogCase(
        "SOAP",
        lambda **kw: eqxopt.SOAP(
            **{"learning_rate": 0.05, "precondition_frequency": 2, **kw}
        ),
        vary=("b1", 0.5),
        invalid=(
            ("learning_rate", -0.1),
            ("b1", 1.0),
            ("b2", 0.0),
            ("shampoo_beta", 1.0),
            ("eps", 0.0),
            ("weight_decay", -0.1),
            ("precondition_frequency", 0),
            ("max_precond_dim", 0),
        ),
    )
)


CASES.append(
    CatalogCase(
        "SOAP-kl",
        lambda **kw: eqxopt.SOAP(
            **{
                "learning_rate": 0.05,
                "precondition_frequency": 2,
                "factor_update": "kl",
                # Its eigenvalue floor above float32's rounding noise, which the
                # rank-deficient first statistics of a non-square matrix hold
                # (the inverses weigh each update): the sweeps compare runs.
                "eps": 1e-3,
                **kw,
            }
        ),
        vary=("eps", 1e-2),  # also its eigenvalue floor
        invalid=(("factor_update", "fisher"), ("eps", 0.0)),
    )
)


CASES.append(
    CatalogCase(
        "KLShampoo",
        lambda **kw: eqxopt.KLShampoo(
            **{"learning_rate": 0.05, "precondition_frequency": 2, **kw}
        ),
        vary=("shampoo_beta", 0.5),
        invalid=(
            ("learning_rate", -0.1),
            ("b1", 1.0),
            ("shampoo_beta", 1.0),
            ("eps", 0.0),
            ("weight_decay", -0.1),
            ("init_factor", 0.0),
            ("precondition_frequency", 0),
            ("max_precond_dim", 0),
        ),
    )
)


def _lbfgs_extra(loss_fn, params):
    # The suite passes the same loss function every step, so the compiled step
    # (keyed on `value_fn`) is reused.
    return {"value": loss_fn(params), "value_fn": loss_fn}


CASES.append(
    CatalogCase(
        "LBFGS",
        lambda **kw: eqxopt.LBFGS(**{"memory_size": 5, **kw}),
        vary=("learning_rate", 0.5),
        invalid=(
            ("learning_rate", -1.0),
            ("memory_size", 0),
            ("max_linesearch_steps", 0),
            ("max_learning_rate", 0.0),
            ("tol", -1.0),
            ("increase_factor", 1.0),
            ("slope_rtol", 0.0),
            ("curv_rtol", 1.0),
            ("approx_dec_rtol", -1.0),
            ("stepsize_precision", -1.0),
        ),
        extra=_lbfgs_extra,
    )
)

CASES.append(
    CatalogCase(
        "MuonClip",
        lambda **kw: eqxopt.MuonClip(
            **{
                "learning_rate": 0.05,
                "attention": _no_attention,
                "weight_decay": 0.01,
                **kw,
            }
        ),
        vary=("learning_rate", 0.01),
        invalid=(("threshold", 0.0), ("learning_rate", -0.1), ("beta", 1.0)),
        extra=_max_logits,
    )
)
