"""StochasticRounding and KahanSummation: bf16/f16 parameters without float32 master
weights (issue 11, item 2), against torchao's stochastic rounding and optimi's
`kahan_sum=True` AdamW."""

import io

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from optimi import AdamW as OptimiAdamW
from torchao.optim import quant_utils

import eqxopt
from helpers import assert_moved

BF16 = jnp.bfloat16


def run(opt, grads_seq, params, *, via_update=False):
    state = opt.init(params)
    for g in grads_seq:
        if via_update:
            u, state = opt.update(g, state, params)
            params = eqxopt.apply_updates(params, u)
        else:
            params, state = opt.step(g, state, params)
    return params, state


def wrappers(inner):
    return [
        eqxopt.StochasticRounding(inner, key=0),
        eqxopt.KahanSummation(inner),
    ]


# (a) The example: 1.0 in bf16, 100 SGD steps of 1e-4 with gradient 1.
@pytest.mark.parametrize(
    "dtype, via_update",
    [(jnp.bfloat16, False), (jnp.bfloat16, True), (jnp.float16, False)],
)
def test_small_updates_are_not_lost(dtype, via_update):
    p = {"w": jnp.ones((1024,), dtype)}
    g = [{"w": jnp.ones((1024,), dtype)}] * 100
    plain, _ = run(eqxopt.SGD(1e-4), g, p, via_update=via_update)
    assert np.all(np.asarray(plain["w"], np.float32) == 1.0)  # every update lost
    sr_opt, kahan_opt = wrappers(eqxopt.SGD(1e-4))
    sr, _ = run(sr_opt, g, p, via_update=via_update)
    assert sr["w"].dtype == dtype
    # Each element is a random walk on the grid with mean 0.99 (bf16: spacing
    # 2**-8 below 1, a standard deviation of about 0.006 after 100 steps), so the
    # mean of 1024 elements is within about 2e-4 of 0.99.
    assert abs(float(np.mean(np.asarray(sr["w"], np.float64))) - 0.99) < 1e-3
    kahan, state = run(kahan_opt, g, p, via_update=via_update)
    total = np.asarray(kahan["w"], np.float64) + np.asarray(
        state.compensation["w"], np.float64
    )
    np.testing.assert_allclose(total, 0.99, atol=1e-4)
    # The parameter itself is 0.99 to the dtype's resolution.
    spacing = float(jnp.finfo(dtype).eps) / 2
    np.testing.assert_allclose(np.asarray(kahan["w"], np.float64), 0.99, atol=spacing)


def test_update_gives_the_same_parameters_as_step():
    key = jax.random.key(1)
    p = {"w": jax.random.normal(key, (257,)).astype(BF16), "b": jnp.zeros((3,), BF16)}
    gs = [
        jax.tree.map(lambda x, i=i: (jnp.sin(x * (i + 1)) * 3).astype(BF16), p)
        for i in range(5)
    ]
    for opt in wrappers(eqxopt.Adam(0.3)):
        a, sa = run(opt, gs, p)
        b, sb = run(opt, gs, p, via_update=True)
        for x, y in zip(jax.tree.leaves((a, sa)), jax.tree.leaves((b, sb))):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        assert_moved(p, a, rtol=0, atol=1e-3)


@pytest.mark.parametrize("wrap", [0, 1])
def test_update_matches_step_for_far_moves(wrap):
    # Parameters moving by much more than their own size (tiny to large, across
    # signs, to and from zero and infinity): `update`'s delta, applied, gives what
    # `step` gives.
    rng = np.random.default_rng(0)
    n = 20000
    mags = 10.0 ** rng.uniform(-30, 30, size=(2, n))
    vals = mags * rng.choice([-1.0, 1.0], size=(2, n))
    vals[:, :50] = 0.0
    vals[0, 50:60] = np.inf
    p = jnp.asarray(vals[0], jnp.float32).astype(BF16)
    u = jnp.asarray(vals[1] - np.nan_to_num(vals[0], posinf=0), jnp.float32)
    u = u.astype(BF16)
    opt = wrappers(eqxopt.SGD(1.0))[wrap]
    grads = {"w": -u}
    stepped, _ = opt.step(grads, opt.init({"w": p}), {"w": p})
    upd, _ = opt.update(grads, opt.init({"w": p}), {"w": p})
    assert upd["w"].dtype == BF16
    applied = eqxopt.apply_updates({"w": p}, upd)
    np.testing.assert_array_equal(
        np.asarray(applied["w"], np.float32), np.asarray(stepped["w"], np.float32)
    )


