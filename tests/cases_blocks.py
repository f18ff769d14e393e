"""Catalog cases for the composable building blocks (`_transforms/_blocks.py`): each
optimizer written as a chain of blocks, run through the shared property suite."""

import jax

import eqxopt
from catalog import CatalogCase


# A module-level function: the same static value in every Stateless built.
def _halve(updates, params):
    return jax.tree.map(lambda u: 0.5 * u, updates)


def _negate(updates, params):
    return jax.tree.map(lambda u: -u, updates)


# Vectors and scalars (biases, scales) at half the learning rate.
def _half_below_matrices(params):
    return jax.tree.map(lambda p: 0.5 if getattr(p, "ndim", 0) < 2 else 1.0, params)


CASES = [
    CatalogCase(
        "Blocks-AdamW-as-chain",
        lambda b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01, learning_rate=0.05: (
            eqxopt.Chain(
                eqxopt.ScaleByAdam(b1, b2, eps),
                eqxopt.AddDecayedWeights(weight_decay),
                eqxopt.ScaleByLearningRate(learning_rate),
            )
        ),
        vary=("b1", 0.8),
        invalid=(("b1", 1.0), ("b2", 0.0), ("eps", 0.0), ("learning_rate", -1.0)),
    ),
    CatalogCase(
        "Blocks-Rms-Sign-Trace-TrustRatio-Stateless",
        lambda decay=0.5, trust_coefficient=0.5, learning_rate=0.01: eqxopt.Chain(
            eqxopt.ScaleByRms(0.9, bias_correction=True),
            eqxopt.ScaleBySign(),
            eqxopt.Trace(decay, nesterov=True),
            eqxopt.ScaleByTrustRatio(trust_coefficient=trust_coefficient),
            eqxopt.Stateless(_halve),
            eqxopt.Identity(),
            eqxopt.ScaleByLearningRate(learning_rate),
        ),
        # Not `decay`: under a constant gradient the trace is a multiple of the sign,
        # which the trust ratio scales away.
        vary=("trust_coefficient", 0.25),
        invalid=(("decay", 1.5), ("trust_coefficient", -1.0)),
    ),
    # The per-parameter wrappers in one case (each case costs seconds in make test).
    CatalogCase(
        "Monitor-SkipLargeUpdates-LearningRateMultipliers-Maximize-AdamW",
        lambda max_squared_norm=1e6, **kw: eqxopt.Monitor(
            eqxopt.SkipLargeUpdates(
                eqxopt.LearningRateMultipliers(
                    eqxopt.Chain(
                        # negated twice: the chain still descends
                        eqxopt.Stateless(_negate),
                        eqxopt.Maximize(
                            eqxopt.AdamW(
                                **{"learning_rate": 0.05, "weight_decay": 0.01, **kw}
                            )
                        ),
                    ),
                    _half_below_matrices,
                ),
                max_squared_norm,
            )
        ),
        vary=("learning_rate", 0.01),
        invalid=(("max_squared_norm", 0.0), ("weight_decay", -0.1), ("b2", 1.0)),
    ),
]
