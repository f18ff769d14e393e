"""QKClip and MuonClip (Kimi K2's QK-clip, issue 40 item 3): against a transcription
of the report's per-head rule on top of `optax.contrib.muon`, on a small attention
model whose logits pass the threshold; the logits after a clip; the train step
handing the loss function's aux to the optimizer; the errors."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import eqxopt

HEADS, SIZE, SEQ, BATCH = 2, 8, 6, 4


class Model(eqx.Module):
    attention: eqx.nn.MultiheadAttention
    head: eqx.nn.Linear

    def __init__(self, key, bias=False, key_bias=None):
        k1, k2 = jax.random.split(key)
        self.attention = eqx.nn.MultiheadAttention(
            HEADS,
            SIZE,
            use_query_bias=bias,
            use_key_bias=bias if key_bias is None else key_bias,
            key=k1,
        )
        # Large query and key weights: logits of a few tens, above the threshold.
        self.attention = eqx.tree_at(
            lambda a: (a.query_proj.weight, a.key_proj.weight),
            self.attention,
            replace_fn=lambda w: 4.0 * w,
        )
        self.head = eqx.nn.Linear(SIZE, 1, key=k2)

    def __call__(self, x):
        return jax.vmap(self.head)(self.attention(x, x, x)).mean()


def batch(seed=0):
    x = jax.random.normal(jax.random.key(seed), (BATCH, SEQ, SIZE))
    return x, jnp.linspace(-1.0, 1.0, BATCH)


def loss_fn(model, x, y):
    pred = jax.vmap(model)(x)
    logits = jax.vmap(lambda s: eqxopt.max_attention_logits(model.attention, s, s))(x)
    return jnp.mean((pred - y) ** 2), [jnp.max(logits, axis=0)]


def transcribed_clip(model, max_logits, tau):
    """The report's QK-clip, per head h with S the head's largest logit:
    gamma = tau / S where S > tau; W_q^h and W_k^h (and their biases) times
    sqrt(gamma)."""
    s = np.asarray(max_logits, np.float64)
    gamma = np.where(s > tau, tau / s, 1.0)
    rows = np.repeat(np.sqrt(gamma), SIZE // HEADS)

    def scaled(x):
        x = np.asarray(x)
        factor = rows.reshape((-1,) + (1,) * (x.ndim - 1)).astype(x.dtype)
        return jnp.asarray(x * factor)

    for proj in ("query_proj", "key_proj"):
        for field in ("weight", "bias"):
            x = getattr(getattr(model.attention, proj), field)
            if x is not None:
                where = lambda m: getattr(getattr(m.attention, proj), field)  # noqa: B023,E731
                model = eqx.tree_at(where, model, scaled(x))
    return model


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_muon_clip_matches_the_reports_rule_on_optax_muon(bias):
    tau, steps = 5.0, 12
    # No key bias: its gradient is 0 up to rounding (softmax ignores a shift of a
    # query's logits), and AdamW would step on the rounding noise.
    model = Model(jax.random.key(0), bias=bias, key_bias=False)
    params, static = eqx.partition(model, eqx.is_array)
    tx = optax.contrib.muon(0.02, consistent_rms=0.2)
    ref_state = tx.init(params)
    opt = eqxopt.MuonClip(0.02, threshold=tau)
    train_step = eqxopt.make_train_step(loss_fn, opt, has_aux=True)
    # The train step donates its model: run it on a copy.
    ours = jax.tree.map(
        lambda x: jnp.array(x, copy=True) if eqx.is_array(x) else x, model
    )
    state = opt.init(ours)
    clipped_steps = 0
    for i in range(steps):
        x, y = batch(i)
        ours, state, _, (our_logits,) = train_step(ours, state, x, y)
        (_, (logits,)), grads = eqx.filter_value_and_grad(loss_fn, has_aux=True)(
            eqx.combine(params, static), x, y
        )
        np.testing.assert_allclose(our_logits, logits, rtol=2e-5, atol=2e-5)
        clipped_steps += int(np.any(np.asarray(logits) > tau))
        with jax.numpy_dtype_promotion("standard"):  # optax promotes
            g = eqx.filter(grads, eqx.is_array)
            updates, ref_state = tx.update(g, ref_state, params)
        stepped = eqx.combine(optax.apply_updates(params, updates), static)
        params = eqx.filter(transcribed_clip(stepped, logits, tau), eqx.is_array)
        for a, b in zip(
            jax.tree.leaves(eqx.filter(ours, eqx.is_array)), jax.tree.leaves(params)
        ):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"step {i}")
    # The model's logits start far above tau: the clip acted, and brought them down.
    assert clipped_steps >= 2
    x, _ = batch(0)
    first = eqxopt.max_attention_logits(model.attention, x[0], x[0])
    last = eqxopt.max_attention_logits(ours.attention, x[0], x[0])
    assert float(jnp.max(first)) > 2 * tau and float(jnp.max(last)) < 1.5 * tau


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_a_clip_brings_each_heads_logits_to_the_threshold(bias):
    # With an inner step of zero, the clip alone: a head above tau ends exactly at
    # tau on the same input (biases scaled too), a head below is left as it was.
    model = Model(jax.random.key(1), bias=bias)
    x = batch(0)[0][0]
    before = eqxopt.max_attention_logits(model.attention, x, x)
    tau = float(jnp.sort(before)[0] + jnp.sort(before)[1]) / 2  # between the heads
    opt = eqxopt.QKClip(eqxopt.SGD(0.0), threshold=tau)
    grads = jax.tree.map(jnp.zeros_like, eqx.filter(model, eqx.is_array))
    new, _ = opt.step(grads, opt.init(model), model, max_logits=[before])
    after = eqxopt.max_attention_logits(new.attention, x, x)
    high = int(jnp.argmax(before))
    np.testing.assert_allclose(after[high], tau, rtol=1e-5)
    np.testing.assert_array_equal(after[1 - high], before[1 - high])
    np.testing.assert_array_equal(new.head.weight, model.head.weight)


def test_below_the_threshold_it_is_the_inner_optimizer():
    model = Model(jax.random.key(2))
    x, y = batch(0)
    opt = eqxopt.MuonClip(0.02, threshold=1e6)
    plain = eqxopt.Muon(0.02, consistent_rms=0.2)
    ours, state = model, opt.init(model)
    ref, ref_state = model, plain.init(model)
    for _ in range(5):
        (_, logits), grads = eqx.filter_value_and_grad(loss_fn, has_aux=True)(
            ours, x, y
        )
        ours, state = opt.step(grads, state, ours, max_logits=logits)
        ref, ref_state = plain.step(grads, ref_state, ref)
    # The same maths in another program: XLA may contract or fuse the final
    # p + u differently, so equal to float32 rounding (not bit for bit).
    arrays = lambda m: jax.tree.leaves(eqx.filter(m, eqx.is_array))  # noqa: E731
    for a, b in zip(arrays(ours), arrays(ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_attention_layers_named_by_a_function():
    class Block(eqx.Module):
        q: eqx.nn.Linear
        k: eqx.nn.Linear

    class Named(eqx.Module):
        query_proj: eqx.nn.Linear
        key_proj: eqx.nn.Linear
        num_heads: int = eqx.field(static=True)

    keys = jax.random.split(jax.random.key(3), 2)
    block = Block(eqx.nn.Linear(4, 4, key=keys[0]), eqx.nn.Linear(4, 4, key=keys[1]))
    opt = eqxopt.QKClip(
        eqxopt.SGD(0.0),
        threshold=1.0,
        attention=lambda m: [Named(m.q, m.k, 2)],
    )
    grads = jax.tree.map(jnp.zeros_like, block)
    new, _ = opt.step(grads, opt.init(block), block, max_logits=[jnp.array([4.0, 0.5])])
    np.testing.assert_allclose(new.q.weight[:2], block.q.weight[:2] * 0.5, rtol=1e-6)
    np.testing.assert_allclose(new.k.weight[:2], block.k.weight[:2] * 0.5, rtol=1e-6)
    np.testing.assert_array_equal(new.q.weight[2:], block.q.weight[2:])
    # The biases of the named projections scale with their rows.
    np.testing.assert_allclose(new.q.bias[:2], block.q.bias[:2] * 0.5, rtol=1e-6)
    np.testing.assert_array_equal(new.k.bias[2:], block.k.bias[2:])


def test_max_attention_logits_is_the_layers_masked_logits():
    attention = eqx.nn.MultiheadAttention(HEADS, SIZE, key=jax.random.key(4))
    x = jax.random.normal(jax.random.key(5), (SEQ, SIZE))
    mask = jnp.tril(jnp.ones((SEQ, SEQ), bool))
    q = np.asarray(jax.vmap(attention.query_proj)(x)).reshape(SEQ, HEADS, -1)
    k = np.asarray(jax.vmap(attention.key_proj)(x)).reshape(SEQ, HEADS, -1)
    d = SIZE // HEADS
    logits = np.einsum("shd,Shd->hsS", q, k) / np.sqrt(d)
    expected = np.where(np.asarray(mask), logits, -np.inf).max(axis=(1, 2))
    actual = eqxopt.max_attention_logits(attention, x, x, mask)
    np.testing.assert_allclose(actual, expected, rtol=1e-5)


def test_errors_name_the_argument():
    model = Model(jax.random.key(6))
    opt = eqxopt.MuonClip(0.02)
    state = opt.init(model)
    grads = jax.tree.map(jnp.zeros_like, eqx.filter(model, eqx.is_array))
    with pytest.raises(TypeError, match="needs the largest attention logit"):
        opt.step(grads, state, model)
    with pytest.raises(ValueError, match="max_logits has 2 entries for 1 attention"):
        opt.step(grads, state, model, max_logits=[jnp.ones(2), jnp.ones(2)])
    with pytest.raises(ValueError, match=r"max_logits\[0\] must have shape \(2,\)"):
        opt.step(grads, state, model, max_logits=[jnp.ones(3)])
    with pytest.raises(ValueError, match="found no attention layer"):
        lin = eqx.nn.Linear(2, 2, key=jax.random.key(0))
        clip = eqxopt.QKClip(eqxopt.SGD(0.1))
        clip.step(jax.tree.map(jnp.zeros_like, lin), clip.init(lin), lin, max_logits=[])
    with pytest.raises(ValueError, match="threshold"):
        eqxopt.QKClip(eqxopt.SGD(0.1), threshold=0.0)
    with pytest.raises(TypeError, match="has_aux=True"):
        eqxopt.make_train_step(lambda m, x: 0.0, opt)
    with pytest.raises(
        TypeError, match=r"attention must be an eqx\.nn\.MultiheadAttention"
    ):
        eqxopt.max_attention_logits(model.head, jnp.ones((2, 8)), jnp.ones((2, 8)))


def test_attention_layers_must_be_taken_from_the_parameters():
    # A function that builds new projections (copies) names nothing in the tree.
    lin = eqx.nn.Linear(4, 4, key=jax.random.key(1))

    class Named(eqx.Module):
        query_proj: eqx.nn.Linear
        key_proj: eqx.nn.Linear
        num_heads: int = eqx.field(static=True)

    def copies(m):
        fresh = jax.tree.map(lambda x: x + 0.0, m)
        return [Named(fresh, fresh, 2)]

    opt = eqxopt.QKClip(eqxopt.SGD(0.1), attention=copies)
    grads = jax.tree.map(jnp.zeros_like, lin)
    with pytest.raises(
        ValueError, match="attention layer 0 is not part of the parameters"
    ):
        opt.step(grads, opt.init(lin), lin, max_logits=[jnp.ones(2)])
