"""`eqxopt.pack` / `Packed`: a tree as a few flat buffers, round trips, gradients,
and optimizers on it giving the numbers they give on the tree."""

import pathlib
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt
from helpers import assert_trees_close, compiles, nested_tree
from sweep_cases import every_case, transforms_in


@pytest.fixture(params=[True, False], ids=["native", "xla"])
def native(request):
    eqxopt.set_native_kernels(request.param)
    yield request.param
    eqxopt.set_native_kernels(True)


def mixed_tree():
    tree = nested_tree()
    tree["half"] = jnp.linspace(-1, 1, 6).astype(jnp.bfloat16).reshape(2, 3)
    tree["count"] = jnp.arange(4)
    tree["scalar"] = jnp.float32(3.5)
    return tree


def test_round_trip_keeps_shapes_dtypes_and_static_leaves(native):
    tree = mixed_tree()
    packed = eqxopt.pack(tree)
    # One buffer per dtype present: float32, bfloat16, int32.
    assert sorted(b.dtype.name for b in packed.buffers) == [
        "bfloat16",
        "float32",
        "int32",
    ]
    assert all(b.ndim == 1 for b in packed.buffers)
    back = packed.unpack()
    assert jax.tree.structure(back) == jax.tree.structure(tree)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(tree)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    model = eqx.nn.MLP(3, 2, 8, 2, key=jax.random.key(0))
    rebuilt = eqx.filter_jit(lambda p: p.unpack())(eqxopt.pack(model))
    x = jnp.ones(3)
    np.testing.assert_array_equal(rebuilt(x), model(x))
    assert rebuilt.activation is model.activation


def test_gradients_come_back_packed(native):
    model = eqx.nn.MLP(4, 3, 16, 2, key=jax.random.key(1))
    x = jnp.linspace(-1, 1, 4)

    def loss(m):
        return jnp.sum(m(x) ** 2)

    packed = eqxopt.pack(model)
    grads = jax.jit(jax.grad(lambda p: loss(p.unpack())))(packed)
    assert isinstance(grads, eqxopt.Packed) and grads.layout == packed.layout
    expected = eqx.filter_grad(loss)(model)
    assert_trees_close(
        eqx.filter(grads.unpack(), eqx.is_array),
        eqx.filter(expected, eqx.is_array),
        rtol=1e-6,
        atol=1e-7,
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: eqxopt.AdamW(1e-2, weight_decay=0.1),
        lambda: eqxopt.SGD(1e-2, momentum=0.9, nesterov=True),
        lambda: eqxopt.Lion(1e-3),
        lambda: eqxopt.RMSProp(1e-2, centered=True),
    ],
    ids=["AdamW", "SGD", "Lion", "RMSProp"],
)
def test_elementwise_optimizers_match_the_tree(make, native):
    params = nested_tree()
    opt = make()

    def grads_at(p):
        return jax.tree.map(lambda x: jnp.sin(3 * x) + 0.1, p)

    tree_p, tree_s = params, opt.init(params)
    packed_p = eqxopt.pack(params)
    packed_s = opt.init(packed_p)
    for _ in range(10):
        tree_p, tree_s = opt.step(grads_at(tree_p), tree_s, tree_p)
        grads = eqxopt.pack(grads_at(packed_p.unpack()))
        packed_p, packed_s = opt.step(grads, packed_s, packed_p)
    assert_trees_close(packed_p.unpack(), tree_p, rtol=1e-6, atol=1e-7)
    first_moment = next(
        getattr(packed_s, f) for f in ("mu", "velocity", "nu") if hasattr(packed_s, f)
    )
    assert isinstance(first_moment, eqxopt.Packed)
    assert jax.tree.structure(first_moment.unpack()) == jax.tree.structure(params)


