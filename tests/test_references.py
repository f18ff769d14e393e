"""SGD, Adam and AdamW against optax and torch.optim over many steps."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

import eqxopt
from helpers import (
    assert_histories_close,
    grad_stream,
    nested_tree,
    run_eqxopt,
    run_optax,
    run_torch,
)

STEPS = 30
SCHEDULE = dict(peak_lr=0.05, min_lr=0.005, warmup_steps=5, total_steps=25)


def optax_schedule():
    return optax.warmup_cosine_decay_schedule(
        0.0,
        SCHEDULE["peak_lr"],
        SCHEDULE["warmup_steps"],
        SCHEDULE["total_steps"],
        SCHEDULE["min_lr"],
    )


def lr_for(scheduled):
    return eqxopt.WarmupCosine(**SCHEDULE) if scheduled else 0.03


def optax_lr(scheduled):
    return optax_schedule() if scheduled else 0.03


CASES = {
    "sgd": (
        lambda lr: eqxopt.SGD(lr),
        lambda lr: optax.sgd(lr),
        lambda ps, lr: torch.optim.SGD(ps, lr=lr),
    ),
    "momentum": (
        lambda lr: eqxopt.SGD(lr, momentum=0.9),
        lambda lr: optax.sgd(lr, momentum=0.9),
        lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=0.9),
    ),
    "nesterov": (
        lambda lr: eqxopt.SGD(lr, momentum=0.8, nesterov=True),
        lambda lr: optax.sgd(lr, momentum=0.8, nesterov=True),
        lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=0.8, nesterov=True),
    ),
    "adam": (
        lambda lr: eqxopt.Adam(lr, b1=0.85, b2=0.99, eps=1e-7),
        lambda lr: optax.adam(lr, b1=0.85, b2=0.99, eps=1e-7),
        lambda ps, lr: torch.optim.Adam(ps, lr=lr, betas=(0.85, 0.99), eps=1e-7),
    ),
    "adamw": (
        lambda lr: eqxopt.AdamW(lr, b1=0.9, b2=0.995, eps=1e-8, weight_decay=0.1),
        lambda lr: optax.adamw(lr, b1=0.9, b2=0.995, eps=1e-8, weight_decay=0.1),
        lambda ps, lr: torch.optim.AdamW(
            ps, lr=lr, betas=(0.9, 0.995), eps=1e-8, weight_decay=0.1
        ),
    ),
}


@pytest.fixture(scope="module")
def problem():
    params = nested_tree(seed=3)
    return params, list(grad_stream(params, STEPS, seed=4))


@pytest.mark.parametrize("scheduled", [False, True], ids=["constant", "schedule"])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_optax(problem, name, scheduled):
    make, make_optax, _ = CASES[name]
    params, grads = problem
    ours = run_eqxopt(make(lr_for(scheduled)), params, grads)
    theirs = run_optax(make_optax(optax_lr(scheduled)), params, grads)
    assert_histories_close(ours, theirs, rtol=2e-6, atol=2e-7)


def _torch_with_schedule(make_torch, scheduled):
    """torch.optim with the learning rate of each step set from the schedule, which is
    how torch's LambdaLR feeds it (evaluated before the step)."""
    lrs = np.asarray(lr_for(True)(jnp.arange(STEPS)), np.float64) if scheduled else None

    def make(tensors):
        opt = make_torch(tensors, 0.0 if scheduled else 0.03)
        if not scheduled:
            return opt
        step = opt.step
        count = iter(range(STEPS))

        def scheduled_step():
            lr = float(lrs[next(count)])
            for group in opt.param_groups:
                group["lr"] = lr
            return step()

        opt.step = scheduled_step
        return opt

    return make


@pytest.mark.parametrize("scheduled", [False, True], ids=["constant", "schedule"])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch(problem, name, scheduled):
    make, _, make_torch = CASES[name]
    params, grads = problem
    ours = run_eqxopt(make(lr_for(scheduled)), params, grads)
    theirs = run_torch(_torch_with_schedule(make_torch, scheduled), params, grads)
    # torch folds bias corrections and decay in another order (p *= 1 - lr*wd first,
    # then addcdiv with lr / bc1): the same maths, rounded differently.
    assert_histories_close(ours, theirs, rtol=2e-5, atol=2e-6)


def test_step_equals_update_then_apply(problem):
    params, grads = problem
    opt = eqxopt.AdamW(eqxopt.WarmupCosine(**SCHEDULE), weight_decay=0.05)
    state_a = state_b = opt.init(params)
    p_a = p_b = params
    for g in grads[:10]:
        updates, state_a = opt.update(g, state_a, p_a)
        p_a = eqxopt.apply_updates(p_a, updates)
        p_b, state_b = opt.step(g, state_b, p_b)
    # One compiled program fuses the apply into the update (XLA may contract into
    # FMAs), so the two agree to the last bit or one ulp.
    for a, b in zip(jax.tree.leaves((p_a, state_a)), jax.tree.leaves((p_b, state_b))):
        np.testing.assert_allclose(a, b, rtol=3e-7, atol=1e-9)


def test_warmup_cosine_matches_optax_over_thousands_of_steps():
    steps = jnp.arange(0, 5000, dtype=jnp.int32)
    ours = eqxopt.WarmupCosine(3e-4, 3e-5, 500, 4000)(steps)
    with jax.numpy_dtype_promotion("standard"):  # optax promotes implicitly
        theirs = optax.warmup_cosine_decay_schedule(0.0, 3e-4, 500, 4000, 3e-5)(steps)
    np.testing.assert_allclose(ours, theirs, rtol=2e-6, atol=1e-10)


def test_warmup_cosine_with_zero_peak_is_zero_not_nan():
    values = eqxopt.WarmupCosine(0.0, 0.0, 10, 100)(jnp.arange(200))
    assert values.dtype == jnp.float32
    assert bool(jnp.all(values == 0.0))
    traced = jax.jit(lambda peak, s: eqxopt.WarmupCosine(peak, 0.0, 10, 100)(s))
    assert bool(jnp.all(traced(jnp.float32(0.0), jnp.arange(200)) == 0.0))
