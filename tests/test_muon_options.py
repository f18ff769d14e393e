"""Muon with each option of optax 0.2.8's `optax.contrib.muon` against optax with
the same option, 30 steps in float32 and float64: `preconditioning` (all four),
`adaptive`, `consistent_rms`, the coefficient presets and per-step rows, and the
matrix axes of conv and stacked leaves (`MatrixAxes` against
`MuonDimensionNumbers`); Gram Newton-Schulz against the plain iteration in
float64; 8-bit momentum (issue 40, item 1)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import eqxopt
from eqxopt._optimizers._preconditioned._muon import newton_schulz
from eqxopt._optimizers._preconditioned._orthogonal import NS_PRESETS
from helpers import (
    assert_histories_close,
    enable_x64,
    grad_stream,
    run_eqxopt,
    run_optax,
)

STEPS = 30


def tree(dtype, seed=0):
    rng = np.random.default_rng(seed)

    def leaf(*shape):
        return jnp.asarray(rng.normal(size=shape), dtype=dtype)

    # Wide, tall and square matrices (Muon) beside a vector and a scalar (AdamW).
    return {"wide": leaf(4, 9), "tall": leaf(8, 3), "square": leaf(5, 5),
            "b": leaf(6), "scale": leaf()}  # fmt: skip


# float32: to rounding; float64: the same maths, so far closer.
TOLERANCES = {jnp.float32: (2e-5, 2e-6), jnp.float64: (1e-10, 1e-11)}


def compare(eqxopt_kw, optax_kw, dtype, params=None, dims=None, **tol):
    with enable_x64(dtype == jnp.float64):
        params = tree(dtype) if params is None else params(dtype)
        grads = list(grad_stream(params, STEPS))
        actual = run_eqxopt(eqxopt.Muon(0.02, **eqxopt_kw), params, grads)
        if dims is not None:
            optax_kw = {**optax_kw, "muon_weight_dimension_numbers": dims}
        expected = run_optax(optax.contrib.muon(0.02, **optax_kw), params, grads)
        rtol, atol = TOLERANCES[dtype]
        assert_histories_close(
            actual, expected, rtol=tol.get("rtol", rtol), atol=tol.get("atol", atol)
        )


DTYPES = [pytest.param(jnp.float32, id="f32"), pytest.param(jnp.float64, id="f64")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "preconditioning", ["frobenius", "spectral", "aol", "schatten"]
)
def test_preconditioning_matches_optax(preconditioning, dtype):
    kw = dict(preconditioning=preconditioning, weight_decay=0.1, nesterov=False)
    compare(kw, kw, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("preconditioning", ["frobenius", "aol"])
def test_adaptive_matches_optax(preconditioning, dtype):
    kw = dict(adaptive=True, preconditioning=preconditioning, ns_steps=4)
    compare(kw, kw, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_consistent_rms_and_adam_options_match_optax(dtype):
    kw = dict(
        consistent_rms=0.2,
        beta=0.9,
        adam_b1=0.8,
        adam_b2=0.99,
        adam_weight_decay=0.05,
        adam_learning_rate=0.01,
    )
    compare(kw, kw, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("preset", ["standard", "dion"])
def test_named_presets_match_optax(preset, dtype):
    compare({"ns_coeffs": preset}, {"ns_coeffs": preset}, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_polar_express_rows_match_optax_given_the_same_rows(dtype):
    # optax has no Polar Express preset: it takes the same rows as a table.
    rows = tuple(tuple(r) for r in NS_PRESETS["polar_express"])
    compare(
        {"ns_coeffs": "polar_express", "preconditioning": "schatten"},
        {"ns_coeffs": rows, "preconditioning": "schatten"},
        dtype,
    )


def test_polar_express_preset_is_the_papers_polynomials_after_a_1_02_normalisation():
    # The first row folds in the 1.02 of Polar Express's normalisation
    # x / (1.02 ||x||_F): p(x / 1.02) with the published first polynomial.
    x = jax.random.normal(jax.random.key(0), (6, 10))
    published = jnp.asarray(
        [
            (8.156554524902461, -22.48329292557795, 15.878769915207462),
            *NS_PRESETS["polar_express"][1:],
        ]
    )
    x0 = x / (1.02 * jnp.linalg.norm(x))
    expected = x0
    for a, b, c in published:
        gram = expected @ expected.T
        expected = a * expected + (b * gram + c * gram @ gram) @ expected
    actual = newton_schulz(x, jnp.asarray(NS_PRESETS["polar_express"]), eps=0.0)
    np.testing.assert_allclose(actual, expected, rtol=2e-5, atol=2e-6)
    singular = np.linalg.svd(np.asarray(actual), compute_uv=False)
    # within 15% of orthogonal in five steps (Jordan's quintic: within 50%)
    assert np.all(np.abs(singular - 1) < 0.15)


def conv_and_stacks(dtype):
    rng = np.random.default_rng(3)

    def leaf(*shape):
        return jnp.asarray(rng.normal(size=shape), dtype=dtype)

    return {
        "conv": leaf(8, 3, 3, 3),  # (out, in, kh, kw)
        "stack": leaf(4, 3, 6),  # (in, layer, out): the batch axis in the middle
        "linear": leaf(7, 5),  # (out, in), as equinox.nn.Linear holds it
        "b": leaf(8),
    }


@pytest.mark.parametrize("dtype", DTYPES)
def test_matrix_axes_match_optax_dimension_numbers(dtype):
    dims = optax.contrib.MuonDimensionNumbers
    axes = {
        "conv": eqxopt.MatrixAxes(reduction=(1, 2, 3), output=0),
        "stack": eqxopt.MatrixAxes(reduction=0, output=2),
        "linear": eqxopt.MatrixAxes(reduction=-1, output=-2),
        "b": False,
    }
    optax_dims = {
        "conv": dims(reduction_axis=(1, 2, 3), output_axis=0),
        "stack": dims(reduction_axis=0, output_axis=2),
        "linear": dims(reduction_axis=1, output_axis=0),
        "b": None,
    }
    kw = dict(weight_decay=0.1, consistent_rms=None)
    compare(
        {**kw, "muon_mask": axes}, kw, dtype, params=conv_and_stacks, dims=optax_dims
    )


def test_matrix_axes_mask_as_a_function_and_as_a_prefix():
    params = conv_and_stacks(jnp.float32)
    grads = list(grad_stream(params, 5))
    axes = eqxopt.MatrixAxes(reduction=(1, 2, 3), output=0)
    as_tree = eqxopt.Muon(0.02, muon_mask={"conv": axes, "stack": False,
                                           "linear": True, "b": False})  # fmt: skip
    as_function = eqxopt.Muon(
        0.02,
        muon_mask=lambda p: {"conv": axes, "stack": None, "linear": True, "b": None},
    )
    assert_histories_close(
        run_eqxopt(as_function, params, grads), run_eqxopt(as_tree, params, grads)
    )
    state = as_tree.init(params)
    assert state.nu["conv"] is None and state.nu["stack"] is not None


def test_matrix_axes_errors_name_the_argument_and_the_leaf():
    params = conv_and_stacks(jnp.float32)

    def muon(**mask):
        return eqxopt.Muon(0.1, muon_mask={**dict.fromkeys(params, False), **mask})

    with pytest.raises(ValueError, match=r"muon_mask selects params\['b'\]"):
        muon(b=True).init(params)
    with pytest.raises(ValueError, match=r"params\['linear'\].*names axis 4"):
        muon(linear=eqxopt.MatrixAxes(reduction=4, output=0)).init(params)
    with pytest.raises(ValueError, match="each axis once"):
        muon(conv=eqxopt.MatrixAxes(reduction=(0, 1), output=1)).init(params)
    with pytest.raises(TypeError, match="MatrixAxes: output must be an int"):
        eqxopt.MatrixAxes(reduction=0, output="1")  # pyright: ignore
    with pytest.raises(TypeError, match=r"muon_mask\['b'\] must be a bool or an "):
        muon(b="yes")


def test_option_errors_name_the_argument():
    with pytest.raises(ValueError, match="preconditioning must be one of"):
        eqxopt.Muon(0.1, preconditioning="polar")
    with pytest.raises(ValueError, match="ns_coeffs must be one of"):
        eqxopt.Muon(0.1, ns_coeffs="jordan")
    with pytest.raises(ValueError, match="ns_coeffs has 5 rows, fewer than ns_steps"):
        eqxopt.Muon(0.1, ns_coeffs="dion", ns_steps=6)
    with pytest.raises(TypeError, match="adaptive must be a bool"):
        eqxopt.Muon(0.1, adaptive=1)
    # A table runs its first ns_steps rows.
    assert eqxopt.Muon(0.1, ns_coeffs="dion", ns_steps=3).ns_coeffs.shape == (5, 3)


@pytest.mark.parametrize(
    "preconditioning", ["frobenius", "spectral", "aol", "schatten"]
)
@pytest.mark.parametrize("shape", [(6, 40), (40, 6), (3, 7, 12)])
def test_gram_newton_schulz_is_the_plain_iteration_in_float64(shape, preconditioning):
    with enable_x64():
        x = jax.random.normal(jax.random.key(1), shape, jnp.float64)
        coeffs = jnp.asarray(NS_PRESETS["dion"], jnp.float64)
        how = dict(preconditioning=preconditioning)
        plain = newton_schulz(x, coeffs, 1e-8, **how)
        gram = newton_schulz(x, coeffs, 1e-8, gram=True, **how)
        assert gram.dtype == jnp.float64
        np.testing.assert_allclose(gram, plain, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gram_newton_schulz_muon_runs_match_the_plain_ones(dtype):
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == jnp.float32 else {}
    with enable_x64(dtype == jnp.float64):
        params = tree(dtype)
        grads = list(grad_stream(params, STEPS))
        kw = dict(ns_coeffs="polar_express", preconditioning="aol")
        plain = run_eqxopt(eqxopt.Muon(0.02, **kw), params, grads)
        gram = run_eqxopt(
            eqxopt.Muon(0.02, gram_newton_schulz=True, **kw), params, grads
        )
        rtol, atol = TOLERANCES[dtype]
        assert_histories_close(
            gram, plain, rtol=tol.get("rtol", rtol), atol=tol.get("atol", atol)
        )


def test_preconditionings_orthogonalise():
    x = jax.random.normal(jax.random.key(2), (16, 48))
    coeffs = jnp.asarray(NS_PRESETS["polar_express"])
    for preconditioning in ("frobenius", "spectral", "aol", "schatten"):
        o = newton_schulz(x, coeffs, preconditioning=preconditioning)
        singular = np.linalg.svd(np.asarray(o), compute_uv=False)
        assert np.all(np.abs(singular - 1) < 0.3), (preconditioning, singular)


@pytest.mark.parametrize(
    "make", [eqxopt.Muon, eqxopt.AdaMuon], ids=lambda c: c.__name__
)
def test_8bit_moments_follow_the_float32_run(make):
    # bitsandbytes#1973 asks for 8-bit Muon momentum: block-wise 8-bit state
    # follows the float32 run closely, at a quarter of the moments' bytes.
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(64, 96)), jnp.float32),
              "b": jnp.asarray(rng.normal(size=(4096,)), jnp.float32)}  # fmt: skip
    grads = list(grad_stream(params, 20))
    full = make(0.02, adam_learning_rate=1e-3)
    small = make(
        0.02,
        adam_learning_rate=1e-3,
        mu_dtype=eqxopt.Blockwise8bit(),
        nu_dtype=eqxopt.Blockwise8bit(),
    )
    a = run_eqxopt(full, params, grads)[-1]
    b = run_eqxopt(small, params, grads)[-1]
    for k in params:
        moved = np.abs(np.asarray(a[k] - params[k])).mean()
        gap = np.abs(np.asarray(a[k] - b[k])).mean()
        assert gap < 0.05 * moved, (k, gap, moved)
    stored = small.init(params)
    # Muon keeps no second moment at its matrices.
    for moment in (stored.mu["w"], stored.nu["w"]):
        if moment is not None:
            nbytes = sum(x.nbytes for x in jax.tree.leaves(moment))
            assert nbytes < 0.3 * params["w"].nbytes
