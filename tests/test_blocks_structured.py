"""The structured building blocks (`ScaleByRprop`, `ScaleBySm3`, `ScaleByStddev`,
`ScaleByFactoredRms`, `ScaleByParamBlockNorm`, `ScaleByParamBlockRms`,
`ScaleByOptimisticGradient`, `ScaleByPolyak`, `ScaleByDistanceOverGradients`)
against optax's `scale_by_*` over 25 steps on a tree of matrices, vectors and a
3-d leaf, and chained with `ScaleByLearningRate` against the fused optimizers that
share their maths. Measured in float32 on CPU: the largest difference from optax
is 3.1e-6 absolute on updates of order 1 (1.2e-6 relative); relative ones up to
1.7e-4 only on elements within 1e-3 of zero, 1e-7 absolute. Tolerance: rtol=2e-5,
atol=1e-6 against optax, rtol=1e-6, atol=1e-7 against the fused optimizers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt

optax = pytest.importorskip("optax")

STEPS = 25
RTOL, ATOL = 2e-5, 1e-6


def _params():
    keys = jax.random.split(jax.random.key(0), 4)
    return {
        "w": jax.random.normal(keys[0], (6, 4)),
        "b": jax.random.normal(keys[1], (4,)),
        "c": jax.random.normal(keys[2], (3, 5, 2)),
        "v": jax.random.normal(keys[3], (7,)),
    }


def _grads(params, k):
    # Gradients of a quadratic plus noise, so signs flip now and then (Rprop).
    key = jax.random.fold_in(jax.random.key(1), k)
    keys = jax.random.split(key, len(params))
    return {
        name: 0.5 * p + jax.random.normal(kk, p.shape)
        for kk, (name, p) in zip(keys, sorted(params.items()))
    }


def _loss(params):
    return 1.0 + 0.5 * sum(jnp.sum(p * p) for p in jax.tree.leaves(params))


def _run(ours, theirs, value=False, steps=STEPS):
    """Both transforms' updates on the same gradients and parameters (moved by
    optax's updates), step by step: two lists of update trees and optax's
    states."""
    params = _params()
    state, ref_state = ours.init(params), theirs.init(params)
    got, want, ref_states = [], [], []
    for k in range(steps):
        grads = _grads(params, k)
        extra = {"value": _loss(params)} if value else {}
        u, state = ours.update(grads, state, params, **extra)
        # optax's bias correction powers a float by an int32 count.
        with jax.numpy_dtype_promotion("standard"):
            r, ref_state = theirs.update(grads, ref_state, params, **extra)
        got.append(u)
        want.append(r)
        ref_states.append(ref_state)
        params = jax.tree.map(lambda p, d: p - 0.05 * d, params, r)
    return got, want, ref_states


def _close(got, want, rtol=RTOL, atol=ATOL):
    for k, (a, b) in enumerate(zip(got, want)):
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            np.testing.assert_allclose(
                np.asarray(x),
                np.reshape(np.asarray(y), np.shape(x)),
                rtol,
                atol,
                err_msg=f"step {k}",
            )


def _offset_decay(step, decay_rate):
    t = jnp.asarray(step).astype(jnp.float32) + 2.0
    return jnp.minimum(0.9, 1.0 - t ** (-decay_rate))


# fmt: off
CASES = [
    ("sm3", lambda: eqxopt.ScaleBySm3(), lambda: optax.scale_by_sm3()),
    ("sm3-decayed", lambda: eqxopt.ScaleBySm3(0.5, 0.9, 1e-6),
     lambda: optax.scale_by_sm3(0.5, 0.9, 1e-6)),
    ("stddev", lambda: eqxopt.ScaleByStddev(), lambda: optax.scale_by_stddev()),
    ("stddev-options", lambda: eqxopt.ScaleByStddev(0.8, 1e-3, 0.5, False, True),
     lambda: optax.scale_by_stddev(0.8, 1e-3, 0.5, False, True)),
    # The first bias-corrected variance is 0 up to rounding: an eps well above
    # that keeps the comparison about the maths, not the rounding.
    ("stddev-bias", lambda: eqxopt.ScaleByStddev(0.9, 1.0, 0.0, True, True),
     lambda: optax.scale_by_stddev(0.9, 1.0, 0.0, True, True)),
    ("factored-rms", lambda: eqxopt.ScaleByFactoredRms(min_dim_size_to_factor=3),
     lambda: optax.scale_by_factored_rms(min_dim_size_to_factor=3)),
    ("factored-rms-options",
     lambda: eqxopt.ScaleByFactoredRms(True, 0.6, 0, 2, 1e-20, _offset_decay),
     lambda: optax.scale_by_factored_rms(True, 0.6, 0, 2, 1e-20, _offset_decay)),
    ("factored-rms-unfactored", lambda: eqxopt.ScaleByFactoredRms(False),
     lambda: optax.scale_by_factored_rms(False)),
    ("param-block-norm", lambda: eqxopt.ScaleByParamBlockNorm(),
     lambda: optax.scale_by_param_block_norm()),
    ("param-block-norm-floor", lambda: eqxopt.ScaleByParamBlockNorm(3.0),
     lambda: optax.scale_by_param_block_norm(3.0)),
    ("param-block-rms", lambda: eqxopt.ScaleByParamBlockRms(),
     lambda: optax.scale_by_param_block_rms()),
    ("param-block-rms-floor", lambda: eqxopt.ScaleByParamBlockRms(1.0),
     lambda: optax.scale_by_param_block_rms(1.0)),
    ("optimistic", lambda: eqxopt.ScaleByOptimisticGradient(),
     lambda: optax.scale_by_optimistic_gradient()),
    ("optimistic-options", lambda: eqxopt.ScaleByOptimisticGradient(0.5, 2.0),
     lambda: optax.scale_by_optimistic_gradient(0.5, 2.0)),
    ("dog", lambda: eqxopt.ScaleByDistanceOverGradients(),
     lambda: optax.scale_by_distance_over_gradients()),
    ("dog-options",
     lambda: eqxopt.ScaleByDistanceOverGradients(1e-3, 1e-6, jnp.float32, -0.5),
     lambda: optax.scale_by_distance_over_gradients(1e-3, 1e-6, jnp.float32, -0.5)),
    # optax's sign, +H g (issue 39, item 11: LBFGS(linesearch=False) gives -lr H g)
    ("lbfgs", lambda: eqxopt.ScaleByLBFGS(), lambda: optax.scale_by_lbfgs()),
    ("lbfgs-options", lambda: eqxopt.ScaleByLBFGS(4, False),
     lambda: optax.scale_by_lbfgs(4, False)),
]
# fmt: on


@pytest.mark.parametrize("name, ours, theirs", CASES, ids=[c[0] for c in CASES])
def test_block_matches_optax(name, ours, theirs):
    got, want, _ = _run(ours(), theirs())
    _close(got, want)


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (eqxopt.ScaleByPolyak, optax.scale_by_polyak),
        (
            lambda: eqxopt.ScaleByPolyak(2.0, 0.5, 1e-3, "sps+"),
            lambda: optax.scale_by_polyak(2.0, 0.5, 1e-3, "sps+"),
        ),
    ],
)
def test_polyak_matches_optax(ours, theirs):
    got, want, _ = _run(ours(), theirs(), value=True)
    _close(got, want)


def test_rprop_is_optax_one_call_earlier():
    # optax.scale_by_rprop returns each update one call late (see the docstring):
    # its state holds the update computed at this call, which eqxopt returns now.
    got, want, states = _run(
        eqxopt.ScaleByRprop(0.01, 0.4, 1.3, 1e-4, 1.0),
        optax.scale_by_rprop(0.01, 0.4, 1.3, 1e-4, 1.0),
    )
    _close(got, [s.prev_updates for s in states])
    params = _params()
    state = eqxopt.ScaleByRprop(0.01, 0.4, 1.3, 1e-4, 1.0).init(params)
    assert jax.tree.structure(state.step_sizes) == jax.tree.structure(params)
    # And optax's update at call k + 1 is eqxopt's at k, zeroed where it flips.
    flipped = 0
    for k in range(STEPS - 1):
        grads_next = jax.tree.map(jnp.sign, got[k + 1])
        for ours, theirs, sign in zip(
            jax.tree.leaves(got[k]),
            jax.tree.leaves(want[k + 1]),
            jax.tree.leaves(grads_next),
        ):
            # Where eqxopt's next update is 0, the sign flipped (or g was 0).
            expected = jnp.where(sign == 0, 0.0, ours)
            flipped += int(jnp.sum(sign == 0))
            np.testing.assert_allclose(theirs, expected, RTOL, ATOL)
    assert flipped > 0  # the test saw sign flips


def _chain_vs_fused(chain, fused, params, value=False, steps=STEPS):
    s1, s2 = chain.init(params), fused.init(params)
    p1 = p2 = params
    for k in range(steps):
        grads = _grads(p1, k)
        extra = {"value": _loss(p1)} if value else {}
        p1, s1 = chain.step(grads, s1, p1, **extra)
        p2, s2 = fused.step(grads, s2, p2, **extra)
    _close([p1], [p2], rtol=1e-6, atol=1e-7)
    return p1, params


@pytest.mark.parametrize(
    "chain, fused",
    [
        (
            eqxopt.Chain(
                eqxopt.ScaleByRprop(0.01, 0.4, 1.3), eqxopt.ScaleByLearningRate(1.0)
            ),
            eqxopt.Rprop(0.01, 0.4, 1.3),
        ),
        (
            eqxopt.Chain(eqxopt.ScaleBySm3(0.7), eqxopt.ScaleByLearningRate(0.1)),
            eqxopt.SM3(0.1, 0.7),
        ),
        (
            eqxopt.Chain(
                eqxopt.ScaleByOptimisticGradient(0.8, 0.5),
                eqxopt.ScaleByLearningRate(0.05),
            ),
            eqxopt.OptimisticGradientDescent(0.05, 0.8, 0.5),
        ),
        (
            eqxopt.Chain(eqxopt.ScaleByLBFGS(5), eqxopt.ScaleByLearningRate(0.05)),
            eqxopt.LBFGS(0.05, 5, linesearch=False),
        ),
        (
            eqxopt.Chain(
                eqxopt.ScaleByFactoredRms(min_dim_size_to_factor=3),
                eqxopt.ScaleByLearningRate(0.01),
            ),
            eqxopt.Adafactor(
                0.01,
                min_dim_size_to_factor=3,
                multiply_by_parameter_scale=False,
                clipping_threshold=None,
            ),
        ),
    ],
    ids=["rprop", "sm3", "optimistic", "lbfgs", "factored-rms"],
)
def test_chain_is_the_fused_optimizer(chain, fused):
    moved, start = _chain_vs_fused(chain, fused, _params())
    assert not np.allclose(moved["w"], start["w"])


def test_polyak_chain_is_polyak_sgd():
    chain = eqxopt.Chain(
        eqxopt.ScaleByPolyak(0.5, 2.0, 1e-4, "sps+"), eqxopt.ScaleByLearningRate(0.3)
    )
    fused = eqxopt.PolyakSGD(2.0, 0.3, 0.5, 1e-4, "sps+")
    _chain_vs_fused(chain, fused, _params(), value=True)


def test_dog_chain_is_dog_on_one_leaf():
    # DoG's sums are over the whole tree, the block's over each leaf: the same on
    # a model of one leaf.
    params = {"w": _params()["w"]}
    chain = eqxopt.Chain(
        eqxopt.ScaleByDistanceOverGradients(1e-3), eqxopt.ScaleByLearningRate(0.5)
    )
    fused = eqxopt.DoG(0.5, init_step="heuristic", init_value=1e-3)
    _chain_vs_fused(chain, fused, params)


def test_polyak_needs_the_loss():
    params = _params()
    block = eqxopt.ScaleByPolyak()
    state = block.init(params)
    with pytest.raises(TypeError, match="ScaleByPolyak needs the loss"):
        block.update(_grads(params, 0), state, params)
    with pytest.raises(ValueError, match="value must be the scalar loss"):
        block.update(_grads(params, 0), state, params, value=jnp.ones(2))


def test_states_are_named():
    params = _params()
    sm3 = eqxopt.ScaleBySm3().init(params)
    assert sm3.accumulators["w"].shape == (10,)
    assert sm3.momentum["w"].shape == (6, 4)
    factored = eqxopt.ScaleByFactoredRms(min_dim_size_to_factor=3).init(params)
    # (6, 4): averaged over its largest axis (6) and over its other one (4)
    assert factored.v_row["w"].shape == (4,) and factored.v_col["w"].shape == (6,)
    assert factored.v["w"] is None
    assert factored.v["b"].shape == (4,)
    dog = eqxopt.ScaleByDistanceOverGradients().init(params)
    assert dog.max_dist["w"].shape == () and dog.init_params["w"].shape == (6, 4)
    assert isinstance(eqxopt.ScaleByStddev().init(params), eqxopt.ScaleByStddevState)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: eqxopt.ScaleByRprop(0.0), "learning_rate"),
        (lambda: eqxopt.ScaleByRprop(0.1, eta_minus=1.0), "eta_minus"),
        (lambda: eqxopt.ScaleByRprop(0.1, eta_plus=1.0), "eta_plus"),
        (lambda: eqxopt.ScaleByRprop(0.1, min_step_size=-1.0), "min_step_size"),
        (
            lambda: eqxopt.ScaleByRprop(0.1, min_step_size=2.0, max_step_size=1.0),
            "min_step_size must be <= max_step_size",
        ),
        (lambda: eqxopt.ScaleBySm3(1.0), "b1"),
        (lambda: eqxopt.ScaleBySm3(b2=1.5), "b2"),
        (lambda: eqxopt.ScaleBySm3(eps=-1.0), "eps"),
        (lambda: eqxopt.ScaleByStddev(1.0), "decay"),
        (lambda: eqxopt.ScaleByStddev(eps=0.0), "eps"),
        (lambda: eqxopt.ScaleByStddev(initial_scale=-1.0), "initial_scale"),
        (lambda: eqxopt.ScaleByFactoredRms(decay_rate=-1.0), "decay_rate"),
        (lambda: eqxopt.ScaleByFactoredRms(step_offset=-1), "step_offset"),
        (
            lambda: eqxopt.ScaleByFactoredRms(min_dim_size_to_factor=0),
            "min_dim_size_to_factor",
        ),
        (lambda: eqxopt.ScaleByFactoredRms(epsilon=0.0), "epsilon"),
        (lambda: eqxopt.ScaleByParamBlockNorm(-1.0), "min_scale"),
        (lambda: eqxopt.ScaleByParamBlockRms(-1.0), "min_scale"),
        (lambda: eqxopt.ScaleByOptimisticGradient(-1.0), "alpha"),
        (lambda: eqxopt.ScaleByOptimisticGradient(beta=-1.0), "beta"),
        (lambda: eqxopt.ScaleByPolyak(max_learning_rate=0.0), "max_learning_rate"),
        (lambda: eqxopt.ScaleByPolyak(eps=-1.0), "eps"),
        (lambda: eqxopt.ScaleByPolyak(variant="sgd"), "variant"),
        (lambda: eqxopt.ScaleByDistanceOverGradients(0.0), "reps_rel"),
        (lambda: eqxopt.ScaleByDistanceOverGradients(eps=-1.0), "eps"),
    ],
)
def test_invalid_values_name_the_argument(make, match):
    with pytest.raises(ValueError, match=f"^{match}"):
        make()


def test_invalid_types_name_the_argument():
    with pytest.raises(TypeError, match=r"^decay_rate_fn must be None or a function"):
        eqxopt.ScaleByFactoredRms(decay_rate_fn=0.5)
    with pytest.raises(TypeError, match="param_dtype"):
        eqxopt.ScaleByDistanceOverGradients(param_dtype="not a dtype")