# (b) Kahan summation against optimi.
def test_kahan_adamw_matches_optimi_and_tracks_float32_masters():
    rng = np.random.default_rng(0)
    n, steps, lr = 256, 40, 1e-2
    p0 = rng.normal(size=n).astype(np.float32)
    grads = [rng.normal(size=n).astype(np.float32) for _ in range(steps)]
    grads_bf16 = [np.asarray(jnp.asarray(g).astype(BF16), np.float32) for g in grads]
    # optimi: bf16 parameters (and so bf16 moments), Kahan compensation in bf16.
    # weight_decay=0: optimi multiplies the bf16 parameter by (1 - lr * wd) outside
    # the compensation (so tiny decays round away there), eqxopt compensates it.
    tp = torch.nn.Parameter(torch.tensor(p0).to(torch.bfloat16))
    topt = OptimiAdamW([tp], lr=lr, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0,
                       kahan_sum=True)  # fmt: skip
    for g in grads_bf16:
        tp.grad = torch.tensor(g).to(torch.bfloat16)
        topt.step()
    ref = tp.detach().float().numpy()

    def adamw(**kw):
        return eqxopt.AdamW(lr, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.0, **kw)

    gs = [{"w": jnp.asarray(g).astype(BF16)} for g in grads_bf16]
    pb = {"w": jnp.asarray(p0).astype(BF16)}
    kahan, _ = run(eqxopt.KahanSummation(adamw(mu_dtype=BF16, nu_dtype=BF16)), gs, pb)
    plain, _ = run(adamw(), gs, pb)
    master, _ = run(adamw(), [{"w": jnp.asarray(g)} for g in grads_bf16],
                    {"w": jnp.asarray(pb["w"], jnp.float32)})  # fmt: skip
    k = np.asarray(kahan["w"], np.float32)
    # Same trajectory to bf16 rounding: within 2 bf16 steps (the moments
    # are bf16 on both sides but rounded at different points: optimi keeps the
    # debiased moments), and most elements identical.
    ulp = 2.0 ** (np.floor(np.log2(np.abs(ref))) - 7)
    # Near zero (where a bf16 step is tiny) the two differ by up to a tenth of a
    # learning rate; 85% of the elements are identical.
    assert np.all(np.abs(k - ref) <= 2 * ulp + 0.1 * lr)
    assert np.mean(k == ref) > 0.8
    assert_moved(pb["w"], kahan["w"], rtol=0, atol=1e-3)
    # Against float32 master weights: much closer than plain bf16.
    m = np.asarray(master["w"], np.float32)
    err_kahan = np.abs(k - m).mean()
    err_plain = np.abs(np.asarray(plain["w"], np.float32) - m).mean()
    assert err_kahan < 0.5 * err_plain, (err_kahan, err_plain)


# (c) Stochastic rounding.
def test_round_stochastic_bf16_matches_torchao_bit_for_bit(monkeypatch):
    rng = np.random.default_rng(0)
    x = (10.0 ** rng.uniform(-30, 30, 4096) * rng.choice([-1, 1], 4096)).astype(
        np.float32
    )
    x[:3] = [0.0, np.float32(3.3895314e38), np.inf]
    rand = rng.integers(0, 1 << 16, x.shape, dtype=np.int32)
    monkeypatch.setattr(torch, "randint", lambda *a, **k: torch.tensor(rand))
    ref = quant_utils._fp32_to_bf16_sr(torch.tensor(x)).float().numpy()
    # torchao rounds up where rand < fraction; the sum form carries where
    # bits >= 2**16 - fraction: the same event for bits = 0xFFFF - rand.
    bits = jnp.asarray(0xFFFF - rand, jnp.uint16)
    ours = eqxopt.round_stochastic_bf16(jnp.asarray(x), bits)
    assert ours.dtype == BF16
    np.testing.assert_array_equal(np.asarray(ours, np.float32), ref)


def test_round_stochastic_bf16_takes_jax_default_uint32_bits():
    """`jax.random.bits(key, shape)` gives uint32: its high 16 bits are the
    rounding bits (a uint32 added whole would carry into the exponent). Values bf16
    holds come back as they are; one 0.3 of a step above 1 rounds to either
    neighbour, up with probability 0.3."""
    n = 20000
    bits = jax.random.bits(jax.random.key(0), (n,))
    assert bits.dtype == jnp.uint32
    exact = jnp.asarray(np.geomspace(1e-30, 1e30, n), jnp.float32).astype(BF16)
    got = eqxopt.round_stochastic_bf16(exact.astype(jnp.float32), bits)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(exact))
    step = float(jnp.finfo(BF16).eps)
    x = jnp.full((n,), 1.0 + 0.3 * step, jnp.float32)
    rounded = eqxopt.round_stochastic_bf16(x, bits)
    high = (bits >> 16).astype(jnp.uint16)
    np.testing.assert_array_equal(
        np.asarray(rounded), np.asarray(eqxopt.round_stochastic_bf16(x, high))
    )
    vals = np.asarray(rounded, np.float64)
    assert set(np.unique(vals)) == {1.0, 1.0 + step}
    assert abs(vals.mean() - (1.0 + 0.3 * step)) < 5 * step * np.sqrt(0.21 / n)


