"""The adaptive building blocks (`ScaleByAdamax`, `ScaleByYogi`, ...) against optax's
`scale_by_*` over 30 steps, each chained with a learning rate against the fused
eqxopt optimizer whose per-leaf maths it shares, and their argument checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt
from helpers import (
    assert_histories_close,
    enable_x64,
    grad_stream,
    nested_tree,
    run_eqxopt,
    run_optax,
)

optax = pytest.importorskip("optax")

STEPS = 30
LR = 0.01

# (id, eqxopt block, optax transform, x64): the same arguments on both sides, by
# position where optax takes them so. RAdam runs in float64, where optax's `rho_t`
# does not cancel (in float32 its `r` is off by ~1e-4 relative; see `ScaleByRadam`).
CASES = [
    ("adamax", lambda: eqxopt.ScaleByAdamax(0.8, 0.95, 1e-6),
     lambda: optax.scale_by_adamax(0.8, 0.95, 1e-6), False),
    ("amsgrad", lambda: eqxopt.ScaleByAmsgrad(0.8, 0.95, 1e-6, 1e-9),
     lambda: optax.scale_by_amsgrad(0.8, 0.95, 1e-6, 1e-9), False),
    ("amsgrad-uncorrected",
     lambda: eqxopt.ScaleByAmsgrad(0.8, 0.95, 1e-6, 0.0, None, False, False),
     lambda: optax.scale_by_amsgrad(0.8, 0.95, 1e-6, 0.0, None, False, False), False),
    ("adadelta", lambda: eqxopt.ScaleByAdadelta(0.8, 1e-4),
     lambda: optax.scale_by_adadelta(0.8, 1e-4), False),
    ("adan", lambda: eqxopt.ScaleByAdan(0.9, 0.85, 0.95, 1e-6, 1e-9),
     lambda: optax.scale_by_adan(0.9, 0.85, 0.95, 1e-6, 1e-9), False),
    ("belief", lambda: eqxopt.ScaleByBelief(0.8, 0.95, 1e-8, 1e-10),
     lambda: optax.scale_by_belief(0.8, 0.95, 1e-8, 1e-10), False),
    ("belief-nesterov", lambda: eqxopt.ScaleByBelief(nesterov=True),
     lambda: optax.scale_by_belief(nesterov=True), False),
    ("lion", lambda: eqxopt.ScaleByLion(0.8, 0.95),
     lambda: optax.scale_by_lion(0.8, 0.95), False),
    ("lion-smooth", lambda: eqxopt.ScaleByLion(mode="smooth", smooth_beta=2.0),
     lambda: optax.scale_by_lion(mode="smooth", smooth_beta=2.0), False),
    ("lion-refined", lambda: eqxopt.ScaleByLion(mode="refined"),
     lambda: optax.scale_by_lion(mode="refined"), False),
    ("novograd", lambda: eqxopt.ScaleByNovograd(0.8, 0.5, 1e-6, 1e-9, 0.01),
     lambda: optax.scale_by_novograd(0.8, 0.5, 1e-6, 1e-9, 0.01), False),
    ("radam", lambda: eqxopt.ScaleByRadam(0.8, 0.99, 1e-6, 1e-9, 5.0),
     lambda: optax.scale_by_radam(0.8, 0.99, 1e-6, 1e-9, 5.0), True),
    ("radam-nesterov", lambda: eqxopt.ScaleByRadam(nesterov=True),
     lambda: optax.scale_by_radam(nesterov=True), True),
    ("rss", lambda: eqxopt.ScaleByRss(0.5, 1e-6),
     lambda: optax.scale_by_rss(0.5, 1e-6), False),
    ("yogi", lambda: eqxopt.ScaleByYogi(0.8, 0.95, 1e-3, 1e-9, 1e-4),
     lambda: optax.scale_by_yogi(0.8, 0.95, 1e-3, 1e-9, 1e-4), False),
]  # fmt: skip

# The variants of a block run in `make test-slow` only.
SLOW = {
    "amsgrad-uncorrected",
    "belief-nesterov",
    "lion-refined",
    "radam-nesterov",
}


def _cases():
    return [
        pytest.param(*c, id=c[0], marks=[pytest.mark.slow] if c[0] in SLOW else [])
        for c in CASES
    ]


def _without_frozen(tree):
    return {k: v for k, v in tree.items() if k != "frozen"}


@pytest.mark.parametrize("name,ours,theirs,x64", _cases())
def test_block_matches_optax(name, ours, theirs, x64):
    # Each block followed by the same learning rate, so the parameters move. eqxopt's
    # tree has one more leaf, `frozen`, whose gradient is always None: it must stay
    # as it is, and the other leaves must follow optax's run without it.
    with enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        params = nested_tree(dtype=dtype)
        grads = list(grad_stream(params, STEPS))
        expected = run_optax(optax.chain(theirs(), optax.scale(-LR)), params, grads)
        frozen = jnp.arange(3.0, dtype=dtype)
        opt = eqxopt.Chain(ours(), eqxopt.ScaleByLearningRate(LR))
        actual = run_eqxopt(
            opt,
            {**params, "frozen": frozen},
            [{**g, "frozen": None} for g in grads],
        )
        for step in actual:
            np.testing.assert_array_equal(step["frozen"], frozen)
        # float32: a few ulps per step over 30 steps (measured below 1e-6 relative
        # but for Nesterov's estimates, which cancel near zero, as for Adam's).
        rtol, atol = (1e-10, 1e-12) if x64 else (2e-5, 2e-6)
        if "nesterov" in name and not x64:
            atol = 1e-5
        assert_histories_close(
            [_without_frozen(p) for p in actual], expected, rtol=rtol, atol=atol
        )


def test_none_gradient_leaves_the_state_alone():
    params = {"w": jnp.ones(3), "frozen": jnp.ones(2)}
    grads = {"w": jnp.full(3, 0.5), "frozen": None}
    for block in (eqxopt.ScaleByYogi(), eqxopt.ScaleByNovograd(), eqxopt.ScaleByAdan()):
        state = block.init(params)
        updates, new = block.update(grads, state, params)
        assert updates["frozen"] is None
        for field in ("mu", "nu"):
            before = getattr(state, field)["frozen"]
            np.testing.assert_array_equal(getattr(new, field)["frozen"], before)


def test_novograd_keeps_one_scalar_per_leaf():
    params = {"w": jnp.ones((3, 4)), "b": jnp.ones(4), "n": jnp.arange(2)}
    state = eqxopt.ScaleByNovograd().init(params)
    assert state.nu["w"].shape == () and state.nu["b"].shape == ()
    assert state.nu["n"] is None and state.mu["w"].shape == (3, 4)
    assert not eqxopt.ScaleByNovograd.elementwise


def _decayed(block, wd, lr=LR):
    return eqxopt.Chain(
        block, eqxopt.AddDecayedWeights(wd), eqxopt.ScaleByLearningRate(lr)
    )


def _plain(block, lr=LR):
    return eqxopt.Chain(block, eqxopt.ScaleByLearningRate(lr))


# (id, chain of blocks, the fused eqxopt optimizer): the same numbers.
FUSED = [
    ("adamax", lambda: _plain(eqxopt.ScaleByAdamax(0.8, 0.95, 1e-6)),
     lambda: eqxopt.Adamax(LR, 0.8, 0.95, 1e-6)),
    ("adamaxw", lambda: _decayed(eqxopt.ScaleByAdamax(0.8, 0.95, 1e-6), 0.05),
     lambda: eqxopt.AdamaxW(LR, 0.8, 0.95, 1e-6, 0.05)),
    ("amsgrad", lambda: _decayed(eqxopt.ScaleByAmsgrad(0.8, 0.95, 1e-6, 1e-9), 0.05),
     lambda: eqxopt.AMSGrad(LR, 0.8, 0.95, 1e-6, eps_root=1e-9, weight_decay=0.05)),
    ("amsgrad-uncorrected",
     lambda: _plain(eqxopt.ScaleByAmsgrad(0.8, 0.95, 1e-6, 0.0, None, False, False)),
     lambda: eqxopt.AMSGrad(LR, 0.8, 0.95, 1e-6, nu_correction="none",
                            bias_correction_mu=False)),
    # Adadelta's weight decay is coupled: added to the gradient first.
    ("adadelta",
     lambda: eqxopt.Chain(eqxopt.AddDecayedWeights(0.05),
                          eqxopt.ScaleByAdadelta(0.8, 1e-4),
                          eqxopt.ScaleByLearningRate(0.5)),
     lambda: eqxopt.Adadelta(0.5, 0.8, 1e-4, 0.05)),
    ("adan", lambda: _decayed(eqxopt.ScaleByAdan(0.9, 0.85, 0.95, 1e-6, 1e-9), 0.05),
     lambda: eqxopt.Adan(LR, 0.9, 0.85, 0.95, 1e-6, 1e-9, 0.05)),
    ("adabelief", lambda: _plain(eqxopt.ScaleByBelief(0.8, 0.95, 1e-8, 1e-10,
                                                      nesterov=True)),
     lambda: eqxopt.AdaBelief(LR, 0.8, 0.95, 1e-8, eps_root=1e-10, nesterov=True)),
    ("lion", lambda: _decayed(eqxopt.ScaleByLion(0.8, 0.95), 0.05),
     lambda: eqxopt.Lion(LR, 0.8, 0.95, weight_decay=0.05)),
    ("novograd", lambda: _plain(eqxopt.ScaleByNovograd(0.8, 0.5, 1e-6, 1e-9, 0.05)),
     lambda: eqxopt.NovoGrad(LR, 0.8, 0.5, 1e-6, weight_decay=0.05, eps_root=1e-9)),
    ("radam", lambda: _decayed(eqxopt.ScaleByRadam(0.8, 0.99, 1e-6, 1e-9, 4.0), 0.05),
     lambda: eqxopt.RAdam(LR, 0.8, 0.99, 1e-6, eps_root=1e-9, threshold=4.0,
                          weight_decay=0.05)),
    ("adagrad", lambda: _plain(eqxopt.ScaleByRss(0.5, 1e-6)),
     lambda: eqxopt.Adagrad(LR, 0.5, 1e-6)),
    ("yogi", lambda: _plain(eqxopt.ScaleByYogi(0.8, 0.95, 1e-3, 1e-9, 1e-4)),
     lambda: eqxopt.Yogi(LR, 0.8, 0.95, 1e-3, eps_root=1e-9,
                         initial_accumulator_value=1e-4)),
]  # fmt: skip


def test_chains_of_blocks_are_the_fused_optimizers():
    # One test for all twelve (each pair compiles two steps): the same per-leaf
    # functions on both sides, so the same numbers to a rounding or two.
    params = nested_tree()
    grads = list(grad_stream(params, STEPS))
    for name, chain, fused in FUSED:
        try:
            assert_histories_close(
                run_eqxopt(chain(), params, grads),
                run_eqxopt(fused(), params, grads),
                rtol=1e-6,
                atol=1e-7,
            )
        except AssertionError as err:
            raise AssertionError(f"{name}: {err}") from None


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: eqxopt.ScaleByAdamax(b1=1.0), "b1"),
        (lambda: eqxopt.ScaleByAdamax(b2=0.0), "b2"),
        (lambda: eqxopt.ScaleByAdamax(eps=0.0), "eps"),
        (lambda: eqxopt.ScaleByAmsgrad(eps_root=-1.0), "eps_root"),
        (lambda: eqxopt.ScaleByAdadelta(rho=1.0), "rho"),
        (lambda: eqxopt.ScaleByAdadelta(eps=0.0), "eps"),
        (lambda: eqxopt.ScaleByAdan(b3=1.0), "b3"),
        (lambda: eqxopt.ScaleByAdan(eps=0.0), "eps and eps_root must not both be 0"),
        (lambda: eqxopt.ScaleByBelief(eps_root=-1e-16), "eps_root"),
        (lambda: eqxopt.ScaleByLion(b2=1.0), "b2"),
        (lambda: eqxopt.ScaleByLion(mode="soft"), "mode must be one of"),
        (lambda: eqxopt.ScaleByLion(smooth_beta=0.0), "smooth_beta"),
        (lambda: eqxopt.ScaleByNovograd(weight_decay=-0.1), "weight_decay"),
        (lambda: eqxopt.ScaleByNovograd(b2=1.0), "b2"),
        (lambda: eqxopt.ScaleByRadam(threshold=-1.0), "threshold"),
        (lambda: eqxopt.ScaleByRss(-0.1), "initial_accumulator_value"),
        (lambda: eqxopt.ScaleByRss(eps=-1.0), "eps"),
        (lambda: eqxopt.ScaleByYogi(initial_accumulator_value=-1.0),
         "initial_accumulator_value"),
        (lambda: eqxopt.ScaleByYogi(eps=0.0), "eps"),
    ],
)  # fmt: skip
def test_invalid_values_name_the_argument(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_hyperparameters_are_traced():
    # A float option is an array field: a new value does not compile a new step.
    params = nested_tree()
    grads = next(grad_stream(params, 1))

    @jax.jit
    def run(block):
        state = block.init(params)
        return block.update(grads, state, params)[0]

    run(eqxopt.ScaleByRadam(0.8))
    size = run._cache_size()
    run(eqxopt.ScaleByRadam(0.7, threshold=3.0))
    assert run._cache_size() == size