def test_state_moments_read_and_replace_like_params():
    params = nested_tree()
    packed = eqxopt.pack(params)
    opt = eqxopt.Adam(1e-2)
    state = opt.init(packed)
    state = opt.step(packed, state, packed)[1]
    mu = state.mu.unpack()
    assert_trees_close(mu, jax.tree.map(lambda p: 0.1 * p, params), rtol=1e-6)
    zeroed = eqx.tree_at(
        lambda s: s.mu, state, eqxopt.pack(jax.tree.map(jnp.zeros_like, params))
    )
    assert all(float(jnp.sum(jnp.abs(b))) == 0.0 for b in zeroed.mu.buffers)
    opt.step(packed, zeroed, packed)  # still a valid state


def test_labels_split_buffers_and_serve_as_a_mask():
    params = {"w": jnp.ones((3, 2)), "b": jnp.ones(2), "scale": jnp.ones(2)}
    decay = {"w": True, "b": False, "scale": False}
    packed = eqxopt.pack(params, labels=decay)
    assert len(packed.buffers) == 2
    assert sorted(packed.labels().buffers) == [False, True]
    tree_opt = eqxopt.AdamW(0.1, weight_decay=0.5, mask=decay)
    packed_opt = eqxopt.AdamW(0.1, weight_decay=0.5, mask=packed.labels())
    grads = jax.tree.map(lambda x: 0.3 * x, params)
    expected = tree_opt.step(grads, tree_opt.init(params), params)[0]
    got = packed_opt.step(
        eqxopt.pack(grads, labels=decay), packed_opt.init(packed), packed
    )
    assert_trees_close(got[0].unpack(), expected, rtol=1e-6)
    by_function = eqxopt.pack(
        params, labels=lambda t: jax.tree.map(lambda x: x.ndim > 1, t)
    )
    # Buffers in order of first appearance (dict keys sorted: b, scale, w).
    assert by_function.layout.keys == ((False, "float32"), (True, "float32"))


def test_a_new_pack_with_the_same_layout_reuses_the_compiled_step():
    opt = eqxopt.AdamW(1e-2)
    packed = eqxopt.pack(nested_tree(seed=0))
    state = opt.init(packed)
    opt.step(packed, state, packed)
    other = eqxopt.pack(nested_tree(seed=3))
    other_state = opt.init(other)
    with compiles() as log:
        opt.step(other, other_state, other)
    assert log == []


def test_labels_must_be_hashable():
    with pytest.raises(TypeError, match=r"labels must be hashable, got \[1\]"):
        eqxopt.pack({"a": jnp.ones(2)}, labels={"a": [1]})


@pytest.mark.parametrize(
    "storage",
    [
        None,
        eqxopt.Blockwise8bit(block_size=64, min_size=64),
        eqxopt.ErrorCorrectedBf16(min_size=64),
    ],
    ids=["float32", "8bit", "bf16+8"],
)
def test_moments_unpack_to_the_params_shaped_tree(storage, native):
    # Int and bool leaves (no state there) and, with 8-bit moments, a quantized
    # float32 buffer beside a bf16 one under `min_size` (kept in float32).
    tree = mixed_tree()
    tree["flag"] = jnp.array([True, False, True])
    tree["big"] = jnp.linspace(-1.0, 1.0, 300)

    def loss(t):
        return sum(jnp.sum(jnp.sin(3 * x.astype(jnp.float32))) for x in floats(t))

    def floats(t):
        return [x for x in jax.tree.leaves(t) if jnp.issubdtype(x.dtype, jnp.floating)]

    opt = eqxopt.AdamW(1e-2, mu_dtype=storage, nu_dtype=storage)
    exact = eqxopt.AdamW(1e-2)
    packed, tree_p = eqxopt.pack(tree), tree
    state, tree_s = opt.init(packed), exact.init(tree)
    for _ in range(3):
        grads = eqx.filter_grad(lambda p: loss(p.unpack()))(packed)
        packed, state = opt.step(grads, state, packed)
        tree_p, tree_s = exact.step(eqx.filter_grad(loss)(tree_p), tree_s, tree_p)
    stored = (eqxopt.QuantizedArray, eqxopt.ErrorCorrectedArray)
    quantized = [b for b in state.mu.buffers if isinstance(b, stored)]
    assert len(quantized) == (0 if storage is None else 1)
    for got, want in ((state.mu.unpack(), tree_s.mu), (state.nu.unpack(), tree_s.nu)):
        # None where the tree's state has None (the int and bool leaves).
        assert jax.tree.structure(got) == jax.tree.structure(want)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert a.shape == b.shape
            if storage is None:
                assert a.dtype == b.dtype
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)
            else:
                # Read back in float32, within the 8-bit map's resolution (the
                # bf16+8 storage: far within).
                assert a.dtype == jnp.float32
                scale = float(jnp.max(jnp.abs(b.astype(jnp.float32))))
                np.testing.assert_allclose(a, b.astype(jnp.float32), atol=scale / 20)
    if storage is not None:
        # The quantized buffer (all float32 leaves, in order) cut where they lie.
        (buffer,) = quantized
        unpacked = jax.tree.leaves(state.mu.unpack(), is_leaf=lambda x: x is None)
        members = [
            jnp.ravel(x)
            for x, p in zip(unpacked, jax.tree.leaves(tree))
            if p.dtype == jnp.float32
        ]
        np.testing.assert_array_equal(jnp.concatenate(members), buffer.dequantize())


