"""ACProp and SimplifiedAdEMAMix against optax.contrib.

Every reference run is 30 steps on `nested_tree()` with the same gradient stream,
compared after every step at rtol 2e-5 / atol 2e-6 (float32 rounding; measured:
at most 4e-6 absolute on parameters of order 1).
"""

import optax
import pytest

import eqxopt
from helpers import (
    assert_histories_close,
    grad_stream,
    nested_tree,
    run_eqxopt,
    run_optax,
)

STEPS = 30
PARAMS = nested_tree()
GRADS = list(grad_stream(PARAMS, STEPS))
LR = 0.01

# (id, eqxopt optimizer, optax optimizer)
OPTAX_CASES = [
    ("ACProp", lambda: eqxopt.ACProp(LR), lambda: optax.contrib.acprop(LR)),
    (
        "ACProp-positional-decay",
        lambda: eqxopt.ACProp(LR, 0.8, 0.99, 1e-6, eps_root=1e-8, weight_decay=0.1),
        lambda: optax.contrib.acprop(LR, 0.8, 0.99, 1e-6, 1e-8, 0.1),
    ),
    (
        "SimplifiedAdEMAMix",
        lambda: eqxopt.SimplifiedAdEMAMix(LR),
        lambda: optax.contrib.simplified_ademamix(LR),
    ),
    (
        "SimplifiedAdEMAMix-positional-decay",
        lambda: eqxopt.SimplifiedAdEMAMix(
            LR, 0.9, 0.99, 2.0, 1e-6, eps_root=1e-8, weight_decay=0.1
        ),
        lambda: optax.contrib.simplified_ademamix(LR, 0.9, 0.99, 2.0, 1e-6, 1e-8, 0.1),
    ),
]


@pytest.mark.parametrize("case", OPTAX_CASES, ids=[c[0] for c in OPTAX_CASES])
def test_matches_optax(case):
    _, make_ours, make_ref = case
    assert_histories_close(
        run_eqxopt(make_ours(), PARAMS, GRADS), run_optax(make_ref(), PARAMS, GRADS)
    )


def test_simplified_ademamix_alpha_schedule_matches_optax():
    alpha = eqxopt.WarmupCosine(3.0, 0.5, 5, STEPS)
    ours = eqxopt.SimplifiedAdEMAMix(LR, alpha=alpha)
    ref = optax.contrib.simplified_ademamix(LR, alpha=lambda step: alpha(step))
    assert_histories_close(
        run_eqxopt(ours, PARAMS, GRADS), run_optax(ref, PARAMS, GRADS)
    )


@pytest.mark.parametrize(
    "make, argument",
    [
        (lambda: eqxopt.ACProp(LR, b2=1.0), "b2"),
        (lambda: eqxopt.ACProp(LR, eps_root=-1.0), "eps_root"),
        (lambda: eqxopt.SimplifiedAdEMAMix(LR, alpha=-1.0), "alpha"),
        (lambda: eqxopt.SimplifiedAdEMAMix(LR, weight_decay=-0.1), "weight_decay"),
    ],
)
def test_bad_values_name_the_argument(make, argument):
    with pytest.raises(ValueError, match=f"^{argument} must be"):
        make()
