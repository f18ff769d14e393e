"""Catalog cases for the optax.contrib wrappers and optimizers: Mechanic,
ScheduleFree, SAM, Sophia, GaLore."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp

import eqxopt
from catalog import CatalogCase


@functools.cache
def _descent_grad(loss_fn):
    """The gradient function SAM calls, one per loss function (the compiled step
    is keyed on it): `conj` of the gradient, as the suite's gradients are for
    complex leaves (a no-op on real ones); `None` at non-float leaves."""

    def grad_fn(params):
        return jax.tree.map(jnp.conj, eqx.filter_grad(loss_fn)(params))

    return grad_fn


def _sam_extra(loss_fn, params):
    return {"grad_fn": _descent_grad(loss_fn)}


CASES = [
    CatalogCase(
        "Mechanic-SGD",
        lambda **kw: eqxopt.Mechanic(
            eqxopt.SGD(1.0, momentum=0.9), **{"s_init": 1e-3, **kw}
        ),
        vary=("s_init", 1e-2),
        invalid=(("weight_decay", -1.0), ("eps", 0.0), ("s_init", 0.0)),
    ),
    CatalogCase(
        "ScheduleFree-Adam",
        lambda learning_rate=0.05, **kw: eqxopt.ScheduleFree(
            eqxopt.Adam(learning_rate, b1=0.0), **kw
        ),
        vary=("learning_rate", 0.01),
        invalid=(
            ("b1", 0.0),
            ("b1", 1.5),
            ("weight_lr_power", -1.0),
            ("learning_rate", -0.1),
        ),
    ),
    CatalogCase(
        "SAM-SGD",
        lambda **kw: eqxopt.SAM(eqxopt.SGD(0.05, momentum=0.5), **{"rho": 0.05, **kw}),
        vary=("rho", 0.1),
        invalid=(("rho", -0.1),),
        extra=_sam_extra,
    ),
]

CASES.append(
    CatalogCase(
        "Sophia-H",
        lambda **kw: eqxopt.Sophia(
            **{"learning_rate": 0.05, "update_interval": 2, "gamma": 0.1, **kw}
        ),
        vary=("learning_rate", 0.01),
        invalid=(
            ("learning_rate", -0.1),
            ("b1", 1.0),
            ("b2", 1.0),
            ("eps", 0.0),
            ("weight_decay", -1.0),
            ("gamma", 0.0),
            ("clip_threshold", 0.0),
            ("update_interval", 0),
        ),
        # The loss itself: the same function every step.
        extra=lambda loss_fn, params: {"obj_fn": loss_fn},
    )
)

CASES.append(
    CatalogCase(
        "GaLore",
        lambda **kw: eqxopt.GaLore(
            **{"learning_rate": 0.05, "rank": 2, "update_proj_gap": 2, **kw}
        ),
        vary=("learning_rate", 0.01),
        invalid=(
            ("learning_rate", -0.1),
            ("rank", 0),
            ("update_proj_gap", 0),
            ("b1", 1.0),
            ("b2", 1.0),
            ("eps", -1.0),
            ("weight_decay", -1.0),
        ),
    )
)

CASES.append(
    CatalogCase(
        "APOLLO",
        lambda **kw: eqxopt.APOLLO(
            **{"learning_rate": 0.05, "rank": 2, "update_proj_gap": 3, **kw}
        ),
        vary=("learning_rate", 0.01),
        invalid=(
            ("learning_rate", -0.1),
            ("rank", 0),
            ("update_proj_gap", 0),
            ("scale", 0.0),
            ("b1", 1.0),
            ("b2", 1.0),
            ("eps", -1.0),
            ("weight_decay", -1.0),
            ("norm_growth_limit", 0.9),
        ),
    )
)

CASES.append(
    CatalogCase(
        "APOLLO-Mini",
        lambda **kw: eqxopt.APOLLOMini(**{"learning_rate": 0.01, **kw}),
        vary=("learning_rate", 0.003),
        invalid=(
            ("learning_rate", -0.1),
            ("update_proj_gap", 0),
            ("scale", -1.0),
            ("b1", 1.0),
            ("weight_decay", -1.0),
        ),
    )
)