def test_pack_refuses_prng_keys_naming_the_leaf():
    tree = {"w": jnp.ones(3), "noise": {"key": jax.random.key(0)}}
    with pytest.raises(
        TypeError,
        match=r"^pack: tree\['noise'\]\['key'\] holds PRNG keys \(key<fry>\), which "
        r"cannot go into a flat buffer; keep it out of the packed tree",
    ):
        eqxopt.pack(tree)
    # Its raw data packs.
    raw = {
        "w": jnp.ones(3),
        "noise": {"key": jax.random.key_data(tree["noise"]["key"])},
    }
    assert eqxopt.pack(raw).unpack()["noise"]["key"].dtype == jnp.uint32


def test_labels_of_another_structure_say_where_they_part():
    tree = {"w": jnp.ones(3), "b": jnp.ones(2)}
    with pytest.raises(
        ValueError,
        match=r"^labels does not have the tree structure of tree: tree has \['b'\] "
        r"that labels lacks; labels has \['c'\] that tree lacks",
    ):
        eqxopt.pack(tree, labels={"w": True, "c": False})
    with pytest.raises(ValueError, match=r"^labels does not have the tree structure"):
        eqxopt.pack(tree, labels=lambda t: [True, False])


def test_labels_may_be_a_prefix_as_masks_are():
    params = nested_tree()
    prefix = {"scale": False, "dense": {"w": True, "b": False}, "layers": True}
    full = jax.tree.map(lambda _: True, params)
    full["scale"], full["dense"]["b"] = False, False
    by_prefix = eqxopt.pack(params, labels=prefix)
    assert by_prefix.layout == eqxopt.pack(params, labels=full).layout
    assert by_prefix.labels().unpack() == full
    # The labels serve as the mask the prefix is for AdamW on the tree.
    grads = jax.tree.map(lambda x: 0.3 * x, params)
    tree_opt = eqxopt.AdamW(0.1, weight_decay=0.5, mask=prefix)
    expected = tree_opt.step(grads, tree_opt.init(params), params)[0]
    opt = eqxopt.AdamW(0.1, weight_decay=0.5, mask=by_prefix.labels())
    got = opt.step(eqxopt.pack(grads, labels=prefix), opt.init(by_prefix), by_prefix)
    assert_trees_close(got[0].unpack(), expected, rtol=1e-6)


def layers():
    """Equal-shaped weights (cut by one kernel on XLA's CPU code) beside others."""
    weights = [jnp.linspace(-1.0, 1.0, 9).reshape(3, 3) * (k + 1) for k in range(4)]
    return {"w": weights, "b": jnp.arange(3.0) - 1.0, "s": jnp.float32(0.5)}


