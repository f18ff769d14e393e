"""The parameter-free and adaptive-step optimizers (DoG, DoWG, COCOB, ASGD, MADGRAD,
D-Adaptation, Momo) against optax.contrib, torch.optim.ASGD, or NumPy
transcriptions of the authors' code, over many steps on a nested tree."""

import jax
import jax.numpy as jnp
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

STEPS = 40
PARAMS = nested_tree()
GRADS = list(grad_stream(PARAMS, STEPS))
TARGETS = nested_tree(seed=7)


def loss(params):
    return sum(
        jnp.sum((p - t) ** 2)
        for p, t in zip(jax.tree.leaves(params), jax.tree.leaves(TARGETS))
    )


LOSS_AND_GRAD = jax.jit(jax.value_and_grad(loss))


def matrices(params):
    return jax.tree.map(lambda x: x.ndim >= 2, params)


# ------------------------------------------------------------------------------------
# DoG and DoWG
# ------------------------------------------------------------------------------------

# Whole-tree norms, a square root and a division per step in float32.
GLOBAL_RTOL, GLOBAL_ATOL = 1e-4, 1e-5


@pytest.mark.parametrize(
    "kind, value", [("heuristic", 1e-2), ("distance", 0.5), ("learning_rate", 0.1)]
)
def test_dog_matches_optax(kind, value):
    opt = eqxopt.DoG(init_step=kind, init_value=value)
    tx = optax.contrib.dog(init_step=(kind, value))
    assert_histories_close(
        run_eqxopt(opt, PARAMS, GRADS),
        run_optax(tx, PARAMS, GRADS),
        rtol=GLOBAL_RTOL,
        atol=GLOBAL_ATOL,
    )


def test_dog_with_schedule_weight_decay_and_mask_matches_optax():
    schedule = eqxopt.WarmupCosine(1.0, 0.1, 5, STEPS)
    opt = eqxopt.DoG(
        schedule, init_value=1e-2, eps=1e-6, weight_decay=0.1, mask=matrices
    )
    tx = optax.contrib.dog(
        lambda n: schedule(jnp.asarray(n, jnp.int32)),
        init_step=("heuristic", 1e-2),
        eps=1e-6,
        weight_decay=0.1,
        mask=matrices,
    )
    assert_histories_close(
        run_eqxopt(opt, PARAMS, GRADS),
        run_optax(tx, PARAMS, GRADS),
        rtol=GLOBAL_RTOL,
        atol=GLOBAL_ATOL,
    )


@pytest.mark.parametrize("init", [None, 0.3])
def test_dowg_matches_optax(init):
    opt = eqxopt.DoWG(init_estim_sq_dist=init, weight_decay=0.05, mask=matrices)
    tx = optax.contrib.dowg(init_estim_sq_dist=init, weight_decay=0.05, mask=matrices)
    assert_histories_close(
        run_eqxopt(opt, PARAMS, GRADS),
        run_optax(tx, PARAMS, GRADS),
        rtol=GLOBAL_RTOL,
        atol=GLOBAL_ATOL,
    )


def test_dog_and_dowg_errors_name_the_argument():
    with pytest.raises(ValueError, match="init_step must be one of"):
        eqxopt.DoG(init_step="guess")
    with pytest.raises(ValueError, match="init_value"):
        eqxopt.DoG(init_value=0.0)
    with pytest.raises(ValueError, match="eps"):
        eqxopt.DoG(eps=-1.0)
    with pytest.raises(ValueError, match="init_estim_sq_dist"):
        eqxopt.DoWG(init_estim_sq_dist=0.0)
    with pytest.raises(ValueError, match="eps"):
        eqxopt.DoWG(eps=0.0)
    with pytest.raises(ValueError, match="weight_decay"):
        eqxopt.DoWG(weight_decay=-0.1)


# ------------------------------------------------------------------------------------
# COCOB
# ------------------------------------------------------------------------------------


def test_cocob_matches_optax():
    opt = eqxopt.COCOB(alpha=50.0, weight_decay=0.01, mask=matrices)
    tx = optax.contrib.cocob(alpha=50.0, weight_decay=0.01, mask=matrices)
    assert_histories_close(run_eqxopt(opt, PARAMS, GRADS), run_optax(tx, PARAMS, GRADS))


def test_cocob_with_schedule_matches_optax():
    schedule = eqxopt.WarmupCosine(1.0, 0.5, 5, STEPS)
    opt = eqxopt.COCOB(schedule, eps=1e-6)
    tx = optax.contrib.cocob(lambda n: schedule(jnp.asarray(n, jnp.int32)), eps=1e-6)
    assert_histories_close(run_eqxopt(opt, PARAMS, GRADS), run_optax(tx, PARAMS, GRADS))


def test_cocob_errors_name_the_argument():
    with pytest.raises(ValueError, match="alpha"):
        eqxopt.COCOB(alpha=0.0)
    with pytest.raises(ValueError, match="eps"):
        eqxopt.COCOB(eps=0.0)
    with pytest.raises(TypeError, match=r"eps.*not a schedule"):
        eqxopt.COCOB(eps=eqxopt.Constant(1e-8))
