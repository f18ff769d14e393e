"""Shampoo and PSGD-Kron: against NumPy float64 transcriptions of the published
algorithms (no Shampoo or PSGD package installs here), and on an ill-conditioned
quadratic where a Kronecker-factored preconditioner beats Adam."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt
from helpers import Trajectory, assert_histories_close, grad_stream

STEPS = 30


def _tree(seed=0):
    rng = np.random.default_rng(seed)

    def leaf(*shape):
        return jnp.asarray(rng.normal(size=shape), jnp.float32)

    return {"w": leaf(5, 7), "b": leaf(6), "s": leaf(), "t": leaf(3, 4, 2)}


PARAMS = _tree()
GRADS = list(grad_stream(PARAMS, STEPS))


def _reference_history(fn, **kw):
    """`fn` (a NumPy transcription over leaf lists) run on PARAMS/GRADS, as a
    `Trajectory` of trees."""
    treedef = jax.tree.structure(PARAMS)
    history = Trajectory(PARAMS)
    for leaves in fn(
        jax.tree.leaves(PARAMS), [jax.tree.leaves(g) for g in GRADS], **kw
    ):
        history.append(jax.tree.unflatten(treedef, leaves))
    return history


def _block_slices(shape, block_size):
    """The blocks of a tensor as tuples of slices, unpadded (the last block along
    an axis is shorter), as distributed Shampoo's `multi_dim_split` makes them."""
    ranges = [
        [slice(s, min(s + block_size, d)) for s in range(0, d, block_size)]
        for d in shape
    ]
    return list(itertools.product(*ranges))


def _along_axes(x, mats):
    """`x` multiplied along each axis `i` by `mats[i]` (contracting its first
    index): `x x_1 M_1 ... x_n M_n`."""
    for m in mats:
        x = np.tensordot(x, m, axes=([0], [0]))
    return x


# ------------------------------------------------------------------------------------
# Shampoo (arXiv 2309.06497, Algorithm 1 with grafting, blocking, filtering)
# ------------------------------------------------------------------------------------


def shampoo_numpy(
    params,
    grads,
    learning_rate=1e-3,
    b1=0.9,
    b2=0.999,
    eps=1e-12,
    weight_decay=0.0,
    grafting="adam",
    graft_b2=0.999,
    graft_eps=1e-8,
    precondition_frequency=20,
    start_preconditioning_step=None,
    block_size=1024,
):
    """Distributed Shampoo's step, per block, in float64; returns the parameters
    after each step."""
    start = (
        precondition_frequency
        if start_preconditioning_step is None
        else start_preconditioning_step
    )
    params = [np.asarray(p, np.float64).copy() for p in params]
    states = []
    for p in params:
        st = {"m": np.zeros_like(p), "v": np.zeros_like(p), "blocks": []}
        if p.ndim:
            for sl in _block_slices(p.shape, block_size):
                shape = p[sl].shape
                st["blocks"].append(
                    (
                        sl,
                        [np.zeros((d, d)) for d in shape],
                        [np.eye(d) for d in shape],
                    )
                )
        states.append(st)
    history = []
    for t, step_grads in enumerate(grads, start=1):
        new = []
        for p, g, st in zip(params, step_grads, states):
            g = np.asarray(g, np.float64)
            st["m"] = b1 * st["m"] + (1 - b1) * g
            mh = st["m"] / (1 - b1**t)
            if grafting == "adam":
                st["v"] = graft_b2 * st["v"] + (1 - graft_b2) * g * g
                d = mh / (np.sqrt(st["v"] / (1 - graft_b2**t)) + graft_eps)
            else:
                st["v"] = st["v"] + g * g
                d = mh / (np.sqrt(st["v"]) + graft_eps)
            direction = d.copy()
            if p.ndim and t >= start:
                direction = np.zeros_like(p)
            for sl, factors, roots in st["blocks"]:
                gb = g[sl]
                for i in range(gb.ndim):
                    others = [j for j in range(gb.ndim) if j != i]
                    outer = np.tensordot(gb, gb, axes=(others, others))
                    if b2 == 1.0:
                        factors[i] = factors[i] + outer
                    else:
                        factors[i] = b2 * factors[i] + (1 - b2) * outer
                if t % precondition_frequency == 0:
                    bc = 1.0 if b2 == 1.0 else 1 - b2**t
                    for i, f in enumerate(factors):
                        w, q = np.linalg.eigh(f / bc)
                        w = np.maximum(w, 0.0) + eps
                        roots[i] = q @ np.diag(w ** (-1.0 / (2 * gb.ndim))) @ q.T
                if t >= start:
                    s = _along_axes(mh[sl], roots)
                    s_norm = np.linalg.norm(s)
                    scale = np.linalg.norm(d[sl]) / s_norm if s_norm > 0 else 0.0
                    direction[sl] = s * scale
            new.append(p - learning_rate * (direction + weight_decay * p))
        params = new
        history.append([x.copy() for x in params])
    return history