def test_round_stochastic_bf16_refuses_other_bits_and_inputs():
    x = jnp.ones((4,), jnp.float32)
    with pytest.raises(TypeError, match=r"bits must be uint16 or uint32.*int32"):
        eqxopt.round_stochastic_bf16(x, jnp.zeros((4,), jnp.int32))
    with pytest.raises(TypeError, match=r"bits must be uint16 or uint32.*float32"):
        eqxopt.round_stochastic_bf16(x, jnp.zeros((4,), jnp.float32))
    with pytest.raises(ValueError, match=r"bits must have x's shape.*\(4,\).*\(2,\)"):
        eqxopt.round_stochastic_bf16(x, jnp.zeros((2,), jnp.uint16))
    with pytest.raises(TypeError, match="x must be float32, got bfloat16"):
        eqxopt.round_stochastic_bf16(x.astype(BF16), jnp.zeros((4,), jnp.uint16))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_stochastic_rounding_is_unbiased(dtype):
    # A value 0.3 of the way between 1 and the next number of `dtype`, rounded by the
    # wrapper in 20000 elements: the mean is the value to within 5 standard errors.
    step = float(jnp.finfo(dtype).eps)
    n = 20000
    p = {"w": jnp.ones((n,), dtype)}
    u = float(jnp.asarray(0.3 * step, dtype))
    opt = eqxopt.StochasticRounding(eqxopt.SGD(1.0), key=3)
    new, _ = opt.step({"w": jnp.full((n,), -u, dtype)}, opt.init(p), p)
    vals = np.asarray(new["w"], np.float64)
    assert set(np.unique(vals)) == {1.0, 1.0 + step}
    se = step * np.sqrt(0.25 / n)
    assert abs(vals.mean() - (1.0 + u)) < 5 * se


def test_rounding_bits_come_from_the_key_and_step():
    p = {"a": jnp.ones((64,), BF16), "b": jnp.ones((64,), BF16)}
    g = [{"a": jnp.full((64,), -1e-3, BF16), "b": jnp.full((64,), -1e-3, BF16)}] * 3

    def final(key):
        return np.asarray(
            run(eqxopt.StochasticRounding(eqxopt.SGD(1.0), key=key), g, p)[0]["a"],
            np.float32,
        )

    np.testing.assert_array_equal(final(0), final(0))
    np.testing.assert_array_equal(final(jax.random.key(5)), final(5))
    assert not np.array_equal(final(0), final(1))
    new, state = run(eqxopt.StochasticRounding(eqxopt.SGD(1.0), key=0), g, p)
    assert int(state.step) == 3
    # The two leaves get different bits.
    assert not np.array_equal(np.asarray(new["a"]), np.asarray(new["b"]))


# (d) Pass-through, None gradients, non-float leaves, state, donation, serialisation.
@pytest.mark.parametrize("via_update", [False, True])
def test_other_leaves_are_updated_as_by_the_inner_optimizer(via_update):
    inner = eqxopt.AdamW(0.1, weight_decay=0.1)
    p = {
        "f32": jnp.linspace(-1, 1, 7),
        "bf16": jnp.linspace(-1, 1, 5).astype(BF16),
        "int": jnp.arange(3),
        "fn": jax.nn.relu,
        "frozen": jnp.ones((2,), BF16),
    }
    gs = [
        {"f32": jnp.cos(p["f32"] * i), "bf16": jnp.ones((5,), BF16) * i,
         "int": None, "fn": None, "frozen": None}
        for i in range(1, 4)
    ]  # fmt: skip
    alone, _ = run(inner, gs, p, via_update=via_update)
    for opt in wrappers(inner):
        new, state = run(opt, gs, p, via_update=via_update)
        np.testing.assert_array_equal(np.asarray(new["f32"]), np.asarray(alone["f32"]))
        assert new["int"] is p["int"] or np.array_equal(new["int"], p["int"])
        assert new["fn"] is jax.nn.relu
        np.testing.assert_array_equal(np.asarray(new["frozen"]), np.ones(2))
        assert new["bf16"].dtype == BF16
    _, state = run(eqxopt.KahanSummation(inner), gs, p)
    comp = state.compensation
    assert comp["f32"] is None and comp["int"] is None and comp["fn"] is None
    assert comp["bf16"].dtype == BF16
    np.testing.assert_array_equal(np.asarray(comp["frozen"]), np.zeros(2))


