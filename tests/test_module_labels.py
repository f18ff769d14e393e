"""`module_labels` and `matrix_axes`: labels and Muon's matrix axes from an Equinox
model's module types (issue 40, item 7). On a small transformer built from
`eqx.nn` modules every leaf's label is asserted, and a `Partition` of Muon (hidden
matrices and convolution kernels) and AdamW (the rest) built from them runs the
same steps as the split written by hand, a name table of leaves."""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt
from helpers import assert_trees_close

D, HEADS, VOCAB, SEQ = 8, 2, 11, 5


class Block(eqx.Module):
    norm1: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    norm2: eqx.nn.RMSNorm
    conv: eqx.nn.Conv1d  # mixes neighbouring positions
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, key):
        k = jax.random.split(key, 4)
        self.norm1 = eqx.nn.LayerNorm(D)
        self.attn = eqx.nn.MultiheadAttention(
            HEADS, D, use_query_bias=True, use_output_bias=True, key=k[0]
        )
        self.norm2 = eqx.nn.RMSNorm(D)
        self.conv = eqx.nn.Conv1d(D, D, 3, padding=1, key=k[1])
        self.up = eqx.nn.Linear(D, 2 * D, key=k[2])
        self.down = eqx.nn.Linear(2 * D, D, key=k[3])

    def __call__(self, x):
        h = jax.vmap(self.norm1)(x)
        x = x + self.attn(h, h, h)
        x = x + self.conv(x.T).T
        h = jax.vmap(self.norm2)(x)
        return x + jax.vmap(lambda v: self.down(jax.nn.gelu(self.up(v))))(h)


class Transformer(eqx.Module):
    embed: eqx.nn.Embedding
    positions: jax.Array  # a float array the model holds itself
    blocks: tuple[Block, ...]
    norm: eqx.nn.GroupNorm
    head: eqx.nn.Linear
    activation: Callable  # not an array
    token_ids: jax.Array  # an integer array

    def __init__(self, key):
        k = jax.random.split(key, 5)
        self.embed = eqx.nn.Embedding(VOCAB, D, key=k[0])
        self.positions = 0.1 * jax.random.normal(k[1], (SEQ, D))
        self.blocks = (Block(k[2]), Block(k[3]))
        self.norm = eqx.nn.GroupNorm(2, D)
        self.head = eqx.nn.Linear(D, VOCAB, key=k[4])
        self.activation = jax.nn.gelu
        self.token_ids = jnp.arange(SEQ)

    def __call__(self, tokens):
        x = jax.vmap(self.embed)(tokens) + self.positions
        for block in self.blocks:
            x = block(x)
        return jax.vmap(lambda v: self.head(self.activation(self.norm(v))))(x)


# The hand-written table: every float leaf, its category, and Muon's matrix axes.
LINEAR = eqxopt.MatrixAxes(reduction=-1, output=-2)
CONV = eqxopt.MatrixAxes(reduction=(1, 2), output=0)


def table() -> list[tuple[str, Callable, str, object]]:
    rows = [
        ("embed", lambda m: m.embed.weight, "embedding", True),
        ("positions", lambda m: m.positions, "other", True),
    ]
    for i in range(2):

        def block(m, i=i):
            return m.blocks[i]

        def add(name, where, label, axes, block=block, i=i):
            rows.append((f"{i}.{name}", lambda m: where(block(m)), label, axes))

        for norm in ("norm1", "norm2"):
            add(f"{norm}.weight", lambda b, n=norm: getattr(b, n).weight, "norm", False)
        for norm in ("norm1", "norm2"):
            add(f"{norm}.bias", lambda b, n=norm: getattr(b, n).bias, "norm", False)
        for proj in ("query_proj", "key_proj", "value_proj", "output_proj"):
            add(proj, lambda b, p=proj: getattr(b.attn, p).weight, "hidden", LINEAR)
        add("query_bias", lambda b: b.attn.query_proj.bias, "bias", False)
        add("output_bias", lambda b: b.attn.output_proj.bias, "bias", False)
        add("conv", lambda b: b.conv.weight, "conv", CONV)
        add("conv.bias", lambda b: b.conv.bias, "bias", False)
        for lin in ("up", "down"):
            add(lin, lambda b, n=lin: getattr(b, n).weight, "hidden", LINEAR)
            add(f"{lin}.bias", lambda b, n=lin: getattr(b, n).bias, "bias", False)
    rows += [
        ("norm.weight", lambda m: m.norm.weight, "norm", False),
        ("norm.bias", lambda m: m.norm.bias, "norm", False),
        ("head", lambda m: m.head.weight, "head", LINEAR),
        ("head.bias", lambda m: m.head.bias, "bias", False),
    ]
    return rows