def layers_loss(tree):
    x = jnp.linspace(0.5, -0.5, 3)
    for w in tree["w"]:
        x = jnp.tanh(w @ x + tree["b"]) * tree["s"]
    return jnp.sum(x**2) + jnp.sum(jnp.sin(tree["w"][0]))


def static_slices(flat):
    """The tree of `layers()` from its flat buffer by plain static slices."""
    leaves, treedef = jax.tree.flatten(layers())
    ends = np.cumsum([x.size for x in leaves]).tolist()
    pieces = [flat[end - x.size : end].reshape(x.shape) for x, end in zip(leaves, ends)]
    return jax.tree.unflatten(treedef, pieces)


def derivatives(unpack):
    """Every mode of differentiation of `layers_loss` as a function of the flat
    buffer that `unpack` turns into the tree."""
    f = lambda flat: layers_loss(unpack(flat))  # noqa: E731
    flat = jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(layers())])
    t = jnp.cos(jnp.arange(flat.size, dtype=flat.dtype))
    batch = jnp.stack([flat, 0.5 * flat, -flat])
    return {
        "value": f(flat),
        "grad": jax.grad(f)(flat),
        "vjp": jax.vjp(f, flat)[1](jnp.float32(2.0)),
        "jvp": jax.jvp(f, (flat,), (t,)),
        "linearize": jax.linearize(f, flat)[1](t),
        "hvp": jax.jvp(jax.grad(f), (flat,), (t,))[1],
        "hessian": jax.hessian(f)(flat),
        "jacfwd": jax.jacfwd(lambda x: unpack(x)["w"][2])(flat),
        "jacrev": jax.jacrev(lambda x: unpack(x)["w"][1] ** 2)(flat),
        "vmap": jax.vmap(f)(batch),
        "vmap-grad": jax.vmap(jax.grad(f))(batch),
        "grad-of-jit": jax.grad(jax.jit(f))(flat),
    }


def test_every_derivative_through_unpack_matches_static_slices(native):
    layout = eqxopt.pack(layers()).layout

    def unpack(flat):
        return eqxopt.Packed((flat,), layout).unpack()

    got = jax.jit(lambda: derivatives(unpack))()
    expected = jax.jit(lambda: derivatives(static_slices))()
    assert_trees_close(got, expected, rtol=1e-5, atol=1e-6)


def test_export_of_a_packed_loss_round_trips(native):
    packed = eqxopt.pack(layers())
    layout = packed.layout

    def fn(buffers):
        packed = eqxopt.Packed(buffers, layout)
        loss = lambda p: layers_loss(p.unpack())  # noqa: E731
        return loss(packed), jax.grad(loss)(packed).buffers

    exported = jax.export.export(jax.jit(fn))(packed.buffers)
    back = jax.export.deserialize(exported.serialize())
    value, (grad,) = back.call(packed.buffers)
    flat = packed.buffers[0]
    assert_trees_close(value, layers_loss(static_slices(flat)), rtol=1e-6)
    expected = jax.grad(lambda x: layers_loss(static_slices(x)))(flat)
    assert_trees_close(grad, expected, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------------
# Optimizers whose maths reduces over a leaf: refused on a packed model, by name.


def _mlp():
    return eqx.nn.MLP(3, 2, 8, 2, key=jax.random.key(0))


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: eqxopt.AdamMini(1e-2), "AdamMini"),
        (lambda: eqxopt.CAdamW(1e-2), "CAdamW"),
        (lambda: eqxopt.Cautious(eqxopt.SGD(1e-2, momentum=0.9)), "Cautious"),
        (lambda: eqxopt.SM3(1e-2), "SM3"),
        (lambda: eqxopt.NorMuon(1e-2), "NorMuon"),
        (
            lambda: eqxopt.Chain(eqxopt.ClipByGlobalNorm(1.0), eqxopt.LAMB(1e-2)),
            r"LAMB \(in Chain\.links\[1\]\)",
        ),
    ],
)
def test_a_rule_that_reduces_over_a_leaf_is_refused_on_a_packed_model(make, name):
    # Issue 39, item 1: these drifted from the tree's numbers (AdamMini 0.23 away
    # after 5 steps) with no warning.
    opt = make()
    with pytest.raises(ValueError, match=rf"^{name} reduces over each leaf"):
        opt.init(eqxopt.pack(_mlp()))
    opt.init(_mlp())  # the tree itself is fine