def test_float32_only_trees_match_the_inner_optimizer_exactly():
    p = {"w": jnp.linspace(-1, 1, 9)}
    gs = [{"w": jnp.sin(p["w"] * i)} for i in range(1, 4)]
    alone, s_alone = run(eqxopt.Lion(0.01), gs, p)
    for opt in wrappers(eqxopt.Lion(0.01)):
        new, state = run(opt, gs, p)
        np.testing.assert_array_equal(np.asarray(new["w"]), np.asarray(alone["w"]))
        for x, y in zip(jax.tree.leaves(state.inner), jax.tree.leaves(s_alone)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_donated_steps_keep_the_key_and_the_state_serialises(tmp_path):
    key = jax.random.key(7)
    opt = eqxopt.StochasticRounding(eqxopt.SGD(0.1, momentum=0.9), key=key)
    p = {"w": jnp.ones((16,), BF16)}
    g = {"w": jnp.full((16,), 1e-3, BF16)}
    state = opt.init(p)
    for _ in range(2):
        p, state = opt.step(g, state, p, donate=True)
    jax.random.normal(key)  # the user's key is alive
    assert not opt.key.is_deleted()
    for o in [opt, eqxopt.KahanSummation(eqxopt.SGD(0.1, momentum=0.9))]:
        s = run(o, [g] * 2, {"w": jnp.ones((16,), BF16)})[1]
        buf = io.BytesIO()
        eqx.tree_serialise_leaves(buf, s)
        buf.seek(0)
        back = eqx.tree_deserialise_leaves(buf, o.init({"w": jnp.ones((16,), BF16)}))
        for x, y in zip(jax.tree.leaves(s), jax.tree.leaves(back)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# (e) Errors.
def test_errors_name_the_argument():
    with pytest.raises(TypeError, match="key must be an integer seed or a JAX"):
        eqxopt.StochasticRounding(eqxopt.SGD(0.1), key="seed")
    with pytest.raises(ValueError, match="key must be an integer seed, a typed key"):
        eqxopt.StochasticRounding(eqxopt.SGD(0.1), key=jnp.zeros((3,), jnp.float32))
    with pytest.raises(ValueError, match="key must be a single key"):
        eqxopt.StochasticRounding(
            eqxopt.SGD(0.1), key=jax.random.split(jax.random.key(0))
        )
    with pytest.raises(TypeError, match="inner must be an eqxopt transform"):
        eqxopt.StochasticRounding(lambda g: g, key=0)
    with pytest.raises(TypeError, match="inner must be an eqxopt transform"):
        eqxopt.KahanSummation("sgd")
    with pytest.raises(TypeError, match="key"):
        eqxopt.StochasticRounding(eqxopt.SGD(0.1))


def test_stochastic_rounding_stays_unbiased_for_parameters_crossing_zero():
    # Parameters smaller than their update, many crossing zero: some cannot land on
    # their rounded value with an update in bf16 (see the docstring); the mean of
    # the applied steps is still the update.
    n = 1 << 16
    p = {"w": (0.002 * jax.random.normal(jax.random.key(0), (n,))).astype(BF16)}
    opt = eqxopt.StochasticRounding(eqxopt.SGD(1.0), key=1)
    new, _ = opt.step({"w": jnp.full((n,), -1e-3, BF16)}, opt.init(p), p)
    u = float(jnp.asarray(1e-3, BF16))
    moved = np.asarray(new["w"], np.float64) - np.asarray(p["w"], np.float64)
    assert abs(moved.mean() - u) < 1e-3 * u


def test_keyword_arguments_reach_the_inner_optimizer():
    p = {"w": jnp.ones((3,), BF16)}
    g = {"w": jnp.ones((3,), BF16)}
    for opt in wrappers(eqxopt.PolyakSGD(max_learning_rate=1.0)):
        new, _ = opt.step(g, opt.init(p), p, value=jnp.float32(0.3))
        assert not np.array_equal(np.asarray(new["w"]), np.asarray(p["w"]))
        with pytest.raises(TypeError, match="'loss'"):
            opt.step(g, opt.init(p), p, loss=1.0)
