"""APOLLO and APOLLO-Mini: against pytorch-optimizer 4.1.0's `APOLLO` (which is
the authors' step where the projection is square and orthogonal), against a NumPy
transcription of the authors' code (`apollo_torch`, random rank-r projections,
the limiter, weight decay, `scale_front`) over 30 steps, the redraws of the
projection, the state's size, and the errors."""

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt
from helpers import Trajectory, assert_histories_close

STEPS = 30


def _params(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "tall": jnp.asarray(rng.normal(size=(12, 5)), jnp.float32),  # rows scaled
        "wide": jnp.asarray(rng.normal(size=(4, 9)), jnp.float32),  # columns scaled
        "b": jnp.asarray(rng.normal(size=(5,)), jnp.float32),  # Adam
    }


def _grads(params, steps=STEPS, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for k in range(steps):
        # Gradients of changing size, so the norm-growth limiter acts.
        scale = 1.0 + 0.5 * np.sin(k)
        out.append(
            jax.tree.map(
                lambda p, scale=scale: jnp.asarray(
                    scale * rng.normal(size=p.shape), p.dtype
                ),
                params,
            )
        )
    return out


def _orthogonal(n, seed):
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(n, n)))
    return q.astype(np.float32)


def _run(opt, params, grads, state=None):
    state = opt.init(params) if state is None else state
    history = []
    for g in grads:
        params, state = opt.step(g, state, params)
        history.append(params)
    return history, state


@pytest.mark.parametrize("scale_type", ["channel", "tensor"])
def test_apollo_matches_pytorch_optimizer_with_an_orthogonal_projection(scale_type):
    # pytorch-optimizer projects the scaled low-rank gradient back through P:
    # with P square and orthogonal that is the authors' scaled full gradient, so
    # the whole rule (moments, channel or tensor scales, limiter, bias
    # correction) is compared step by step.
    import torch
    from pytorch_optimizer import APOLLO
    from pytorch_optimizer.optimizer.utils.galore import GaLoreProjector

    params = _params()
    grads = _grads(params)
    projections = {"tall": _orthogonal(5, 2), "wide": _orthogonal(4, 3)}
    ours = eqxopt.APOLLO(0.02, rank=5, scale_type=scale_type, scale=2.0, b1=0.8)
    state = ours.init(params)
    state = eqx.tree_at(
        lambda s: (s.projection["tall"], s.projection["wide"]),
        state,
        (jnp.asarray(projections["tall"]), jnp.asarray(projections["wide"])),
    )
    history, _ = _run(ours, params, grads, state)

    names = ["b", "tall", "wide"]  # jax.tree.leaves order
    tensors = {
        n: torch.nn.Parameter(torch.tensor(np.asarray(params[n]))) for n in names
    }
    ref = APOLLO(
        [
            {
                "params": [tensors["tall"], tensors["wide"]],
                "rank": 5,
                "update_proj_gap": 10_000,
                "scale": 2.0,
                "projection_type": "random",
            },
            {"params": [tensors["b"]]},
        ],
        lr=0.02,
        betas=(0.8, 0.999),
        scale_type=scale_type,
        foreach=False,
    )
    for n in ("tall", "wide"):
        projector = GaLoreProjector(rank=5, update_proj_gap=10_000, scale=1.0)
        projector.projection_type = "random"
        projector.ortho_matrix = torch.tensor(projections[n])
        ref.state[tensors[n]]["projector"] = projector
    expected = Trajectory(params)
    for g in grads:
        for n in names:
            tensors[n].grad = torch.tensor(np.asarray(g[n]))
        ref.step()
        expected.append(
            {n: jnp.asarray(tensors[n].detach().numpy().copy()) for n in names}
        )
    assert_histories_close(history, expected, rtol=2e-5, atol=2e-6)


def _authors_step(p, g, st, proj, lr, *, b1, b2, eps, scale, wd, scale_type,
                  scale_front, t):  # fmt: skip
    """The authors' `apollo_torch.AdamW.step` for one leaf, in NumPy (float64):
    `st` holds `exp_avg`, `exp_avg_sq` and, for a matrix, `scaled_grad`."""
    full = g
    if proj is not None:
        right = g.shape[0] >= g.shape[1]
        norm_dim = 0 if g.shape[0] < g.shape[1] else 1
        g = g @ proj.T if right else proj.T @ g
    st["exp_avg"] = st["exp_avg"] * b1 + g * (1 - b1)
    st["exp_avg_sq"] = st["exp_avg_sq"] * b2 + g * g * (1 - b2)
    denom = np.sqrt(st["exp_avg_sq"]) + eps
    step_size = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
    norm_grad = st["exp_avg"] / denom
    if proj is not None:
        if scale_type == "channel":
            factor = np.linalg.norm(norm_grad, axis=norm_dim) / (
                np.linalg.norm(g, axis=norm_dim) + 1e-8
            )
            if norm_dim == 1:
                factor = factor[:, None]
        else:
            factor = np.linalg.norm(norm_grad) / (np.linalg.norm(g) + 1e-8)
        scaled = full * factor
        if scale_front:
            scaled = scaled * np.sqrt(scale)
        if "scaled_grad" in st:
            norm = np.linalg.norm(scaled)
            limiter = max(norm / (st["scaled_grad"] + 1e-8), 1.01) / 1.01
            scaled = scaled / limiter
            st["scaled_grad"] = norm / limiter
        else:
            st["scaled_grad"] = np.linalg.norm(scaled)
        norm_grad = scaled
        if not scale_front:
            norm_grad = norm_grad * np.sqrt(scale)
    p = p - step_size * norm_grad
    return p - lr * wd * p