SHAMPOO_CONFIGS = {
    # eps well above float32's rounding of the factors' eigenvalues: the inverse
    # roots of nearly singular factors (a 6-long bias sees rank-one statistics)
    # would otherwise amplify rounding differences, not the algorithm's.
    "adam-blocked": dict(
        learning_rate=0.05,
        eps=1e-3,
        weight_decay=0.01,
        precondition_frequency=3,
        block_size=4,
    ),
    "adagrad-sum": dict(
        learning_rate=0.05,
        b1=0.0,
        b2=1.0,
        eps=1e-3,
        grafting="adagrad",
        precondition_frequency=2,
        start_preconditioning_step=4,
    ),
    "early-start": dict(
        learning_rate=0.02,
        b1=0.5,
        b2=0.9,
        eps=1e-2,
        graft_b2=0.99,
        precondition_frequency=5,
        start_preconditioning_step=1,
        block_size=3,
    ),
}


# One configuration in `make test`; the others (a compile each) are slow.
@pytest.mark.parametrize(
    "name",
    [
        name if name == "adam-blocked" else pytest.param(name, marks=pytest.mark.slow)
        for name in SHAMPOO_CONFIGS
    ],
)
def test_shampoo_matches_numpy_transcription(name):
    # float32 (eqxopt, with padded blocks) against float64 (NumPy, unpadded
    # blocks): eigendecompositions in float32 agree to ~1e-5 relative.
    kw = SHAMPOO_CONFIGS[name]
    opt = eqxopt.Shampoo(**kw)
    state = opt.init(PARAMS)
    params, actual = PARAMS, []
    for g in GRADS:
        params, state = opt.step(g, state, params)
        actual.append(params)
    expected = _reference_history(shampoo_numpy, **kw)
    assert_histories_close(actual, expected, rtol=2e-4, atol=2e-5)


def test_shampoo_state_is_blocked_on_a_leading_axis():
    opt = eqxopt.Shampoo(block_size=4)
    state = opt.init(PARAMS)
    # w (5, 7): 2 x 2 blocks of (4, 4), padded.
    assert [f.shape for f in state.factors["w"]] == [(4, 4, 4), (4, 4, 4)]
    assert [f.shape for f in state.factors["b"]] == [(2, 4, 4)]
    assert [f.shape for f in state.factors["t"]] == [(1, 3, 3), (1, 4, 4), (1, 2, 2)]
    assert state.factors["s"] is None and state.roots["s"] is None
    np.testing.assert_array_equal(state.roots["w"][0][3], np.eye(4))


def test_shampoo_errors_name_the_argument():
    with pytest.raises(ValueError, match="b2"):
        eqxopt.Shampoo(b2=0.0)
    with pytest.raises(ValueError, match="eps"):
        eqxopt.Shampoo(eps=0.0)
    with pytest.raises(ValueError, match="block_size must be an int >= 1"):
        eqxopt.Shampoo(block_size=0)
    with pytest.raises(ValueError, match="precondition_frequency must be an int >= 1"):
        eqxopt.Shampoo(precondition_frequency=0)
    with pytest.raises(ValueError, match="start_preconditioning_step must be an int"):
        eqxopt.Shampoo(start_preconditioning_step=0)
    with pytest.raises(ValueError, match="grafting must be one of"):
        eqxopt.Shampoo(grafting="sgd")
    with pytest.raises(TypeError, match=r"Shampoo supports real .*\['w'\]"):
        eqxopt.Shampoo().init({"w": jnp.ones((2, 2), jnp.complex64)})


# ------------------------------------------------------------------------------------
# Convergence on an ill-conditioned quadratic with Kronecker structure
# ------------------------------------------------------------------------------------

N = 20
# Condition number 1e2 per factor, 1e4 for the Hessian A (x) B as a whole.
FACTOR_COND = 100.0


