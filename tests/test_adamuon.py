"""AdaMuon (issue 40, item 2) against pytorch-optimizer 4.1.0's `AdaMuon` over 30
steps in float64 (its Newton-Schulz, bfloat16 there, run in float64) and in
float32: the RMS-aligned and Jordan's scaling, decay by mask, a schedule, a conv
kernel as its flattened `(out, in * k * k)` matrix; the paper's sign-stabilised
direction and the authors' Nesterov momentum against a NumPy transcription of
the paper's Algorithm 1; Gram Newton-Schulz against the plain iteration; 8-bit
moments against float32."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import pytorch_optimizer
import torch
from pytorch_optimizer.optimizer.muon import adamuon as reference

import eqxopt
from helpers import assert_histories_close, enable_x64, grad_stream, run_eqxopt

STEPS = 30
SHAPES = {"wide": (4, 9), "tall": (8, 3), "conv": (6, 2, 3, 3), "b": (6,)}
# torch's layout: a weight is (out, in); a conv kernel is flattened to
# (out, in * k * k). eqxopt reads them so with these matrix axes.
OUT_IN = eqxopt.MatrixAxes(reduction=-1, output=-2)
CONV = eqxopt.MatrixAxes(reduction=(1, 2, 3), output=0)
AXES = {"wide": OUT_IN, "tall": OUT_IN, "conv": CONV, "b": False}


def tree(dtype, seed=0):
    rng = np.random.default_rng(seed)
    return {k: jnp.asarray(rng.normal(size=s), dtype=dtype) for k, s in SHAPES.items()}


def run_reference(params, grads, groups, dtype, lr_at=None, **kw):
    """pytorch-optimizer's AdaMuon on `params`, Newton-Schulz in `dtype` (its
    default is bfloat16); `groups` lists `(names, options)` per param group;
    `lr_at(step)`, if given, sets every group's learning rate before each step."""
    torch_dtype = {jnp.float32: torch.float32, jnp.float64: torch.float64}[dtype]
    np_dtype = np.dtype(dtype)
    tensors = {
        k: torch.nn.Parameter(torch.tensor(np.asarray(v, np_dtype)))
        for k, v in params.items()
    }
    opt = pytorch_optimizer.AdaMuon(
        [{"params": [tensors[k] for k in names], **o} for names, o in groups], **kw
    )
    ns = functools.partial(reference.zero_power_via_newton_schulz_5, dtype=torch_dtype)
    history = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reference, "zero_power_via_newton_schulz_5", ns)
        for step, g in enumerate(grads):
            for k, t in tensors.items():
                t.grad = torch.tensor(np.asarray(g[k], np_dtype))
            if lr_at is not None:
                for group in opt.param_groups:
                    group["lr"] = lr_at(step)
            opt.step()
            history.append(
                {k: jnp.asarray(t.detach().numpy().copy()) for k, t in tensors.items()}
            )
    return history


MATRICES = ["wide", "tall", "conv"]
TOLERANCES = {jnp.float32: (2e-5, 2e-6), jnp.float64: (1e-11, 1e-12)}
DTYPES = [pytest.param(jnp.float32, id="f32"), pytest.param(jnp.float64, id="f64")]


