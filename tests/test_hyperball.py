"""HyperBallAdamW against heavyball 3.2.1's `HyperBallAdamW` over 40 steps, in
float64 (heavyball's state stored in float64) and float32: matrices, a tall
matrix, a 3-D leaf, a vector and a scalar; weight decay, caution and cautious
decay, a warmup schedule (heavyball's `warmup_steps`), a weight-decay mask
(heavyball's parameter groups) and a hyperball mask; the radius kept at every
step; bf16 parameters and 8-bit second moments (issue 40, item 5)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt
from helpers import Trajectory, assert_histories_close, enable_x64, grad_stream

heavyball = pytest.importorskip("heavyball")
torch = pytest.importorskip("torch")

STEPS = 40


@pytest.fixture(autouse=True)
def eager_heavyball(monkeypatch):
    # heavyball compiles its kernels with torch.compile unless told not to: the
    # same maths, eagerly, without minutes of compiling.
    monkeypatch.setattr(heavyball.utils, "compile_mode", None)


@pytest.fixture(autouse=True)
def float64_scalars():
    # heavyball forms its bias correction as `beta ** step` with `step` an integer
    # tensor, which torch computes in its default float dtype: float64 here, so
    # that a float64 run is float64 throughout (float32 runs keep their float32
    # state and parameters).
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


TOLERANCES = {jnp.float64: (1e-12, 1e-13), jnp.float32: (2e-5, 2e-6)}


def tree(dtype, seed=0):
    rng = np.random.default_rng(seed)

    def leaf(*shape):
        return jnp.asarray(rng.normal(size=shape), dtype=dtype)

    return {"wide": leaf(4, 9), "tall": leaf(8, 3), "conv": leaf(3, 2, 4),
            "b": leaf(6), "scale": leaf()}  # fmt: skip


def run_heavyball(params, grads, groups=None, shapes=None, **kw):
    """heavyball's `HyperBallAdamW` on the leaves of `params` (their dtype; the
    state stored in it), with `groups` (per leaf: a dict of group options) and
    `shapes` (per leaf: the shape torch sees, for the route by `ndim`)."""
    leaves, treedef = jax.tree.flatten(params)
    dtype = {np.float64: torch.float64, np.float32: torch.float32}[
        np.dtype(leaves[0].dtype).type
    ]
    shapes = shapes or [x.shape for x in leaves]
    tensors = [
        torch.nn.Parameter(torch.tensor(np.asarray(x)).reshape(s))
        for x, s in zip(leaves, shapes)
    ]
    storage = "float64" if dtype == torch.float64 else "float32"
    if groups is None:
        param_groups = [{"params": tensors}]
    else:
        param_groups = [{"params": [t], **g} for t, g in zip(tensors, groups)]
    opt = heavyball.HyperBallAdamW(param_groups, storage_dtype=storage, **kw)
    history = Trajectory(params)
    for g in grads:
        for t, gl, s in zip(tensors, jax.tree.leaves(g), shapes):
            t.grad = torch.tensor(np.asarray(gl)).reshape(s)
        opt.step()
        history.append(
            jax.tree.unflatten(
                treedef,
                [
                    jnp.asarray(t.detach().numpy().copy()).reshape(x.shape)
                    for t, x in zip(tensors, leaves)
                ],
            )
        )
    return history


def run_eqxopt(opt, params, grads):
    state = opt.init(params)
    history = []
    for g in grads:
        params, state = opt.step(g, state, params)
        history.append(params)
    return history


DTYPES = [pytest.param(jnp.float64, id="f64"), pytest.param(jnp.float32, id="f32")]

OPTIONS = [
    pytest.param({}, {}, id="plain"),
    pytest.param({"weight_decay": 0.1}, {"weight_decay": 0.1}, id="decay"),
    pytest.param(
        {"weight_decay": 0.2, "caution": True, "cautious_weight_decay": True},
        {"weight_decay": 0.2, "caution": True, "cautious_weight_decay": True},
        id="cautious",
    ),
    pytest.param(
        {"b2": 0.9, "eps": 1e-3, "learning_rate": 0.02},
        {"betas": (0.5, 0.9), "eps": 1e-3, "lr": 0.02},
        id="b2-eps",
    ),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ours, theirs", OPTIONS)
def test_matches_heavyball(ours, theirs, dtype):
    with enable_x64(dtype == jnp.float64):
        params = tree(dtype)
        grads = list(grad_stream(params, STEPS))
        actual = run_eqxopt(
            eqxopt.HyperBallAdamW(**{"learning_rate": 0.05, **ours}), params, grads
        )
        expected = run_heavyball(params, grads, **{"lr": 0.05, **theirs})
        rtol, atol = TOLERANCES[dtype]
        assert_histories_close(actual, expected, rtol=rtol, atol=atol)


def test_keeps_each_matrix_norm_at_every_step():
    with enable_x64():
        params = tree(jnp.float64)
        grads = list(grad_stream(params, STEPS))
        opt = eqxopt.HyperBallAdamW(0.1, weight_decay=0.5)
        start = {k: float(jnp.linalg.norm(v)) for k, v in params.items()}
        history = run_eqxopt(opt, params, grads)
        for new in history:
            for key in ("wide", "tall", "conv"):
                assert abs(float(jnp.linalg.norm(new[key])) - start[key]) < (
                    1e-13 * start[key]
                )
        # the weights moved on the sphere; the vector is free and its norm changed
        last = history[-1]
        assert float(jnp.linalg.norm(last["wide"] - params["wide"])) > 0.5
        assert abs(float(jnp.linalg.norm(last["b"])) - start["b"]) > 0.1
        state = opt.init(params)
        assert float(state.radius["wide"]) == pytest.approx(start["wide"], rel=1e-15)
        assert state.radius["b"] is None


def test_radius_is_measured_at_the_first_step():
    # As heavyball: weights loaded after `init` (a checkpoint, a pretrained model)
    # keep their own norm, not that of the weights `init` was given.
    with enable_x64():
        params = tree(jnp.float64)
        loaded = jax.tree.map(lambda x: 3.0 * x, params)
        grads = list(grad_stream(params, STEPS))
        opt = eqxopt.HyperBallAdamW(0.05, weight_decay=0.1)
        state = opt.init(params)
        p, history = loaded, []
        for g in grads:
            p, state = opt.step(g, state, p)
            history.append(p)
        assert float(state.radius["wide"]) == pytest.approx(
            float(jnp.linalg.norm(loaded["wide"])), rel=1e-14
        )
        expected = run_heavyball(loaded, grads, lr=0.05, weight_decay=0.1)
        assert_histories_close(history, expected, rtol=1e-12, atol=1e-13)


def test_warmup_schedule_matches_heavyball_warmup_steps():
    # heavyball: lr * t / max(t, warmup + 1); eqxopt: the same as a schedule.
    with enable_x64():
        params = tree(jnp.float64)
        grads = list(grad_stream(params, STEPS))
        schedule = eqxopt.Linear(0.05 / 6, 0.05, 5)
        actual = run_eqxopt(
            eqxopt.HyperBallAdamW(schedule, weight_decay=0.1), params, grads
        )
        expected = run_heavyball(
            params, grads, lr=0.05, weight_decay=0.1, warmup_steps=5
        )
        assert_histories_close(actual, expected, rtol=1e-11, atol=1e-12)


def test_masks_match_heavyball_groups_and_routes():
    # weight_decay_mask is heavyball's parameter groups; a leaf taken off the ball
    # is heavyball's flattened leaf (its ndim-1 route), a vector put on it is
    # heavyball's (1, n) leaf.
    with enable_x64():
        params = tree(jnp.float64)
        grads = list(grad_stream(params, STEPS))
        decay = {"wide": True, "tall": False, "conv": True, "b": False, "scale": True}
        ball = {"wide": True, "tall": False, "conv": True, "b": True, "scale": False}
        opt = eqxopt.HyperBallAdamW(
            0.05, weight_decay=0.3, weight_decay_mask=decay, hyperball_mask=ball
        )
        actual = run_eqxopt(opt, params, grads)
        names = sorted(params)  # jax.tree.leaves order of a dict
        groups = [{"weight_decay": 0.3 if decay[k] else 0.0} for k in names]
        shapes = {"wide": (4, 9), "tall": (24,), "conv": (3, 2, 4), "b": (1, 6),
                  "scale": ()}  # fmt: skip
        expected = run_heavyball(
            params, grads, groups=groups, shapes=[shapes[k] for k in names], lr=0.05
        )
        assert_histories_close(actual, expected, rtol=1e-11, atol=1e-12)
        mask_fn = eqxopt.HyperBallAdamW(
            0.05,
            weight_decay=0.3,
            weight_decay_mask=decay,
            hyperball_mask=lambda p: {k: k in ("wide", "conv", "b") for k in p},
        )
        assert_histories_close(
            run_eqxopt(mask_fn, params, grads), actual, rtol=0, atol=0
        )


def test_bf16_parameters_and_8bit_second_moment():
    params = tree(jnp.float32)
    grads = list(grad_stream(params, STEPS))
    reference = run_eqxopt(eqxopt.HyperBallAdamW(0.05), params, grads)[-1]
    low = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    low_grads = [jax.tree.map(lambda x: x.astype(jnp.bfloat16), g) for g in grads]
    last = run_eqxopt(eqxopt.HyperBallAdamW(0.05), low, low_grads)[-1]
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(last))
    for key in ("wide", "tall", "conv"):
        radius = float(jnp.linalg.norm(params[key]))
        norm = float(jnp.linalg.norm(last[key].astype(jnp.float32)))
        assert abs(norm - radius) < 1e-2 * radius
        np.testing.assert_allclose(last[key], reference[key], atol=0.1)
    quantized = eqxopt.HyperBallAdamW(0.05, nu_dtype=eqxopt.Blockwise8bit())
    last8 = run_eqxopt(quantized, params, grads)[-1]
    for key in ("wide", "tall", "conv"):
        np.testing.assert_allclose(
            jnp.linalg.norm(last8[key]), jnp.linalg.norm(params[key]), rtol=1e-5
        )
        np.testing.assert_allclose(last8[key], reference[key], atol=0.1)


def test_update_without_step_matches_step():
    params = tree(jnp.float32)
    grads = list(grad_stream(params, 5))
    opt = eqxopt.HyperBallAdamW(0.05, weight_decay=0.1)
    state = opt.init(params)
    p = params
    for g in grads:
        updates, state = opt.update(g, state, p)
        p = eqxopt.apply_updates(p, updates)
    assert_histories_close([p], [run_eqxopt(opt, params, grads)[-1]])


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"b2": 1.0}, "b2"),
        ({"eps": 0.0}, "eps"),
        ({"weight_decay": -1.0}, "weight_decay"),
        ({"learning_rate": -0.1}, "learning_rate"),
    ],
)
def test_invalid_options(kw, message):
    with pytest.raises(ValueError, match=message):
        eqxopt.HyperBallAdamW(**{"learning_rate": 0.1, **kw})


def test_mask_errors_and_complex_with_caution():
    params = tree(jnp.float32)
    opt = eqxopt.HyperBallAdamW(0.1, hyperball_mask={"wide": True})
    with pytest.raises(ValueError, match="hyperball_mask"):
        opt.init(params)
    complex_params = {"w": jnp.ones((2, 2), jnp.complex64)}
    cautious = eqxopt.HyperBallAdamW(0.1, caution=True)
    with pytest.raises(
        TypeError, match=r"HyperBallAdamW\(compares_signs=True\) supports real"
    ):
        cautious.init(complex_params)
    # without the sign options a complex matrix stays on its sphere
    plain = eqxopt.HyperBallAdamW(0.1)
    new, _ = plain.step(complex_params, plain.init(complex_params), complex_params)
    np.testing.assert_allclose(jnp.linalg.norm(new["w"]), 2.0, rtol=1e-6)