def _kronecker_quadratic():
    rng = np.random.default_rng(0)

    def spd():
        u, _ = np.linalg.qr(rng.normal(size=(N, N)))
        return jnp.asarray((u * np.logspace(0, np.log10(FACTOR_COND), N)) @ u.T)

    a, b = spd(), spd()
    target = jnp.asarray(rng.normal(size=(N, N)), jnp.float32)

    def loss(w):
        e = w - target
        return 0.5 * jnp.sum(e * (a @ e @ b))

    return loss


KRON_LOSS = _kronecker_quadratic()


def steps_to_threshold(opt, threshold, max_steps):
    """The number of steps `opt` takes from zeros to a loss below `threshold`
    (`max_steps + 1` if it never gets there)."""
    grad = jax.grad(KRON_LOSS)

    @jax.jit
    def losses(opt):
        w = jnp.zeros((N, N))

        def body(carry, _):
            w, state = carry
            w, state = opt.step(grad(w), state, w)
            return (w, state), KRON_LOSS(w)

        _, out = jax.lax.scan(body, (w, opt.init(w)), None, length=max_steps)
        return out

    hit = np.nonzero(np.asarray(losses(opt)) < threshold)[0]
    return int(hit[0]) + 1 if hit.size else max_steps + 1


MAX_STEPS = 600


@functools.cache
def _threshold_and_adam_best():
    """The loss threshold (1e-6 of the start) and the fewest steps Adam takes to
    it over a log grid of learning rates, each constant or decayed by 0.98 or
    0.99 per step (one compiled run per schedule kind: the values are arrays)."""
    threshold = 1e-6 * float(KRON_LOSS(jnp.zeros((N, N))))
    schedules = [
        lambda lr: lr,
        lambda lr: eqxopt.ExponentialDecay(lr, 1, 0.98),
        lambda lr: eqxopt.ExponentialDecay(lr, 1, 0.99),
    ]
    best = min(
        steps_to_threshold(eqxopt.Adam(schedule(lr)), threshold, MAX_STEPS)
        for schedule in schedules
        for lr in np.logspace(-2, 0.5, 11)
    )
    return threshold, best


@pytest.mark.slow
def test_shampoo_beats_tuned_adam_on_a_kronecker_quadratic():
    threshold, adam = _threshold_and_adam_best()
    shampoo = steps_to_threshold(
        eqxopt.Shampoo(0.3, b2=0.99, precondition_frequency=5), threshold, MAX_STEPS
    )
    # Measured: Adam's best 476 steps (constant lr 0.56), Shampoo 122.
    assert adam <= MAX_STEPS
    assert shampoo < adam / 2, (shampoo, adam)


# ------------------------------------------------------------------------------------
# PSGD-Kron (psgd_torch kron.py / psgd_jax kron.py / heavyball PSGDKron)
# ------------------------------------------------------------------------------------


def psgd_draws(seed, steps, leaves):
    """The random draws of `PSGDKron` with key `seed`, by the scheme its docstring
    states: per step `(uniform for the update, uniform for the balance, one
    standard normal probe per leaf)`."""
    key = jax.random.key(seed)
    draws = []
    for _ in range(steps):
        key, k_update, k_probe, k_balance = jax.random.split(key, 4)
        probes = [
            np.asarray(
                jax.random.normal(jax.random.fold_in(k_probe, i), p.shape, p.dtype),
                np.float64,
            )
            for i, p in enumerate(leaves)
        ]
        draws.append(
            (
                float(jax.random.uniform(k_update, dtype=jnp.float32)),
                float(jax.random.uniform(k_balance, dtype=jnp.float32)),
                probes,
            )
        )
    return draws


def _mode_product(x, m, axis):
    """`x` with the matrix `m` applied along `axis`: `y[.., a, ..] = sum_j
    m[a, j] x[.., j, ..]`."""
    return np.moveaxis(np.tensordot(m, x, axes=([1], [axis])), 0, axis)


def _lower_bound_numpy(a):
    """The PSGD authors' spectral-norm lower bound (psgd_jax `_norm_lower_bound`)."""
    max_abs = np.max(np.abs(a))
    if max_abs == 0:
        return 0.0
    a = a / max_abs
    aa = a * a
    col, row = aa.sum(axis=0), aa.sum(axis=1)
    i, j = int(np.argmax(col)), int(np.argmax(row))
    if col[i] > row[j]:
        x = a[:, i] @ a
        return max_abs * np.linalg.norm((x / np.linalg.norm(x)) @ a.T)
    x = a @ a[j, :]
    return max_abs * np.linalg.norm(a.T @ (x / np.linalg.norm(x)))