@pytest.fixture(scope="module")
def model():
    return Transformer(jax.random.key(0))


def test_every_leaf_is_labelled_by_the_module_that_holds_it(model):
    labels = eqxopt.module_labels(model)
    rows = table()
    for name, where, label, _ in rows:
        assert where(labels) == label, name
    # every float leaf is in the table; the others get None
    float_leaves = jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array))
    assert len(rows) == len(float_leaves)
    assert labels.activation is None and labels.token_ids is None
    assert labels.blocks[0].attn.key_proj.bias is None  # no bias: no leaf
    assert jax.tree.structure(labels) == jax.tree.structure(
        eqxopt.module_labels(model, head=None)
    )


def test_matrix_axes_are_the_hand_written_ones(model):
    axes = eqxopt.matrix_axes(model)
    for name, where, _, expected in table():
        assert where(axes) == expected, name
    assert axes.activation is None and axes.token_ids is None


def test_matrix_axes_of_stacked_layers():
    # layers stacked by filter_vmap (a scanned transformer): leading axes batch
    keys = jax.random.split(jax.random.key(0), 3)
    linears = eqx.filter_vmap(lambda k: eqx.nn.Linear(4, 6, key=k))(keys)
    convs = eqx.filter_vmap(lambda k: eqx.nn.Conv2d(2, 5, 3, key=k))(keys)
    axes = eqxopt.matrix_axes({"linear": linears, "conv": convs})
    assert axes["linear"].weight == LINEAR and axes["linear"].bias is False
    assert axes["conv"].weight == eqxopt.MatrixAxes(reduction=(2, 3, 4), output=1)
    grads = next(grads_stream({"linear": linears, "conv": convs}, 1))
    opt = eqxopt.Muon(0.02, muon_mask=axes)
    state = opt.init({"linear": linears, "conv": convs})
    assert state.nu["conv"].weight is None and state.nu["conv"].bias is not None
    updates, _ = opt.update(grads, state, {"linear": linears, "conv": convs})

    # each of the three stacked kernels is the (in * 3 * 3, out) = (18, 5) matrix
    # that Muon orthogonalises, as one Muon on that matrix alone makes it
    def as_matrix(kernel):
        return jnp.reshape(jnp.transpose(kernel, (1, 2, 3, 0)), (18, 5))

    for i in range(3):
        alone = eqxopt.Muon(0.02)
        matrix = {"w": as_matrix(convs.weight[i])}
        expected, _ = alone.update(
            {"w": as_matrix(grads["conv"].weight[i])}, alone.init(matrix), matrix
        )
        actual = as_matrix(updates["conv"].weight[i])
        assert_trees_close(actual, expected["w"], rtol=1e-6, atol=1e-8)


def test_labels_default_head_and_types(model):
    muon_split = eqxopt.module_labels(
        model, {"hidden": "muon", "conv": "muon"}, default="adamw"
    )
    for name, where, label, _ in table():
        expected = "muon" if label in ("hidden", "conv") else "adamw"
        assert where(muon_split) == expected, name
    # a category mapped to None is not optimised; the others keep their names
    frozen = eqxopt.module_labels(model, {"norm": None})
    assert frozen.norm.weight is None and frozen.head.weight == "head"
    assert eqxopt.module_labels(model, head=None).head.weight == "hidden"
    # a named head: the embedding (tied weights, say); the last Linear is hidden
    named = eqxopt.module_labels(model, head=lambda m: m.embed)
    assert named.embed.weight == "head" and named.head.weight == "hidden"
    typed = eqxopt.module_labels(
        model,
        {"hidden": "muon"},
        default="adamw",
        types={
            eqx.nn.MultiheadAttention: "attention",
            eqx.nn.Embedding: "muon",
            Transformer: {"positions": "embedding"},
        },
    )
    assert typed.blocks[1].attn.query_proj.weight == "attention"
    assert typed.blocks[1].attn.query_proj.bias == "attention"
    assert typed.embed.weight == "muon" and typed.positions == "embedding"
    assert typed.blocks[0].up.weight == "muon" and typed.head.weight == "adamw"


def grads_stream(model, steps, seed=1):
    rng = np.random.default_rng(seed)
    arrays = eqx.filter(model, eqx.is_inexact_array)
    for _ in range(steps):
        yield jax.tree.map(
            lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), arrays
        )


