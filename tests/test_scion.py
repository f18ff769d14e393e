"""Scion against heavyball 3.2.1's `Scion` over 40 steps in float64 (its auto
norm: spectral for matrices and convolution kernels, RMS for vectors and scalars;
its debiased momentum; decay, the constrained step as its `weight_decay=1`, a
warmup schedule, a weight-decay mask as its parameter groups), and against
`pytorch_optimizer.SCION` (plain momentum) with a different oracle per leaf
(spectral, column, row, sign, RMS), constrained and not; bf16 parameters and
8-bit momentum (issue 40, item 5)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt
from helpers import Trajectory, assert_histories_close, enable_x64, grad_stream

heavyball = pytest.importorskip("heavyball")
pytorch_optimizer = pytest.importorskip("pytorch_optimizer")
torch = pytest.importorskip("torch")

STEPS = 40
RTOL, ATOL = 1e-12, 1e-13


@pytest.fixture(autouse=True)
def eager_float64_torch(monkeypatch):
    # heavyball compiles its kernels with torch.compile unless told not to (the
    # same maths, eagerly), and forms `beta ** step` in torch's default dtype;
    # pytorch_optimizer's Newton-Schulz runs in bfloat16 unless told otherwise.
    monkeypatch.setattr(heavyball.utils, "compile_mode", None)
    scion = pytorch_optimizer.optimizer.scion
    monkeypatch.setattr(
        scion,
        "zero_power_via_newton_schulz_5",
        functools.partial(scion.zero_power_via_newton_schulz_5, dtype=torch.float64),
    )
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


SHAPES = {"wide": (4, 9), "tall": (8, 3), "conv": (3, 2, 2, 2), "conv1d": (3, 2, 4),
          "b": (6,), "scale": ()}  # fmt: skip


def as_tree(tensors, names):
    return {k: jnp.asarray(t.detach().numpy().copy()) for k, t in zip(names, tensors)}


def run_heavyball(grads, groups=None, scale=1.0, **kw):
    """heavyball's `Scion` on float64 tensors of `SHAPES`, each first set to
    heavyball's own initialisation (which its first step would write over them);
    returns its run, started from there."""
    names = sorted(SHAPES)
    tensors = [
        torch.nn.Parameter(torch.zeros(SHAPES[k], dtype=torch.float64)) for k in names
    ]
    if groups is None:
        param_groups = [{"params": tensors}]
    else:
        param_groups = [{"params": [t], **g} for t, g in zip(tensors, groups)]
    for group in param_groups:
        for seed, t in enumerate(group["params"]):
            heavyball.utils.scion_auto_init_param_(t.data, scale, seed=seed)
    history = Trajectory(as_tree(tensors, names))
    opt = heavyball.Scion(param_groups, storage_dtype="float64", scale=scale, **kw)
    for g in grads:
        for t, k in zip(tensors, names):
            t.grad = torch.tensor(np.asarray(g[k]))
        opt.step()
        history.append(as_tree(tensors, names))
    return history


def run_eqxopt(opt, params, grads):
    state = opt.init(params)
    history = []
    for g in grads:
        params, state = opt.step(g, state, params)
        history.append(params)
    return history


def grads_of(shapes, seed=1):
    rng = np.random.default_rng(seed)
    return [
        {k: jnp.asarray(rng.normal(size=s)) for k, s in shapes.items()}
        for _ in range(STEPS)
    ]


HEAVYBALL = [
    pytest.param({}, {}, id="plain"),
    pytest.param(
        {"beta": 0.8, "scale": 2.0, "weight_decay": 0.1},
        {"betas": (0.8, 0.99), "scale": 2.0, "weight_decay": 0.1},
        id="decay-scale",
    ),
    pytest.param(
        {"constrained": True, "scale": 3.0},
        {"weight_decay": 1.0, "scale": 3.0},
        id="constrained",
    ),
]


@pytest.mark.parametrize("ours, theirs", HEAVYBALL)
def test_matches_heavyball(ours, theirs):
    with enable_x64():
        grads = grads_of(SHAPES)
        expected = run_heavyball(grads, **{"lr": 0.02, **theirs})
        opt = eqxopt.Scion(**{"learning_rate": 0.02, **ours})
        actual = run_eqxopt(opt, expected.start, grads)
        assert_histories_close(actual, expected, rtol=RTOL, atol=ATOL)


def test_warmup_and_decay_mask_match_heavyball():
    with enable_x64():
        grads = grads_of(SHAPES)
        names = sorted(SHAPES)
        decay = {k: k in ("wide", "conv", "b") for k in names}
        groups = [{"weight_decay": 0.2 if decay[k] else 0.0} for k in names]
        expected = run_heavyball(grads, groups=groups, lr=0.02, warmup_steps=4)
        opt = eqxopt.Scion(
            eqxopt.Linear(0.02 / 5, 0.02, 4),
            weight_decay=0.2,
            weight_decay_mask=decay,
        )
        actual = run_eqxopt(opt, expected.start, grads)
        assert_histories_close(actual, expected, rtol=RTOL, atol=ATOL)


LMO = pytorch_optimizer.optimizer.scion.LMONorm
PER_LEAF = {
    "hidden": ((5, 7), "spectral", LMO.SPECTRAL),
    "tall": ((8, 3), "spectral", LMO.SPECTRAL),
    "embed": ((9, 4), "col", LMO.COL),
    "proj": ((4, 6), "row", LMO.ROW),
    "head": ((3, 5), "sign", LMO.SIGN),
    "bias": ((6,), "rms", LMO.BIAS),
}


def run_pytorch_optimizer(params, grads, **kw):
    names = sorted(params)
    tensors = [torch.nn.Parameter(torch.tensor(np.asarray(params[k]))) for k in names]
    groups = [
        {"params": [t], "norm_type": PER_LEAF[k][2]} for t, k in zip(tensors, names)
    ]
    opt = pytorch_optimizer.SCION(groups, **kw)
    history = Trajectory(params)
    for g in grads:
        for t, k in zip(tensors, names):
            t.grad = torch.tensor(np.asarray(g[k]))
        opt.step()
        history.append(as_tree(tensors, names))
    return history


@pytest.mark.parametrize(
    "ours, theirs",
    [
        pytest.param({}, {}, id="plain"),
        pytest.param({"weight_decay": 0.1}, {"weight_decay": 0.1}, id="decay"),
        pytest.param({"constrained": True}, {"constraint": True}, id="constrained"),
    ],
)
def test_oracle_per_leaf_matches_pytorch_optimizer(ours, theirs, monkeypatch):
    # pytorch_optimizer adds its eps (1e-8) to the column, row and RMS norms where
    # eqxopt floors them at `eps`: with its eps 0 and eqxopt's 1e-30 (neither
    # then acts), the two are the same maths.
    scion = pytorch_optimizer.optimizer.scion
    for norm in (scion.Col, scion.Row, scion.BiasRMS):
        monkeypatch.setattr(norm.lmo, "__defaults__", (0.0,))
    with enable_x64():
        shapes = {k: v[0] for k, v in PER_LEAF.items()}
        rng = np.random.default_rng(0)
        params = {k: jnp.asarray(rng.normal(size=s)) for k, s in shapes.items()}
        grads = grads_of(shapes)
        kw = {"lr": 0.02, "momentum": 0.3, "scale": 2.0, **theirs}
        expected = run_pytorch_optimizer(params, grads, **kw)
        norms = {k: v[1] for k, v in PER_LEAF.items()}
        options = dict(
            beta=0.7,
            scale=2.0,
            bias_correction=False,
            ns_coeffs="standard",
            eps=1e-30,
            **ours,
        )
        actual = run_eqxopt(eqxopt.Scion(0.02, norms=norms, **options), params, grads)
        assert_histories_close(actual, expected, rtol=RTOL, atol=ATOL)
        # the same oracles given by a function of params
        by_function = eqxopt.Scion(
            0.02, norms=lambda p: {k: PER_LEAF[k][1] for k in p}, **options
        )
        assert_histories_close(
            run_eqxopt(by_function, params, grads), actual, rtol=0, atol=0
        )


def test_constrained_steps_stay_in_the_ball():
    # From inside the ball, the constrained step is a convex combination of p
    # and a point of norm `scale`: every iterate stays inside.
    params = {"w": jnp.zeros((6, 6)), "v": jnp.zeros(5)}
    norms = {"w": "spectral", "v": "sign"}
    opt = eqxopt.Scion(0.1, scale=2.0, constrained=True, norms=norms)
    grads = list(grad_stream(params, 30))
    for new in run_eqxopt(opt, params, grads):
        assert float(jnp.linalg.norm(new["w"], 2)) <= 2.0 * 1.01
        assert float(jnp.max(jnp.abs(new["v"]))) <= 2.0 + 1e-6


def test_bf16_parameters_and_8bit_momentum():
    shapes = {"w": (16, 32), "b": (32,)}
    rng = np.random.default_rng(0)
    params = {
        k: jnp.asarray(0.1 * rng.normal(size=s), jnp.float32) for k, s in shapes.items()
    }
    grads = [jax.tree.map(lambda x: x.astype(jnp.float32), g) for g in grads_of(shapes)]
    reference = run_eqxopt(eqxopt.Scion(0.01), params, grads)[-1]
    low = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    low_grads = [jax.tree.map(lambda x: x.astype(jnp.bfloat16), g) for g in grads]
    last = run_eqxopt(eqxopt.Scion(0.01), low, low_grads)[-1]
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(last))
    for k in shapes:
        np.testing.assert_allclose(last[k].astype(jnp.float32), reference[k], atol=0.05)
    quantized = eqxopt.Scion(0.01, mu_dtype=eqxopt.Blockwise8bit())
    last8 = run_eqxopt(quantized, params, grads)[-1]
    for k in shapes:
        np.testing.assert_allclose(last8[k], reference[k], atol=0.05)


@pytest.mark.parametrize(
    "kw, error, message",
    [
        ({"norms": "frobenius"}, ValueError, r"norms must be one of \('auto'"),
        ({"norms": {"w": "sign", "b": 3}}, ValueError, r"norms\['b'\] must be one of"),
        ({"norms": None}, ValueError, "norms must be one of"),
        (
            {"constrained": True, "weight_decay": 0.1},
            ValueError,
            "weight_decay must be 0 with constrained=True",
        ),
        ({"beta": 1.0}, ValueError, "beta"),
        ({"scale": 0.0}, ValueError, "scale"),
        ({"eps": 0.0}, ValueError, "eps"),
        ({"ns_steps": 0}, ValueError, "ns_steps"),
    ],
)
def test_invalid_options(kw, error, message):
    with pytest.raises(error, match=message):
        eqxopt.Scion(**{"learning_rate": 0.1, **kw})


@pytest.mark.parametrize(
    "norms, message",
    [
        (
            {"w": "auto", "b": "spectral", "k": "auto"},
            r"params\['b'\], of shape \(3,\), the 'spectral' oracle, which needs at "
            "least 2",
        ),
        (
            {"w": "auto", "b": "rms", "k": "row"},
            r"params\['k'\], of shape \(2, 3, 4\), the 'row' oracle, which needs 2 "
            "dimensions",
        ),
        ({"w": "auto"}, "norms"),
    ],
)
def test_oracle_shape_errors(norms, message):
    params = {"w": jnp.ones((3, 4)), "b": jnp.ones(3), "k": jnp.ones((2, 3, 4))}
    opt = eqxopt.Scion(0.1, norms=norms)
    with pytest.raises(ValueError, match=message):
        opt.init(params)


def test_complex_leaves_are_refused():
    params = {"w": jnp.ones((2, 2), jnp.complex64)}
    with pytest.raises(TypeError, match="Scion supports real parameters only"):
        eqxopt.Scion(0.1).init(params)