class _RowNormalized(eqxopt.extend.AbstractLeafwiseOptimizer):
    """SGD on the gradient over its leaf's RMS: a rule written with `extend`."""

    learning_rate: eqxopt.extend.ScalarOrSchedule = eqxopt.extend.learning_rate_field()
    state_type = eqxopt.SGDState
    moments = (eqxopt.extend.Moment("velocity"),)
    elementwise = False

    def leaf(self, h, t, g, p, v):
        return -h.learning_rate * g / (jnp.sqrt(jnp.mean(g**2)) + 1e-8), v


class _Signed(eqxopt.extend.AbstractLeafwiseOptimizer):
    learning_rate: eqxopt.extend.ScalarOrSchedule = eqxopt.extend.learning_rate_field()
    state_type = eqxopt.SGDState
    moments = (eqxopt.extend.Moment("velocity"),)
    elementwise = True

    def leaf(self, h, t, g, p, v):
        v = 0.9 * v + g
        return -h.learning_rate * jnp.sign(v), v


class _Scaled(eqxopt.extend.AbstractTransform):
    """A transform of its own, written without the per-leaf engine."""

    reads_params = None

    def init(self, params):
        return ()

    def transform(self, grads, state, params):
        return jax.tree.map(lambda g: -0.1 * g, grads), state


class _ScaledDeclared(eqxopt.extend.AbstractTransform):
    reads_params = None
    reduces_over = "nothing"

    def init(self, params):
        return ()

    def transform(self, grads, state, params):
        return jax.tree.map(lambda g: -0.1 * g, grads), state


def test_optimizers_written_with_extend_give_the_trees_numbers_or_are_refused():
    packed = eqxopt.pack(nested_tree())
    for refused in (_RowNormalized(0.1), _Scaled()):
        with pytest.raises(ValueError, match=r"reduces over each leaf"):
            refused.init(packed)
    for opt in (_Signed(0.1), _ScaledDeclared()):

        def grads_at(p):
            return jax.tree.map(lambda x: jnp.sin(3 * x) + 0.1, p)

        tree_p, tree_s = nested_tree(), opt.init(nested_tree())
        packed_p, packed_s = packed, opt.init(packed)
        for _ in range(5):
            tree_p, tree_s = opt.step(grads_at(tree_p), tree_s, tree_p)
            grads = eqxopt.pack(grads_at(packed_p.unpack()))
            packed_p, packed_s = opt.step(grads, packed_s, packed_p)
        assert_trees_close(packed_p.unpack(), tree_p, rtol=1e-6, atol=1e-7)


def test_the_cookbook_lists_the_optimizers_refused_on_a_packed_model():
    page = (pathlib.Path(__file__).parents[1] / "docs" / "cookbook.md").read_text()
    listed = page.split("<!-- packed-refused -->")[1].split("<!-- end packed")[0]
    packed = eqxopt.pack(nested_tree())
    refused = set()
    for name in eqxopt.__all__:
        cls = getattr(eqxopt, name)
        if not (isinstance(cls, type) and issubclass(cls, eqxopt.AbstractTransform)):
            continue
        if name.startswith("Abstract"):
            continue
        kind = "nothing" if getattr(cls, "elementwise", None) is True else None
        if (kind or cls.reduces_over) == "leaf":
            refused.add(name)
    assert set(re.findall(r"`(\w+)`", listed)) == refused
    # And each is refused: the ones the sweep's cases build, by `init`.
    for case in every_case():
        opt = case.make()
        names = {type(t).__name__ for t in transforms_in(opt)}
        if names & refused:
            with pytest.raises(ValueError, match=r"reduces over each leaf"):
                opt.init(packed)