STEPS = 8


def test_partition_from_labels_is_the_hand_written_split(model):
    lr = eqxopt.WarmupCosine(peak_lr=0.02, min_lr=0.002, warmup_steps=3,
                             total_steps=STEPS)  # fmt: skip

    def muon():
        return eqxopt.Muon(lr, weight_decay=0.1, muon_mask=eqxopt.matrix_axes(model))

    def adamw():
        return eqxopt.AdamW(1e-3, weight_decay=0.01)

    opt = eqxopt.Partition(
        {"muon": muon(), "adamw": adamw()},
        eqxopt.module_labels(
            model, {"hidden": "muon", "conv": "muon"}, default="adamw"
        ),
    )
    rows = table()
    on_muon = [r for r in rows if r[2] in ("hidden", "conv")]
    on_adamw = [r for r in rows if r[2] not in ("hidden", "conv")]
    assert len(on_muon) == 2 * 7 and len(on_adamw) == len(rows) - 14

    def pick(rows, tree):
        return {name: where(tree) for name, where, *_ in rows}

    by_hand = {
        "muon": eqxopt.Muon(
            lr, weight_decay=0.1, muon_mask={n: a for n, _, _, a in on_muon}
        ),
        "adamw": adamw(),
    }
    hand = {"muon": pick(on_muon, model), "adamw": pick(on_adamw, model)}
    hand_states = {k: by_hand[k].init(hand[k]) for k in by_hand}
    params, state = model, opt.init(model)
    for grads in grads_stream(model, STEPS):
        updates, state = opt.update(grads, state, params)
        params = eqxopt.apply_updates(params, updates)
        for k, rows_k in (("muon", on_muon), ("adamw", on_adamw)):
            u, hand_states[k] = by_hand[k].update(
                pick(rows_k, grads), hand_states[k], hand[k]
            )
            hand[k] = eqxopt.apply_updates(hand[k], u)
        assert_trees_close(pick(on_muon, params), hand["muon"], rtol=1e-6, atol=1e-7)
        assert_trees_close(pick(on_adamw, params), hand["adamw"], rtol=1e-6, atol=1e-7)
    # it trained: the Muon leaves moved by about lr per step
    moved = params.blocks[0].up.weight - model.blocks[0].up.weight
    assert float(jnp.abs(moved).max()) > 1e-2
    assert params.activation is model.activation
    assert jnp.array_equal(params.token_ids, model.token_ids)


def test_errors_name_the_argument(model):
    with pytest.raises(ValueError, match="labels has the key 'hiden', which is no "):
        eqxopt.module_labels(model, {"hiden": "muon"})
    with pytest.raises(TypeError, match="labels must be None or a dict"):
        eqxopt.module_labels(model, ["hidden"])  # pyright: ignore
    with pytest.raises(TypeError, match=r"labels\['hidden'\] must be a hashable"):
        eqxopt.module_labels(model, {"hidden": ["muon"]})
    with pytest.raises(TypeError, match="default must be a hashable label"):
        eqxopt.module_labels(model, default={})
    with pytest.raises(TypeError, match="head must be 'last', None or a function"):
        eqxopt.module_labels(model, head="first")
    with pytest.raises(ValueError, match=r"head\(model\) must return an Equinox "):
        eqxopt.module_labels(
            model, head=lambda m: eqx.nn.Linear(2, 2, key=jax.random.key(0))
        )
    with pytest.raises(TypeError, match="types must be None or a dict"):
        eqxopt.module_labels(model, types=[eqx.nn.Linear])  # pyright: ignore
    with pytest.raises(TypeError, match="types has the key 'Linear', which is not"):
        eqxopt.module_labels(model, types={"Linear": "muon"})  # pyright: ignore
    with pytest.raises(TypeError, match=r"types\[Linear\]\['weight'\] must be a "):
        eqxopt.module_labels(model, types={eqx.nn.Linear: {"weight": ["muon"]}})
    with pytest.raises(TypeError, match=r"types\[Linear\] has the key 0"):
        eqxopt.module_labels(model, types={eqx.nn.Linear: {0: "muon"}})
    # a label that Partition has no transform for: Partition names the leaf
    opt = eqxopt.Partition(
        {"muon": eqxopt.Muon(0.02), "adamw": eqxopt.AdamW(1e-3)},
        eqxopt.module_labels(model, {"hidden": "muon"}, default="adamw",
                             types={eqx.nn.Conv: "conv"}),
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"params.blocks\[0\].conv.weight has the "):
        opt.init(model)
