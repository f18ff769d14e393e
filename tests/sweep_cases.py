"""The public transforms that the catalog's cases (`catalog.all_cases()`) leave out,
for the sweeps over every transform eqxopt ships (packed models,
`hyperparameters`, `explain_kernels`, schedules out of range). Kept out of the
`cases_*.py` modules: several take per-example gradients or no parameters to
optimise, which the catalog's shared properties do not provide for.
"""

import dataclasses
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import optax
import pytest

import eqxopt
from catalog import CatalogCase, all_cases, swept
from helpers import nested_tree


def _every_other(step):
    return step % 2 == 0


def _norm(tree):
    return eqxopt.tree_norm(tree)


def _linesearch_extra(loss_fn, params):
    return {"value": loss_fn(params), "value_fn": loss_fn}


EXTRA = [
    CatalogCase(
        "DPSGD",
        lambda **kw: eqxopt.DPSGD(
            **{
                "learning_rate": 0.05,
                "l2_norm_clip": 1.0,
                "noise_multiplier": 0.1,
                "seed": 0,
                "momentum": 0.9,
                **kw,
            }
        ),
        vary=("learning_rate", 0.02),
        tags=frozenset({"per_example"}),
    ),
    CatalogCase(
        "DifferentiallyPrivateAggregate-SGD",
        lambda **kw: eqxopt.Chain(
            eqxopt.DifferentiallyPrivateAggregate(
                **{"l2_norm_clip": 1.0, "noise_multiplier": 0.1, "seed": 0, **kw}
            ),
            eqxopt.SGD(0.05),
        ),
        vary=("l2_norm_clip", 2.0),
        tags=frozenset({"per_example"}),
    ),
    CatalogCase(
        "ConditionallyMask-SGD",
        lambda momentum=0.9: eqxopt.ConditionallyMask(
            eqxopt.SGD(0.05, momentum=momentum), _every_other
        ),
        vary=("momentum", 0.5),
    ),
    CatalogCase(
        "ConditionallyTransform-Adam",
        lambda b1=0.9: eqxopt.ConditionallyTransform(
            eqxopt.Adam(0.05, b1=b1), _every_other
        ),
        vary=("b1", 0.8),
    ),
    CatalogCase(
        "EMA-SGD",
        lambda decay=0.9: eqxopt.Chain(eqxopt.EMA(decay), eqxopt.SGD(0.05)),
        vary=("decay", 0.5),
    ),
    CatalogCase(
        "FromOptax-adam",
        lambda learning_rate=0.05: eqxopt.from_optax(optax.adam(learning_rate)),
        vary=("learning_rate", 0.02),
    ),
    CatalogCase(
        "KeepParamsNonnegative-SGD",
        lambda learning_rate=0.05: eqxopt.Chain(
            eqxopt.SGD(learning_rate), eqxopt.KeepParamsNonnegative()
        ),
        vary=("learning_rate", 0.02),
    ),
    CatalogCase(
        "Masked-Adam",
        lambda learning_rate=0.05: eqxopt.Masked(
            eqxopt.Adam(learning_rate), lambda p: jax.tree.map(lambda x: x.ndim > 1, p)
        ),
        vary=("learning_rate", 0.02),
    ),
    CatalogCase(
        "Snapshot-MeasureWithEMA-SGD",
        lambda decay=0.8: eqxopt.Chain(
            eqxopt.SGD(0.05),
            eqxopt.Snapshot("norm", _norm),
            eqxopt.MeasureWithEMA(_norm, decay),
        ),
        vary=("decay", 0.5),
    ),
    CatalogCase(
        "NormalizeByUpdateNorm-SGD",
        lambda scale_factor=1.0: eqxopt.Chain(
            eqxopt.NormalizeByUpdateNorm(scale_factor), eqxopt.SGD(0.05)
        ),
        vary=("scale_factor", 0.5),
    ),
    CatalogCase(
        "ScaleByBacktrackingLinesearch-SGD",
        lambda decrease_factor=0.8: eqxopt.Chain(
            eqxopt.SGD(1.0),
            eqxopt.ScaleByBacktrackingLinesearch(8, decrease_factor=decrease_factor),
        ),
        vary=("decrease_factor", 0.5),
        extra=_linesearch_extra,
    ),
    CatalogCase(
        "SplitRealAndImaginary-Adam",
        lambda learning_rate=0.05: eqxopt.SplitRealAndImaginary(
            eqxopt.Adam(learning_rate)
        ),
        vary=("learning_rate", 0.02),
    ),
]


def every_case() -> list[CatalogCase]:
    """The catalog's cases and `EXTRA`: every public transform, alone or held by
    another."""
    return all_cases() + EXTRA


def swept_every_case() -> list:
    """`every_case()` as `pytest.param`s: the catalog's as `catalog.swept` marks
    them, and of `EXTRA` the first and the per-example ones in `make test`, the
    others marked slow."""
    fast = {EXTRA[0].name} | {c.name for c in EXTRA if "per_example" in c.tags}
    return swept(all_cases()) + [
        pytest.param(c, id=c.name, marks=() if c.name in fast else pytest.mark.slow)
        for c in EXTRA
    ]


def transforms_in(opt: eqxopt.AbstractTransform) -> Iterator[eqxopt.AbstractTransform]:
    """`opt` and every transform it holds, at any depth."""

    def is_transform(x):
        return isinstance(x, eqxopt.AbstractTransform)

    yield opt
    for field in dataclasses.fields(opt):
        for held in jax.tree.leaves(getattr(opt, field.name), is_leaf=is_transform):
            if is_transform(held):
                yield from transforms_in(held)


def loss(params):
    """A quartic regression (the same function object every call, as the cases'
    `extra` want for the compiled step's key)."""
    targets = jax.tree.leaves(nested_tree(seed=7))
    return sum(
        jnp.sum((p - t) ** 2 + 0.1 * p**4)
        for p, t in zip(jax.tree.leaves(params), targets)
    )


def extra_for(case: CatalogCase, params) -> dict:
    """The keyword arguments a case's `update`/`step` take on `params`."""
    return {} if case.extra is None else case.extra(loss, params)


def per_example(case: CatalogCase, grads: jax.Array) -> jax.Array:
    """`grads` as a case takes them: for a transform of per-example gradients, a
    batch of two copies."""
    if "per_example" not in case.tags:
        return grads
    return jax.tree.map(lambda g: jnp.stack([g, g]), grads)
