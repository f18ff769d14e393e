"""Catalog cases for the optimizer-like wrappers and chains: each is run through the
shared property suite (structure/dtype, no mutation, None gradients, whole Equinox
models, bf16, no recompiles, traced hyperparameters, invalid values).

`FromOptax` is not here: optax's opaque state advances for leaves whose gradient
is `None` (documented on the class), which the None-gradient property forbids."""

import eqxopt
from catalog import CatalogCase


def _loss_value(loss_fn, params):
    return {"value": loss_fn(params)}


# Masks and labels are module-level functions: a new lambda per optimizer would be a
# new static value, and so a new compiled step.
def _everything(params):
    return True


def _nothing(params):
    return False


def _by_rank(leaf):
    return "matrix" if leaf.ndim >= 2 else "other"


CASES = [
    CatalogCase(
        "Chain-ClipByGlobalNorm-AdamW",
        lambda max_norm=1.0, **kw: eqxopt.Chain(
            eqxopt.ClipByGlobalNorm(max_norm),
            eqxopt.AdamW(**{"learning_rate": 0.05, "weight_decay": 0.01, **kw}),
        ),
        vary=("max_norm", 0.5),
        invalid=(("max_norm", 0.0), ("max_norm", -1.0), ("weight_decay", -0.1)),
    ),
    CatalogCase(
        "Chain-AGC-BlockRMS-Adam",
        lambda clipping=0.5, threshold=1.0, **kw: eqxopt.Chain(
            eqxopt.AdaptiveGradClip(clipping),
            eqxopt.ClipByBlockRMS(threshold),
            eqxopt.Adam(**{"learning_rate": 0.05, **kw}),
        ),
        vary=("clipping", 0.01),
        invalid=(("clipping", 0.0), ("threshold", 0.0)),
    ),
    CatalogCase(
        "Chain-Adam-DecoupledWeightDecay",
        lambda weight_decay=0.1, **kw: eqxopt.Chain(
            eqxopt.Adam(**{"learning_rate": 0.05, **kw}),
            eqxopt.DecoupledWeightDecay(0.05, weight_decay, mask=_everything),
        ),
        vary=("weight_decay", 1.0),
        invalid=(("weight_decay", -0.1),),
    ),
    CatalogCase(
        "Chain-ClipByValue-Centralize-AddNoise-AddDecayedWeights-SGD",
        lambda eta=0.01, weight_decay=0.01, **kw: eqxopt.Chain(
            eqxopt.ClipByValue(5.0),
            eqxopt.Centralize(),
            eqxopt.AddNoise(eta, seed=1),
            eqxopt.AddDecayedWeights(weight_decay),
            eqxopt.SGD(**{"learning_rate": 0.05, **kw}),
        ),
        vary=("eta", 0.5),
        invalid=(("eta", -1.0), ("weight_decay", -1.0)),
    ),
    CatalogCase(
        "MultiSteps-SGD",
        lambda **kw: eqxopt.MultiSteps(
            eqxopt.SGD(**{"learning_rate": 0.05, "momentum": 0.5, **kw}), every_k=2
        ),
        vary=("learning_rate", 0.01),
        invalid=(("momentum", 1.0),),
    ),
    CatalogCase(
        "Lookahead-Adam",
        lambda alpha=0.5, **kw: eqxopt.Lookahead(
            eqxopt.Adam(**{"learning_rate": 0.05, **kw}), sync_period=2, alpha=alpha
        ),
        vary=("alpha", 0.9),
        invalid=(("alpha", 1.5), ("alpha", -0.1)),
    ),
    CatalogCase(
        # One replica (no axis_name): the outer Nesterov step on its own distance
        # from the anchor every 2 steps (momentum 0.5: the paper's 0.9 is for
        # hundreds of inner steps a round, and overshoots at 2).
        "DiLoCo-Adam",
        lambda **kw: eqxopt.DiLoCo(
            eqxopt.Adam(**{"learning_rate": 0.05, **kw}),
            sync_every=2,
            outer=eqxopt.SGD(0.7, momentum=0.5, nesterov=True),
        ),
        vary=("learning_rate", 0.01),
        invalid=(("learning_rate", -0.1), ("b1", 1.0)),
    ),
    CatalogCase(
        "ParamEMA-SGD",
        lambda decay=0.9, **kw: eqxopt.ParamEMA(
            eqxopt.SGD(**{"learning_rate": 0.05, **kw}), decay=decay
        ),
        vary=("learning_rate", 0.01),
        invalid=(("decay", 1.5), ("decay", -0.5)),
    ),
    CatalogCase(
        "SWA-SGD",
        lambda start=2, every=2, **kw: eqxopt.SWA(
            eqxopt.SGD(**{"learning_rate": 0.05, "momentum": 0.5, **kw}),
            start=start,
            every=every,
        ),
        vary=("learning_rate", 0.01),
        invalid=(("start", -1), ("every", 0)),
    ),
    CatalogCase(
        "SkipNonFinite-ZeroNans-Adam",
        lambda **kw: eqxopt.SkipNonFinite(
            eqxopt.Chain(
                eqxopt.ZeroNans(), eqxopt.Adam(**{"learning_rate": 0.05, **kw})
            ),
            max_consecutive_errors=2,
        ),
        vary=("b1", 0.5),
        invalid=(("b1", 1.0),),
    ),
    CatalogCase(
        "Partition-AdamW-Adam",
        lambda weight_decay=0.1, **kw: eqxopt.Partition(
            {
                "matrix": eqxopt.AdamW(0.05, weight_decay=weight_decay),
                "other": eqxopt.Adam(**{"learning_rate": 0.05, **kw}),
            },
            labels=_by_rank,
        ),
        vary=("weight_decay", 1.0),
        invalid=(("weight_decay", -1.0), ("learning_rate", -1.0)),
    ),
    CatalogCase(
        "Freeze-Adam",
        lambda **kw: eqxopt.Freeze(
            eqxopt.Adam(**{"learning_rate": 0.05, **kw}),
            frozen=_nothing,
        ),
        vary=("b2", 0.9),
    ),
    CatalogCase(
        "Chain-SGD-ReduceOnPlateau",
        lambda factor=0.5, **kw: eqxopt.Chain(
            eqxopt.SGD(**{"learning_rate": 0.05, **kw}),
            eqxopt.ReduceOnPlateau(factor=factor, patience=0),
        ),
        vary=("learning_rate", 0.01),
        invalid=(("factor", 1.0), ("factor", 0.0)),
        extra=_loss_value,
    ),
]