def compare(make_opt, groups, dtype, lr_at=None, **kw):
    # The optimizer is made under x64 where it runs: its hyperparameters in float64.
    with enable_x64(dtype == jnp.float64):
        params = tree(dtype)
        grads = list(grad_stream(params, STEPS))
        actual = run_eqxopt(make_opt(), params, grads)
        expected = run_reference(params, grads, groups, dtype, lr_at, **kw)
        moved = max(float(jnp.abs(expected[-1][k] - params[k]).max()) for k in params)
        assert moved > 0.1
        rtol, atol = TOLERANCES[dtype]
        assert_histories_close(actual, expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_pytorch_optimizer_with_its_defaults(dtype):
    def opt():
        return eqxopt.AdaMuon(
            0.02, muon_mask=AXES, weight_decay=0.1, adam_learning_rate=3e-4
        )

    groups = [(MATRICES, {"use_muon": True}), (["b"], {"use_muon": False})]
    compare(opt, groups, dtype, lr=0.02, weight_decay=0.1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_pytorch_optimizer_with_jordans_scaling_and_decay_by_mask(dtype):
    opt = functools.partial(
        eqxopt.AdaMuon,
        0.03,
        beta=0.95,
        beta2=0.9,
        eps=1e-8,
        consistent_rms=None,
        muon_mask=AXES,
        weight_decay=0.2,
        weight_decay_mask={"wide": True, "tall": False, "conv": True, "b": True},
        adam_learning_rate=1e-2,
        adam_b1=0.8,
        adam_b2=0.99,
        adam_weight_decay=0.05,
    )
    muon = {"use_muon": True, "use_adjusted_lr": False, "betas": (0.95, 0.9)}
    groups = [
        (["wide", "conv"], {**muon, "weight_decay": 0.2}),
        (["tall"], {**muon, "weight_decay": 0.0}),
        (["b"], {"use_muon": False}),
    ]
    compare(
        opt, groups, dtype, lr=0.03, eps=1e-8, adamw_lr=1e-2, adamw_betas=(0.8, 0.99),
        adamw_wd=0.05,
    )  # fmt: skip


def test_matches_pytorch_optimizer_with_a_schedule_in_float64():
    def schedule():
        return eqxopt.WarmupCosine(
            peak_lr=0.05, min_lr=0.005, warmup_steps=5, total_steps=STEPS
        )

    def opt():
        return eqxopt.AdaMuon(schedule(), muon_mask=AXES, weight_decay=0.1)

    groups = [(MATRICES, {"use_muon": True}), (["b"], {"use_muon": False})]
    with enable_x64():
        values = np.asarray(jax.vmap(schedule())(jnp.arange(STEPS)), np.float64)
    compare(
        opt, groups, jnp.float64, lr_at=lambda s: float(values[s]), weight_decay=0.1
    )


# A NumPy transcription of the paper's Algorithm 1 (Si et al., 2025, v3): the
# first moment a sum M <- beta M + G, O = NS(sign(M)), V <- beta V + (1 - beta)
# O * O, O_hat = O / (sqrt(V) + eps), the step gamma O_hat with gamma = 0.2
# sqrt(m n) / ||O_hat||_F, decoupled decay; with `nesterov` the authors' code's
# momentum (Chongjie-Si/AdaMuon `adamuon.py`: an average, and its Nesterov blend,
# V bias-corrected) and with `sign=False` its unsigned direction.
def newton_schulz_np(x, steps=5):
    a, b, c = (3.4445, -4.7750, 2.0315)
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / max(np.linalg.norm(x), 1e-7)
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if tall else x


def paper_adamuon(params, grads, lr, beta, wd, eps, *, sign, nesterov):
    m = {k: np.zeros_like(p) for k, p in params.items()}
    v = {k: np.zeros_like(p) for k, p in params.items()}
    params = dict(params)
    history = []
    for t, g in enumerate(grads, start=1):
        for k, p in params.items():
            if nesterov:  # the authors' code: an average, then the Nesterov blend
                m[k] = beta * m[k] + (1 - beta) * g[k]
                x = (1 - beta) * g[k] + beta * m[k]
            else:
                m[k] = beta * m[k] + g[k]
                x = m[k]
            o = newton_schulz_np(np.sign(x) if sign else x)
            v[k] = beta * v[k] + (1 - beta) * o * o
            scale = np.sqrt(v[k] / (1 - beta**t)) if nesterov else np.sqrt(v[k])
            o_hat = o / (scale + eps)
            gamma = 0.2 * np.sqrt(o.size) / (np.linalg.norm(o_hat) + eps)
            params[k] = p * (1 - lr * wd) - lr * gamma * o_hat
        history.append({k: jnp.asarray(p) for k, p in params.items()})
    return history


@pytest.mark.parametrize("sign,nesterov", [(True, False), (False, True), (True, True)])
def test_sign_and_nesterov_match_a_transcription_of_the_paper(sign, nesterov):
    with enable_x64():
        rng = np.random.default_rng(3)
        params = {"wide": rng.normal(size=(5, 12)), "tall": rng.normal(size=(9, 4))}
        grads = [
            {k: rng.normal(size=p.shape) for k, p in params.items()}
            for _ in range(STEPS)
        ]
        opt = eqxopt.AdaMuon(
            0.02, beta=0.95, beta2=0.95, weight_decay=0.1,
            sign_momentum=sign, nesterov=nesterov,
        )  # fmt: skip
        as_jax = [{k: jnp.asarray(x) for k, x in g.items()} for g in grads]
        jparams = {k: jnp.asarray(p) for k, p in params.items()}
        actual = run_eqxopt(opt, jparams, as_jax)
        expected = paper_adamuon(
            params, grads, 0.02, 0.95, 0.1, 1e-10, sign=sign, nesterov=nesterov
        )
        # float64 rounding, and the sum against the average: the orthogonalisation
        # and the sign see the same direction.
        assert_histories_close(actual, expected, rtol=1e-9, atol=1e-10)
        # the sign changes the steps
        if sign:
            unsigned = run_eqxopt(
                eqxopt.AdaMuon(0.02, beta=0.95, beta2=0.95, nesterov=nesterov),
                jparams,
                as_jax,
            )
            assert (
                float(jnp.abs(unsigned[-1]["wide"] - actual[-1]["wide"]).max()) > 1e-3
            )


def test_gram_newton_schulz_is_the_plain_iteration_in_float64():
    with enable_x64():
        params = tree(jnp.float64)
        grads = list(grad_stream(params, 10))
        plain = run_eqxopt(eqxopt.AdaMuon(0.02, muon_mask=AXES), params, grads)
        gram = run_eqxopt(
            eqxopt.AdaMuon(0.02, muon_mask=AXES, gram_newton_schulz=True),
            params,
            grads,
        )
        assert_histories_close(gram, plain, rtol=1e-9, atol=1e-10)


def test_the_step_has_the_rms_it_is_given():
    params = tree(jnp.float32)
    grads = list(grad_stream(params, 3))
    for rms in (0.2, 0.5):
        opt = eqxopt.AdaMuon(1.0, muon_mask=AXES, consistent_rms=rms)
        state = opt.init(params)
        for g in grads:
            updates, state = opt.update(g, state, params)
            for k in MATRICES:
                assert jnp.allclose(jnp.sqrt(jnp.mean(updates[k] ** 2)), rms)


def test_state_and_errors_name_the_argument():
    params = tree(jnp.float32)
    state = eqxopt.AdaMuon(0.02).init(params)
    assert state.nu["conv"].shape == SHAPES["conv"]  # every leaf has a nu
    with pytest.raises(ValueError, match=r"muon_mask selects params\['b'\]"):
        eqxopt.AdaMuon(0.02, muon_mask={**AXES, "b": True}).init(params)
    with pytest.raises(ValueError, match=r"consistent_rms must be in \(0.0, inf\]"):
        eqxopt.AdaMuon(0.02, consistent_rms=0.0)
    with pytest.raises(ValueError, match="ns_coeffs has 5 rows, fewer than ns_steps"):
        eqxopt.AdaMuon(0.02, ns_coeffs="dion", ns_steps=6)
    with pytest.raises(TypeError, match="sign_momentum must be a bool"):
        eqxopt.AdaMuon(0.02, sign_momentum=1)  # pyright: ignore