@pytest.mark.parametrize(
    "make",
    [
        lambda: eqxopt.APOLLO(
            0.01, rank=2, scale=3.0, weight_decay=0.1, update_proj_gap=7, key=4
        ),
        lambda: eqxopt.APOLLO(0.01, rank=3, scale_type="tensor", scale_front=True),
        lambda: eqxopt.APOLLOMini(0.003, weight_decay=0.05, update_proj_gap=11),
    ],
    ids=["APOLLO", "APOLLO-tensor-scale_front", "APOLLOMini"],
)
def test_apollo_matches_the_authors_code_with_random_projections(make):
    opt = make()
    params = _params()
    grads = _grads(params)
    state = opt.init(params)
    np_params = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    np_state = {n: {"exp_avg": 0.0, "exp_avg_sq": 0.0} for n in ("tall", "wide", "b")}
    history, expected = [], Trajectory(params)
    current = params
    for k, g in enumerate(grads):
        current, state = opt.step(g, state, current)
        history.append(current)
        # The projection this step used is the one in the new state.
        step = {}
        for n in ("tall", "wide", "b"):
            proj = state.projection[n]
            step[n] = _authors_step(
                np_params[n],
                np.asarray(g[n], np.float64),
                np_state[n],
                None if proj is None else np.asarray(proj, np.float64),
                0.01 if isinstance(opt, eqxopt.APOLLO) else 0.003,
                b1=0.9,
                b2=0.999,
                eps=1e-6,
                scale=float(opt.scale),
                wd=float(opt.weight_decay),
                scale_type=opt.scale_type,
                scale_front=opt.scale_front,
                t=k + 1,
            )
        np_params = step
        expected.append(jax.tree.map(jnp.asarray, dict(np_params)))
    assert_histories_close(history, expected, rtol=1e-4, atol=1e-6)


def test_projections_are_redrawn_every_update_proj_gap_steps():
    params = {"w": jnp.zeros((256, 64))}
    opt = eqxopt.APOLLO(1e-3, rank=16, update_proj_gap=3, key=1)
    state = opt.init(params)
    first = state.projection["w"]
    # Entries of variance 1 / r, as the authors draw them.
    assert first.shape == (16, 64)
    assert abs(float(jnp.var(first)) * 16 - 1.0) < 0.1
    seen = [first]
    g = {"w": jnp.ones((256, 64))}
    for _ in range(7):
        params, state = opt.step(g, state, params)
        seen.append(state.projection["w"])
    changed = [not bool(jnp.array_equal(a, b)) for a, b in itertools.pairwise(seen)]
    # New projections for steps 3 and 6 (0-based): the 4th and 7th updates.
    assert changed == [False, False, False, True, False, False, True]
    # Another key, other projections.
    other = eqxopt.APOLLO(1e-3, rank=16, key=2).init(params).projection["w"]
    assert not bool(jnp.array_equal(other, first))


def test_apollo_mini_keeps_sgd_like_state():
    params = {"w": jnp.zeros((512, 256)), "b": jnp.zeros(256)}
    state = eqxopt.APOLLOMini(1e-3).init(params)
    matrix = sum(x.size for x in (state.mu["w"], state.nu["w"], state.projection["w"]))
    # Two vectors of 512 and a projection of 256: about 1/100 of Adam's 2 * 512 * 256.
    assert matrix == 512 + 512 + 256
    assert state.mu["b"].shape == (256,)  # vectors: Adam
    # APOLLO at rank 32: 2 * 512 * 32 moments and a 32 x 256 projection.
    state = eqxopt.APOLLO(1e-3, rank=32).init(params)
    assert state.mu["w"].shape == (512, 32) and state.projection["w"].shape == (32, 256)


def test_apollo_trains_a_regression():
    key = jax.random.key(0)
    x = jax.random.normal(key, (128, 16))
    true = jax.random.normal(jax.random.key(1), (16, 8))
    y = x @ true
    params = {"w": jnp.zeros((16, 8)), "b": jnp.zeros(8)}

    def loss(p):
        return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)

    grad = jax.jit(jax.grad(loss))
    for opt in (eqxopt.APOLLO(0.05, rank=4), eqxopt.APOLLOMini(0.01)):
        p, state = params, opt.init(params)
        for _ in range(200):
            p, state = opt.step(grad(p), state, p)
        assert float(loss(p)) < 0.05 * float(loss(params)), type(opt).__name__


def test_apollo_errors_name_the_argument_or_leaf():
    with pytest.raises(ValueError, match="rank"):
        eqxopt.APOLLO(0.01, rank=0)
    with pytest.raises(ValueError, match="scale_type"):
        eqxopt.APOLLO(0.01, scale_type="row")
    with pytest.raises(ValueError, match="norm_growth_limit"):
        eqxopt.APOLLO(0.01, norm_growth_limit=0.5)
    with pytest.raises(ValueError, match="scale"):
        eqxopt.APOLLOMini(0.01, scale=0.0)
    with pytest.raises(ValueError, match="update_proj_gap"):
        eqxopt.APOLLOMini(0.01, update_proj_gap=0)
    with pytest.raises(TypeError, match="key"):
        eqxopt.APOLLO(0.01, key="seed")
    with pytest.raises(TypeError, match=r"APOLLO supports real .* params\['w'\]"):
        eqxopt.APOLLO(0.01).init({"w": jnp.ones((2, 2), jnp.complex64)})
