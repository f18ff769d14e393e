"""PolarGrad against a NumPy float64 transcription of the authors' reference
(`PolarGrad.step` in timlautk/polargrad `polar_grad.py`: momentum first, or polar
first, the nuclear norm `<M, U>` times the polar factor, decoupled decay), with the
polar factor from NumPy's SVD and `Muon`'s AdamW (no Nesterov) for the other
leaves; the polar methods against each other; zero gradients; 8-bit momentum and
bf16 parameters; the errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt
from helpers import Trajectory, assert_histories_close, enable_x64, grad_stream

STEPS = 40
# float64: QDWH run to convergence and LAPACK's SVD against NumPy's SVD: largest
# difference measured 6e-16 (relative to 1 + |x|).
RTOL, ATOL = 1e-12, 1e-13
SHAPES = {"wide": (4, 9), "tall": (8, 3), "square": (5, 5), "stack": (2, 5, 3),
          "b": (6,)}  # fmt: skip
# The stack of matrices (last two axes) is selected; the vector gets AdamW.
MASK = {"wide": True, "tall": True, "square": True, "stack": True, "b": False}
SCHEDULE = eqxopt.WarmupCosine(0.02, 0.002, 5, STEPS)


def _start(dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.normal(size=s).astype(dtype) for k, s in SHAPES.items()}


def _polar_np(m):
    """The polar factor and nuclear norm of each matrix in the last two axes."""
    u, s, vh = np.linalg.svd(m, full_matrices=False)
    return u @ vh, s.sum(axis=-1)[..., None, None]


def reference(
    params,
    grads,
    lr,
    beta=0.95,
    weight_decay=0.0,
    polar_first=False,
    adam_b1=0.9,
    adam_b2=0.999,
    eps=1e-8,
    adam_weight_decay=0.0,
):
    """`polar_grad.py`'s step per matrix leaf (`lr` a float or a function of the
    step); AdamW on the others."""
    params = {k: np.asarray(v, np.float64) for k, v in params.items()}
    mu = {k: np.zeros_like(v) for k, v in params.items()}
    nu = {k: np.zeros_like(v) for k, v in params.items()}
    history = Trajectory(dict(params))
    for step, g in enumerate(grads):
        rate = lr(step) if callable(lr) else lr
        t = step + 1
        new = {}
        for k, p in params.items():
            gk = np.asarray(g[k], np.float64)
            if MASK[k]:
                if polar_first:
                    u, _ = _polar_np(gk)
                    nuclear = np.sum(gk * u, axis=(-2, -1), keepdims=True)
                    mu[k] = beta * mu[k] + (1 - beta) * u
                    d = nuclear * mu[k]
                else:
                    mu[k] = beta * mu[k] + (1 - beta) * gk
                    u, _ = _polar_np(mu[k])
                    d = np.sum(mu[k] * u, axis=(-2, -1), keepdims=True) * u
                new[k] = p - rate * (d + weight_decay * p)
            else:
                mu[k] = adam_b1 * mu[k] + (1 - adam_b1) * gk
                nu[k] = adam_b2 * nu[k] + (1 - adam_b2) * gk**2
                m_hat = mu[k] / (1 - adam_b1**t)
                v_hat = nu[k] / (1 - adam_b2**t)
                d = m_hat / (np.sqrt(v_hat) + eps)
                new[k] = p - rate * (d + adam_weight_decay * p)
        params = new
        history.append(dict(params))
    return history


def run(opt, params, grads):
    params = jax.tree.map(jnp.asarray, params)
    state = opt.init(params)
    history = []
    for g in grads:
        params, state = opt.step(g, state, params)
        history.append(params)
    return history


def _schedule(step):
    return float(SCHEDULE(jnp.asarray(step, jnp.int32)))


@pytest.mark.parametrize("method", ["qdwh", "svd"])
@pytest.mark.parametrize("polar_first", [False, True])
def test_matches_the_reference_in_float64(method, polar_first):
    with enable_x64():
        params = _start()
        grads = list(grad_stream(params, STEPS))
        kw = dict(beta=0.9, weight_decay=0.05, adam_weight_decay=0.02)
        expected = reference(params, grads, _schedule, polar_first=polar_first, **kw)
        opt = eqxopt.PolarGrad(
            SCHEDULE,
            polar_method=method,
            polar_first=polar_first,
            polar_mask=MASK,
            **kw,
        )
        assert_histories_close(run(opt, params, grads), expected, RTOL, ATOL)


def test_no_momentum_is_polargrad_and_the_default_mask_takes_matrices():
    """`beta=0`: the step is `lr * ||g||_* * polar(g)` (the paper's PolarGrad);
    without `polar_mask` the 2-D leaves are PolarGrad's, the rest AdamW's."""
    with enable_x64():
        params = {k: v for k, v in _start().items() if k != "stack"}
        grads = list(grad_stream(params, 10))
        expected = reference(params, grads, 0.01, beta=0.0)
        got = run(eqxopt.PolarGrad(0.01, beta=0.0), params, grads)
        assert_histories_close(got, expected, RTOL, ATOL)


def test_newton_schulz_converged_equals_the_polar_factor():
    """Newton-Schulz with the quintic whose fixed point is 1 (`(15, -10, 3) / 8`)
    and enough steps is the exact polar factor: the same run as the reference."""
    with enable_x64():
        params = _start()
        grads = list(grad_stream(params, 20))
        expected = reference(params, grads, 0.01, beta=0.9)
        opt = eqxopt.PolarGrad(
            0.01,
            beta=0.9,
            polar_method="newton_schulz",
            ns_steps=30,
            ns_coeffs=(15 / 8, -10 / 8, 3 / 8),
            polar_mask=MASK,
        )
        assert_histories_close(run(opt, params, grads), expected, RTOL, ATOL)


@pytest.mark.parametrize("polar_first", [False, True])
def test_polar_methods_agree(polar_first):
    """float32: QDWH and SVD agree to float32 rounding; Muon's Newton-Schulz (five
    steps of Jordan's coefficients, singular values only brought near 1) is close
    to them, and its nuclear norm `<M, O>` is of its own O."""
    params = _start(np.float32)
    grads = list(grad_stream(params, 20))

    def go(method):
        opt = eqxopt.PolarGrad(
            0.01, polar_method=method, polar_first=polar_first, polar_mask=MASK
        )
        return run(opt, params, grads)

    qdwh, svd, ns = go("qdwh"), go("svd"), go("newton_schulz")
    assert_histories_close(qdwh, svd, rtol=1e-5, atol=1e-6)  # 8e-8 measured
    moved = {k: np.abs(svd[-1][k] - params[k]).max() for k in params}
    for k in params:
        assert np.abs(ns[-1][k] - svd[-1][k]).max() < 0.4 * moved[k], k  # 0.25 measured


def test_qdwh_steps_caps_the_iterations():
    """Two QDWH iterations (the reference code's default) leave an ill-conditioned
    matrix's polar factor unconverged; the default converges."""
    g = np.diag([1.0, 1e-3, 1e-6]).astype(np.float32)
    params, grads = {"w": np.zeros((3, 3), np.float32)}, [{"w": jnp.asarray(g)}]
    # beta=0: the step is -lr * tr(H) * U with U the identity here
    converged = run(eqxopt.PolarGrad(1.0, beta=0.0), params, grads)[-1]["w"]
    capped = run(eqxopt.PolarGrad(1.0, beta=0.0, qdwh_steps=2), params, grads)
    nuclear = g.trace()
    np.testing.assert_allclose(converged, -nuclear * np.eye(3), rtol=1e-5, atol=1e-6)
    assert np.abs(capped[-1]["w"] - converged).max() > 1e-2


def test_svd_takes_the_partial_isometry_of_a_rank_deficient_matrix():
    """A rank-one gradient `g = a b^T`: its polar factor by SVD is `g / ||g||` and
    its nuclear norm `||g||`, so without momentum the step is gradient descent's."""
    rng = np.random.default_rng(5)
    g = np.outer(rng.normal(size=6), rng.normal(size=4)).astype(np.float32)
    params, grads = {"w": np.zeros((6, 4), np.float32)}, [{"w": jnp.asarray(g)}]
    opt = eqxopt.PolarGrad(0.1, beta=0.0, polar_method="svd")
    step = run(opt, params, grads)[-1]["w"]
    np.testing.assert_allclose(step, -0.1 * g, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["qdwh", "svd", "newton_schulz"])
@pytest.mark.parametrize("polar_first", [False, True])
def test_a_leaf_of_zeros_takes_no_step(method, polar_first):
    """Zero gradients (and zero momentum): the polar factor of a matrix of zeros is
    zero, so no step and no NaN; later gradients then move it as usual."""
    params = {"w": np.ones((4, 3), np.float32), "b": np.ones(3, np.float32)}
    zeros = jax.tree.map(jnp.zeros_like, params)
    opt = eqxopt.PolarGrad(0.01, polar_method=method, polar_first=polar_first)
    later = next(grad_stream(params, 1))  # full rank
    history = run(opt, params, [zeros, zeros, later])
    for k in params:
        np.testing.assert_array_equal(history[1][k], params[k])
        assert np.isfinite(history[2][k]).all()
        assert (history[2][k] != params[k]).all()


def test_blockwise_8bit_momentum_stays_close():
    """8-bit momentum (and AdamW's 8-bit second moment) against float32 state over
    30 steps: within 10% of how far the float32 run moved (4% measured)."""
    rng = np.random.default_rng(3)
    params = {
        "w": rng.normal(size=(128, 64)).astype(np.float32),
        "b": rng.normal(size=(4096,)).astype(np.float32),
    }
    grads = list(grad_stream(params, 30))

    def polargrad(**kw):
        return eqxopt.PolarGrad(1e-3, adam_learning_rate=1e-2, **kw)

    base = run(polargrad(), params, grads)[-1]
    q = eqxopt.Blockwise8bit()
    quantized_opt = polargrad(mu_dtype=q, nu_dtype=q)
    state = quantized_opt.init(jax.tree.map(jnp.asarray, params))
    assert isinstance(state.mu["w"], eqxopt.QuantizedArray)
    assert isinstance(state.nu["b"], eqxopt.QuantizedArray)
    quantized = run(quantized_opt, params, grads)[-1]

    for k in params:
        moved = np.abs(base[k] - params[k]).max()
        assert moved > 0.1
        assert np.abs(quantized[k] - base[k]).max() < 0.1 * moved, k


def test_bf16_parameters():
    """bf16 parameters and gradients: the maths runs in float32 (the polar
    decomposition included), so the first update is float32's rounded to bf16;
    the parameters stay bf16 and finite over 10 steps."""
    rng = np.random.default_rng(4)
    params = {
        "w": jnp.asarray(rng.normal(size=(16, 8)), jnp.bfloat16),
        "b": jnp.asarray(rng.normal(size=(8,)), jnp.bfloat16),
    }
    grads = [
        jax.tree.map(lambda x: jnp.asarray(x, jnp.bfloat16), g)
        for g in grad_stream(params, 10)
    ]
    f32 = jax.tree.map(lambda x: x.astype(jnp.float32), (params, grads[0]))
    for method in ("qdwh", "svd", "newton_schulz"):
        opt = eqxopt.PolarGrad(1e-2, polar_method=method)
        updates, _ = opt.update(grads[0], opt.init(params), params)
        expected, _ = opt.update(f32[1], opt.init(f32[0]), f32[0])
        for k in params:
            assert updates[k].dtype == jnp.bfloat16
            np.testing.assert_allclose(
                np.asarray(updates[k], np.float32), expected[k], rtol=2**-8, atol=0
            )
        history = run(opt, params, grads)
        for k in params:
            assert history[-1][k].dtype == jnp.bfloat16
            assert np.isfinite(np.asarray(history[-1][k], np.float32)).all()


@pytest.mark.parametrize(
    "kw, error, match",
    [
        (dict(polar_method="cholesky"), ValueError, "polar_method must be one of"),
        (dict(qdwh_steps=0), ValueError, "qdwh_steps must be an int >= 1"),
        (dict(qdwh_steps=1.5), TypeError, "qdwh_steps must be an int >= 1"),
        (dict(beta=1.0), ValueError, r"beta must be in \[0.0, 1.0\)"),
        (dict(eps=0.0), ValueError, "eps must be in"),
        (dict(weight_decay=-1.0), ValueError, "weight_decay"),
        (dict(ns_steps=0), ValueError, "ns_steps must be an int >= 1"),
        (dict(ns_coeffs=(1.0, 2.0)), ValueError, "ns_coeffs must have shape"),
        (dict(polar_first="yes"), TypeError, "polar_first must be a bool"),
        (dict(polar_mask=42), TypeError, "polar_mask must be a bool or"),
        (dict(adam_b2=0.0), ValueError, "adam_b2 must be in"),
    ],
)
def test_bad_options_are_named(kw, error, match):
    with pytest.raises(error, match=match):
        eqxopt.PolarGrad(0.01, **kw)


def test_bad_masks_name_the_leaf():
    params = {"w": jnp.ones((2, 2)), "b": jnp.ones(3)}
    with pytest.raises(ValueError, match=r"polar_mask selects params\['b'\]"):
        eqxopt.PolarGrad(0.1, polar_mask={"w": True, "b": True}).init(params)
    with pytest.raises(ValueError, match="polar_mask does not have the tree"):
        eqxopt.PolarGrad(0.1, polar_mask={"w": True}).init(params)
