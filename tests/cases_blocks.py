"""Catalog cases for the composable building blocks (`_transforms/_blocks.py`): each
optimizer written as a chain of blocks, run through the shared property suite."""

import jax

import eqxopt
from catalog import CatalogCase


# A module-level function: the same static value in every Stateless built.
def _halve(updates, params):
    return jax.tree.map(lambda u: 0.5 * u, updates)


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
        vary=("decay", 0.9),
        invalid=(("decay", 1.5), ("trust_coefficient", -1.0)),
    ),
]