def psgd_kron_numpy(
    params,
    grads,
    draws,
    learning_rate=1e-3,
    b1=0.9,
    weight_decay=0.0,
    precond_lr=0.1,
    precond_init_scale=1.0,
    update_probability=None,
    max_size_triangular=8192,
    min_ndim_triangular=2,
    block_size=None,
    momentum_into_precond_update=True,
):
    """PSGD-Kron's step (kron.py) per block, in float64, fed the given draws;
    returns the parameters after each step."""
    params = [np.asarray(p, np.float64).copy() for p in params]
    states = []
    for p in params:
        shape = p.shape or (1,)
        nominal = [d if block_size is None else min(d, block_size) for d in shape]
        scale = precond_init_scale ** (1 / len(shape))
        diagonal = [
            b == 1 or b > max_size_triangular or p.ndim < min_ndim_triangular
            for b in nominal
        ]
        blocks = []
        for sl in _block_slices(shape, block_size or max(shape)):
            lens = [s.stop - s.start for s in sl]
            qs = [
                scale * (np.ones(n) if diag else np.eye(n))
                for n, diag in zip(lens, diagonal)
            ]
            blocks.append((sl, qs))
        states.append({"m": np.zeros(shape), "blocks": blocks})

    def as_matrix(q):
        return np.diag(q) if q.ndim == 1 else q

    history = []
    for t, (step_grads, (u_update, u_balance, probes)) in enumerate(
        zip(grads, draws), start=1
    ):
        prob = (
            min(max(np.exp(-0.001 * (t - 500)), 0.03), 1.0)
            if update_probability is None
            else update_probability
        )
        do_update, do_balance = u_update < prob, u_balance < 0.01
        new = []
        for p, g, v, st in zip(params, step_grads, probes, states):
            shape = p.shape or (1,)
            g = np.asarray(g, np.float64).reshape(shape)
            v = v.reshape(shape)
            st["m"] = b1 * st["m"] + (1 - b1) * g
            mh = st["m"] / (1 - b1**t)
            fit_to = mh if momentum_into_precond_update else g
            pre = np.zeros(shape)
            for sl, qs in st["blocks"]:
                if do_update:
                    if do_balance:
                        norms = [np.max(np.abs(q)) for q in qs]
                        gmean = np.prod(norms) ** (1 / len(qs))
                        qs[:] = [q * gmean / n for q, n in zip(qs, norms)]
                    a, b = fit_to[sl], v[sl]
                    for i, q in enumerate(qs):
                        a = _mode_product(a, as_matrix(q), i)
                        b = _mode_product(b, np.linalg.inv(as_matrix(q)).T, i)
                    for i, q in enumerate(qs):
                        others = [j for j in range(a.ndim) if j != i]
                        t1 = np.tensordot(a, a, axes=(others, others))
                        t2 = np.tensordot(b, b, axes=(others, others))
                        if q.ndim == 1:
                            t1, t2 = np.diag(t1), np.diag(t2)
                            norm = max(np.max(np.abs(t1 + t2)), 1e-30)
                            qs[i] = q - precond_lr / norm * (t1 - t2) * q
                        else:
                            norm = max(_lower_bound_numpy(t1 + t2), 1e-30)
                            qs[i] = q - precond_lr / norm * np.triu(t1 - t2) @ q
                x = mh[sl]
                for i, q in enumerate(qs):
                    m = as_matrix(q)
                    x = _mode_product(x, m.T @ m, i)
                pre[sl] = x
            rms = np.sqrt(np.mean(pre * pre))
            pre = pre * min(1.0, 1.1 / (rms + 1e-12))
            pre = pre.reshape(p.shape)
            if p.ndim >= 2:
                pre = pre + weight_decay * p
            new.append(p - learning_rate * pre)
        params = new
        history.append([x.copy() for x in params])
    return history


PSGD_CONFIGS = {
    "blocked": dict(learning_rate=0.05, weight_decay=0.01, block_size=4, key=1),
    "options": dict(
        learning_rate=0.02,
        b1=0.5,
        precond_lr=0.2,
        precond_init_scale=0.5,
        update_probability=0.6,
        max_size_triangular=3,
        min_ndim_triangular=1,
        momentum_into_precond_update=False,
        key=7,
    ),
}


@pytest.mark.parametrize(
    "name",
    [
        name if name == "blocked" else pytest.param(name, marks=pytest.mark.slow)
        for name in PSGD_CONFIGS
    ],
)
def test_psgd_kron_matches_numpy_transcription_with_the_same_draws(name):
    kw = dict(PSGD_CONFIGS[name])
    opt = eqxopt.PSGDKron(**kw)
    state = opt.init(PARAMS)
    params, actual = PARAMS, []
    for g in GRADS:
        params, state = opt.step(g, state, params)
        actual.append(params)
    draws = psgd_draws(kw.pop("key"), STEPS, jax.tree.leaves(PARAMS))
    expected = _reference_history(psgd_kron_numpy, draws=draws, **kw)
    assert_histories_close(actual, expected, rtol=2e-4, atol=2e-5)


@pytest.mark.slow
def test_psgd_kron_beats_tuned_adam_on_a_kronecker_quadratic():
    threshold, adam = _threshold_and_adam_best()
    # PSGD's whitened steps keep their size as the gradients shrink, so it needs
    # a decaying learning rate to settle (Adam had the same choice above).
    psgd = steps_to_threshold(
        eqxopt.PSGDKron(eqxopt.ExponentialDecay(0.1, 1, 0.98), key=0),
        threshold,
        MAX_STEPS,
    )
    # Measured: Adam's best 476 steps, PSGD-Kron 197.
    assert adam <= MAX_STEPS
    assert psgd < adam / 2, (psgd, adam)


def test_psgd_kron_state_layout():
    opt = eqxopt.PSGDKron(block_size=4, max_size_triangular=3, precond_init_scale=4.0)
    state = opt.init(PARAMS)
    # w (5, 7) in 2 x 2 blocks of (4, 4): longer than 3, so diagonal factors.
    assert [q.shape for q in state.q["w"]] == [(4, 4), (4, 4)]
    np.testing.assert_allclose(state.q["w"][0], 2.0)  # 4**(1/2)
    # t (3, 4, 2): one block; triangular factors where the axis is <= 3.
    assert [q.shape for q in state.q["t"]] == [(1, 3, 3), (1, 4), (1, 2, 2)]
    # A 1-D leaf (under min_ndim_triangular) and a 0-d leaf: diagonal.
    assert [q.shape for q in state.q["b"]] == [(2, 4)]
    assert [q.shape for q in state.q["s"]] == [(1, 1)]


def test_psgd_kron_draws_come_from_its_key():
    def run(key):
        opt = eqxopt.PSGDKron(0.05, key=key)
        state = opt.init(PARAMS)
        params = PARAMS
        for g in GRADS[:3]:
            params, state = opt.step(g, state, params)
        return np.asarray(params["w"])

    np.testing.assert_array_equal(run(5), run(jax.random.key(5)))
    assert not np.allclose(run(5), run(6))


def test_psgd_kron_errors_name_the_argument():
    with pytest.raises(ValueError, match="precond_lr"):
        eqxopt.PSGDKron(precond_lr=0.0)
    with pytest.raises(ValueError, match="update_probability"):
        eqxopt.PSGDKron(update_probability=1.5)
    with pytest.raises(TypeError, match="precond_init_scale must be a float"):
        eqxopt.PSGDKron(precond_init_scale=eqxopt.Constant(1.0))
    with pytest.raises(ValueError, match="block_size must be an int >= 1"):
        eqxopt.PSGDKron(block_size=0)
    with pytest.raises(ValueError, match="max_size_triangular must be an int >= 1"):
        eqxopt.PSGDKron(max_size_triangular=0)
    with pytest.raises(TypeError, match="key must be an int seed or a single typed"):
        eqxopt.PSGDKron(key="a")
    with pytest.raises(TypeError, match=r"PSGDKron supports real .*\['w'\]"):
        eqxopt.PSGDKron().init({"w": jnp.ones((2, 2), jnp.complex64)})


def test_state_of_a_large_leaf_stays_per_block():
    # Shapes only (eval_shape): an embedding-sized leaf keeps block-sized factors,
    # stacked on a leading axis; PSGD's axis above max_size_triangular is diagonal.
    big = {"w": jax.ShapeDtypeStruct((50_000, 1024), jnp.float32)}
    shampoo = jax.eval_shape(eqxopt.Shampoo(block_size=512).init, big)
    assert [f.shape for f in shampoo.factors["w"]] == [(196, 512, 512)] * 2
    psgd = jax.eval_shape(eqxopt.PSGDKron().init, big)
    assert [q.shape for q in psgd.q["w"]] == [(1, 50_000), (1, 1024, 1024)]
    blocked = jax.eval_shape(eqxopt.PSGDKron(block_size=1024).init, big)
    assert [q.shape for q in blocked.q["w"]] == [(49, 1024, 1024), (49, 1024, 1024)]
