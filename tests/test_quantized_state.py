"""Block-wise quantized optimizer state (`Blockwise8bit`, `Blockwise4bit`,
`BlockwiseFp8`): the maps and codes against torchao 0.18's, AdamW trajectories
against `torchao.optim.AdamW8bit`/`AdamW4bit`/`AdamWFp8`, round-trip bounds, the
state's structure and size, and the errors."""

import contextlib
import dataclasses
import functools
import io
import re
import unittest.mock
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import eqxopt
from eqxopt._core import _storage
from helpers import assert_moved, compiles, grad_stream

MAPS = ["dynamic8_signed", "dynamic8_unsigned", "dynamic4_signed", "linear4_unsigned"]


def _torchao():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own deprecation notes on import
        from torchao.optim import (
            adam,
            quant_utils,
            subclass_4bit,
            subclass_8bit,
            subclass_fp8,
        )
    return adam, quant_utils, subclass_8bit, subclass_4bit, subclass_fp8


def _torch_table(name):
    _, _, s8, s4, _ = _torchao()
    tables = {
        "dynamic8_signed": s8.get_qmap_signed,
        "dynamic8_unsigned": s8.get_qmap_unsigned,
        "dynamic4_signed": s4.get_qmap_signed,
        "linear4_unsigned": s4.get_qmap_unsigned,
    }
    return np.asarray(tables[name](), np.float32)


@pytest.mark.parametrize("name", MAPS)
def test_maps_are_torchaos(name):
    # torchao rounds torch.linspace in float32 (one ulp from the float64 grid).
    np.testing.assert_allclose(_storage.code_map(name), _torch_table(name), rtol=2.4e-7)


@pytest.mark.parametrize("name, block", [(m, 256 if "8" in m else 128) for m in MAPS])
def test_codes_and_scales_match_torchaos_bit_for_bit(name, block):
    import torch

    _, q, _, _, _ = _torchao()
    rng = np.random.default_rng(0)
    # Blocks of very different magnitudes, as real moments have.
    x = rng.standard_normal((32, block)) * np.exp(rng.uniform(-12, 2, (32, 1)))
    x = (np.abs(x) if name.endswith("unsigned") else x).astype(np.float32)
    ours = _storage.quantize(jnp.asarray(x), name, block)
    # torchao's search, on our table (its own differs by an ulp; see above).
    qmap = torch.tensor(_storage.code_map(name))
    scaled, scale = q.scale_tensor(torch.tensor(x).view(-1), block)
    search = q.quantize_8bit_with_qmap if "8" in name else q.quantize_4bit_with_qmap
    codes = search(scaled, qmap)
    if "4" in name:
        codes = (codes[::2] << 4) | codes[1::2]
    np.testing.assert_array_equal(np.asarray(ours.codes).reshape(-1), codes.numpy())
    np.testing.assert_array_equal(np.asarray(ours.absmax), scale.numpy())
    unpacked = codes if "8" in name else torch.stack([codes >> 4, codes & 15], -1)
    theirs = q.dequant_with_qmap(unpacked, qmap, scale).reshape(-1).numpy()
    np.testing.assert_array_equal(np.asarray(ours.dequantize()).reshape(-1), theirs)


def test_fp8_codes_match_torchaos():
    import torch

    *_, fp8 = _torchao()
    x = np.random.default_rng(1).standard_normal((16, 256)).astype(np.float32)
    codes, scale = fp8.quantize_fp8(torch.tensor(x), 256)
    ours = _storage.quantize(jnp.asarray(x), "fp8_e4m3fn", 256)
    # XLA's CPU float32 division is not always correctly rounded: the scale
    # (absmax / 448) can be an ulp off torch's, and a code then one fp8 step off.
    np.testing.assert_allclose(np.asarray(ours.absmax), scale.numpy(), rtol=2.4e-7)
    same = np.asarray(ours.codes).view(np.uint8) == codes.view(torch.uint8).numpy()
    assert same.mean() > 0.999


@functools.partial(jax.jit, static_argnums=(1, 2))
def _round_trip(x, name, block):
    return _storage.quantize(x, name, block).dequantize()


@settings(max_examples=20, deadline=None)
@given(
    name=st.sampled_from([*MAPS, "fp8_e4m3fn"]),
    size=st.sampled_from([1, 5, 700]),
    block=st.sampled_from([2, 64]),
    log_scale=st.floats(-20, 20),
    seed=st.integers(0, 2**16),
)
def test_round_trip_error_is_within_the_maps_resolution(
    name, size, block, log_scale, seed
):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(size) * np.exp(rng.uniform(-8, 0, size)) * 2.0**log_scale
    x = (np.abs(x) if name.endswith("unsigned") else x).astype(np.float32)
    back = np.asarray(_round_trip(jnp.asarray(x), name, block), np.float64)
    padded = np.zeros(-(-size // block) * block)
    padded[:size] = x
    absmax = np.abs(padded.reshape(-1, block)).max(axis=1)
    err = np.abs(back - x).reshape(-1)
    bound = np.repeat(absmax, block)[:size]
    if name == "fp8_e4m3fn":
        # Round to nearest e4m3 (3 mantissa bits) of x / (absmax / 448): relative
        # 2**-4, and absolute half the smallest subnormal (2**-10) below 2**-6.
        bound = np.maximum(np.abs(x) * 2.0**-4, bound / 448 * 2.0**-10)
    else:
        bound = bound * _storage.map_resolution(name)
    # Plus float32 rounding of the scaled value and of the product.
    assert np.all(err <= bound * (1 + 1e-5) + np.abs(x) * 1e-6 + 1e-37)


def _adamw_torchao(kind, params, grads, lr, compiled=False):
    """torchao's AdamW8bit/AdamW4bit/AdamWFp8 on the leaves of `params`, eager
    (torch.compile of the step is patched out; `compiled=True` keeps it)."""
    import torch

    optim, *_ = _torchao()
    cls = {"8bit": optim.AdamW8bit, "4bit": optim.AdamW4bit, "fp8": optim.AdamWFp8}
    leaves = jax.tree.leaves(params)
    tensors = [torch.nn.Parameter(torch.tensor(np.asarray(x))) for x in leaves]
    opt = cls[kind](tensors, lr=lr, weight_decay=0.01)
    eager = unittest.mock.patch.object(torch, "compile", lambda f, **_: f)
    history = []
    with contextlib.nullcontext() if compiled else eager, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for g in grads:
            for t, gl in zip(tensors, jax.tree.leaves(g)):
                t.grad = torch.tensor(np.asarray(gl))
            opt.step()
            history.append([t.detach().numpy().copy() for t in tensors])
    return history


STORAGE = {
    "8bit": eqxopt.Blockwise8bit(),
    "4bit": eqxopt.Blockwise4bit(),
    "fp8": eqxopt.BlockwiseFp8(),
    "companded": eqxopt.Companded8bit(),
}


# Leaves torchao quantizes (>= 4096 elements, whole blocks) and one it keeps in
# float32 (so do we: under min_size).
def _reference_problem(steps):
    rng = np.random.default_rng(3)
    params = {
        "w": jnp.asarray(rng.standard_normal((32, 256)), jnp.float32),
        "v": jnp.asarray(rng.standard_normal(4096), jnp.float32),
        "b": jnp.asarray(rng.standard_normal(40), jnp.float32),
    }
    # Gradients of mixed magnitudes per block and a steady part, so the moments
    # use much of each map.
    grads = []
    for _ in range(steps):
        grads.append(
            jax.tree.map(
                lambda p: jnp.asarray(
                    (0.3 + rng.standard_normal(p.shape))
                    * np.exp(rng.uniform(-4, 0, p.shape)),
                    jnp.float32,
                ),
                params,
            )
        )
    return params, grads


def _run_ours(opt, params, grads):
    state = opt.init(params)
    step = jax.jit(opt.step)
    history = []
    for g in grads:
        params, state = step(g, state, params)
        history.append([np.asarray(x) for x in jax.tree.leaves(params)])
    return history, state


# The quantized moments of both runs are equal as long as every code is: then the
# parameters agree to float32 rounding (measured: 3e-6 after 30 steps for 8-bit,
# 4-bit and fp8, while they move ~0.2). A code can land the other side of a rounding
# boundary (torchao's table is an ulp off ours, torch's lerp rounds otherwise than
# our b*m + (1-b)*g): that element's moment is then one step of the map away, its
# update differs by a few percent of lr for a while, and the runs stay close
# (Adam's update is bounded by lr). Measured: 3 of 12328 elements, by at most 1e-3
# (8-bit, lr=1e-2). So: all within 0.3 lr, and all but 0.2% within 1e-5.
CLOSE, FLIP, FLIPPED = 1e-5, 3e-3, 0.002


def _assert_close_up_to_flips(ours, theirs):
    for step, (a, e) in enumerate(zip(ours, theirs)):
        diff = np.concatenate([np.abs(x - y).ravel() for x, y in zip(a, e)])
        assert diff.max() <= FLIP, f"step {step}: {diff.max()}"
        assert np.mean(diff > CLOSE) <= FLIPPED, f"step {step}"


@pytest.mark.parametrize("kind", ["8bit", "4bit", "fp8"])
def test_adamw_trajectory_matches_torchao(kind):
    params, grads = _reference_problem(30)
    storage = STORAGE[kind]
    opt = eqxopt.AdamW(1e-2, weight_decay=0.01, mu_dtype=storage, nu_dtype=storage)
    ours, state = _run_ours(opt, params, grads)
    theirs = _adamw_torchao(kind, params, grads, 1e-2)
    assert_moved(jax.tree.leaves(params), theirs[-1], CLOSE, CLOSE, factor=1000)
    _assert_close_up_to_flips(ours, theirs)
    # The big leaves were stored quantized, the small one in float32.
    assert isinstance(state.mu["w"], eqxopt.QuantizedArray)
    assert isinstance(state.nu["v"], eqxopt.QuantizedArray)
    assert state.mu["b"].dtype == jnp.float32


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["8bit", "4bit"])
def test_adamw_trajectory_matches_compiled_torchao(kind):
    params, grads = _reference_problem(30)
    storage = STORAGE[kind]
    opt = eqxopt.AdamW(1e-2, weight_decay=0.01, mu_dtype=storage, nu_dtype=storage)
    ours, _ = _run_ours(opt, params, grads)
    theirs = _adamw_torchao(kind, params, grads, 1e-2, compiled=True)
    assert_moved(jax.tree.leaves(params), theirs[-1], CLOSE, CLOSE, factor=1000)
    _assert_close_up_to_flips(ours, theirs)


def test_adamw_8bit_stays_close_to_float32_adamw():
    params, grads = _reference_problem(30)
    q = eqxopt.Blockwise8bit()
    exact, _ = _run_ours(eqxopt.AdamW(1e-2), params, grads)
    low, _ = _run_ours(eqxopt.AdamW(1e-2, mu_dtype=q, nu_dtype=q), params, grads)
    moved = np.abs(exact[-1][2] - np.asarray(params["w"])).mean()
    gap = np.abs(low[-1][2] - exact[-1][2]).mean()
    assert gap < 0.02 * moved, (gap, moved)


def test_maps_follow_the_declared_signs():
    params = {"w": jnp.ones((64, 64)), "small": jnp.ones(3)}
    q8, q4 = eqxopt.Blockwise8bit(), eqxopt.Blockwise4bit()
    adam = eqxopt.Adam(1e-3, mu_dtype=q8, nu_dtype=q4).init(params)
    assert adam.mu["w"].map_name == "dynamic8_signed"
    assert adam.nu["w"].map_name == "linear4_unsigned"
    # Lion declares nothing non-negative: its momentum is signed, also in 4 bits.
    lion = eqxopt.Lion(1e-3, mu_dtype=q4).init(params)
    assert lion.mu["w"].map_name == "dynamic4_signed"
    ams = eqxopt.AMSGrad(1e-3, nu_dtype=q8).init(params)
    assert ams.nu_max["w"].map_name == "dynamic8_unsigned"
    nadam = eqxopt.NAdam(1e-3, nu_dtype=q8).init(params)
    assert nadam.nu["w"].map_name == "dynamic8_unsigned"
    assert adam.mu["small"].dtype == jnp.float32


@pytest.mark.parametrize("kind", ["8bit", "4bit"])
def test_adamw_as_a_chain_of_blocks_with_quantized_moments_is_adamw(kind):
    """`Chain(ScaleByAdam, AddDecayedWeights, ScaleByLearningRate)` is AdamW with
    quantized moments too: the block stores `nu` in the unsigned map as AdamW
    does (in the signed one, 4-bit moments moved parameters 300 times further)."""
    params, grads = _reference_problem(30)
    q = STORAGE[kind]
    fused = eqxopt.AdamW(1e-2, weight_decay=0.01, mu_dtype=q, nu_dtype=q)
    chain = eqxopt.Chain(
        eqxopt.ScaleByAdam(mu_dtype=q, nu_dtype=q),
        eqxopt.AddDecayedWeights(0.01),
        eqxopt.ScaleByLearningRate(1e-2),
    )
    ours, chain_state = _run_ours(chain, params, grads)
    theirs, fused_state = _run_ours(fused, params, grads)
    assert_moved(jax.tree.leaves(params), theirs[-1], CLOSE, CLOSE, factor=1000)
    for step, (a, e) in enumerate(zip(ours, theirs)):
        for x, y in zip(a, e):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7, err_msg=f"{step}")
    block = chain_state["ScaleByAdam"]
    for name in ("mu", "nu"):
        for x, y in zip(
            jax.tree.leaves(getattr(block, name)),
            jax.tree.leaves(getattr(fused_state, name)),
        ):
            np.testing.assert_array_equal(x, y)
    assert block.nu["w"].map_name == fused_state.nu["w"].map_name
    assert block.nu["w"].map_name.endswith("unsigned")


def _with_storage(cls, *fields, **kw):
    return lambda dtype: cls(**kw, **{f: dtype for f in fields})


# Every transform with a moment storage option (`*_dtype`), built with that storage
# in every option. GaLore's and APOLLO's moments live in the projected space, not
# shaped like params (tests/test_contrib.py covers GaLore's storage); `z_dtype`
# (schedule-free iterates) and Adafactor's `dtype_momentum` take float dtypes only.
_ADAM_LIKE = [
    "ADOPT", "AMSGrad", "AdEMAMix", "AdaBelief", "Adam", "AdamW", "Adamax",
    "AdamaxW", "AdaMuon", "CAdamW", "Dion", "Muon", "NAdam", "NAdamW", "OptimisticAdam",
    "PolarGrad",
    "RAdam", "StableAdamW", "Yogi",
]  # fmt: skip
_BOTH = ("mu_dtype", "nu_dtype")
MOMENT_STORAGE = (
    {
        name: _with_storage(getattr(eqxopt, name), *_BOTH, learning_rate=0.05)
        for name in _ADAM_LIKE
    }
    | {
        "Lion": _with_storage(eqxopt.Lion, "mu_dtype", learning_rate=0.01),
        "Signum": _with_storage(eqxopt.Signum, "mu_dtype", learning_rate=0.01),
        "Sophia": _with_storage(eqxopt.Sophia, "mu_dtype", learning_rate=0.05),
        "SGD": _with_storage(
            eqxopt.SGD, "velocity_dtype", learning_rate=0.05, momentum=0.9
        ),
        "Trace": _with_storage(eqxopt.Trace, "trace_dtype", decay=0.9),
        "ScaleByAdam": _with_storage(eqxopt.ScaleByAdam, *_BOTH),
        "ScaleByRms": _with_storage(eqxopt.ScaleByRms, "nu_dtype"),
        "ScheduleFreeAdamW": _with_storage(eqxopt.ScheduleFreeAdamW, "nu_dtype"),
        "AdamMini": _with_storage(eqxopt.AdamMini, "mu_dtype", learning_rate=0.05),
        "EMA": _with_storage(eqxopt.EMA, "ema_dtype", decay=0.9),
        "ScaleByLion": _with_storage(eqxopt.ScaleByLion, "mu_dtype"),
        "ScaleByNovograd": _with_storage(eqxopt.ScaleByNovograd, "mu_dtype"),
        "HyperBallAdamW": _with_storage(
            eqxopt.HyperBallAdamW, "nu_dtype", learning_rate=0.05
        ),
        "Scion": _with_storage(eqxopt.Scion, "mu_dtype", learning_rate=0.05),
    }
    | {
        name: _with_storage(getattr(eqxopt, name), *_BOTH, learning_rate=0.05)
        for name in [
            "ACProp",
            "LaProp",
            "MARS",
            "NorMuon",
            "OptimisticAdamV1",
            "SimplifiedAdEMAMix",
        ]
    }
    | {
        name: _with_storage(getattr(eqxopt, name), *_BOTH)
        for name in [
            "ScaleByAdamax",
            "ScaleByAmsgrad",
            "ScaleByBelief",
            "ScaleByRadam",
            "ScaleByStddev",
            "ScaleByYogi",
        ]
    }
)
# MeasureWithEMA's average is of a measurement (any shape), not a moment;
# `param_dtype` is the dtype of DoG's distance estimate.
NOT_MOMENT_STORAGE = {
    "GaLore", "APOLLO", "APOLLOMini", "MeasureWithEMA", "z_dtype",
    "dtype_momentum", "param_dtype",
}  # fmt: skip


def test_every_transform_with_a_moment_storage_option_is_listed():
    missing = []
    for name in dir(eqxopt):
        cls = getattr(eqxopt, name)
        if not (
            isinstance(cls, type)
            and issubclass(cls, eqxopt.AbstractTransform)
            and not name.startswith("Abstract")
        ):
            continue
        options = {
            f.name
            for f in dataclasses.fields(cls)
            if f.name.endswith("_dtype") and f.name not in NOT_MOMENT_STORAGE
        }
        if options and name not in MOMENT_STORAGE and name not in NOT_MOMENT_STORAGE:
            missing.append(name)
    assert not missing, f"add to MOMENT_STORAGE: {missing}"


@pytest.mark.parametrize("name", sorted(MOMENT_STORAGE))
def test_a_moment_is_stored_unsigned_exactly_when_it_is_never_negative(name):
    """The sign each transform declares for its moments (`Moment(nonnegative=)`),
    read by every storage choice, against what the moments do: run in float32 on
    gradients of both signs, a moment that never goes negative must be stored in
    the unsigned map, and one that does in the signed map. A building block and
    the fused optimizer cannot then store the same moment differently."""
    params = {"w": jnp.ones((4, 6)), "v": jnp.linspace(-1.0, 1.0, 8)}

    def loss(p):
        return sum(jnp.sum(jnp.sin(3.0 * x)) for x in jax.tree.leaves(p))

    extra = {"obj_fn": loss} if name == "Sophia" else {}
    opt = MOMENT_STORAGE[name](jnp.float32)
    state = opt.init(params)
    lowest = jax.tree.map(lambda x: np.inf, state)
    for g in grad_stream(params, 6, seed=5):
        params, state = opt.step(g, state, params, **extra)
        lowest = jax.tree.map(
            lambda m, x: min(m, float(jnp.min(x))) if jnp.size(x) else m,
            lowest,
            state,
        )
    lowest_at = {
        jax.tree_util.keystr(path): m
        for path, m in jax.tree_util.tree_leaves_with_path(lowest)
    }
    for storage in (eqxopt.Blockwise8bit, eqxopt.Companded8bit):
        quantized = MOMENT_STORAGE[name](storage(block_size=4, min_size=2))
        checked = 0
        for path, leaf in jax.tree_util.tree_leaves_with_path(
            quantized.init(params),
            is_leaf=lambda x: isinstance(x, eqxopt.QuantizedArray),
        ):
            if not isinstance(leaf, eqxopt.QuantizedArray):
                continue
            where = jax.tree_util.keystr(path)
            never_negative = lowest_at[where] >= 0
            assert leaf.map_name.endswith("unsigned") == never_negative, (
                f"{name}: state{where} is {leaf.map_name} but its lowest value "
                f"over the float32 run was {lowest_at[where]}"
            )
            checked += 1
        assert checked


def test_state_is_params_shaped_serialises_and_donates(tmp_path):
    q = eqxopt.Blockwise8bit(block_size=64, min_size=100)
    opt = eqxopt.AdamW(1e-2, mu_dtype=q, nu_dtype=eqxopt.Blockwise4bit(64, 100))
    params = {
        "w": jnp.ones((20, 30), jnp.bfloat16),  # 600: quantized, 10 blocks (padded)
        "b": jnp.ones(7, jnp.bfloat16),
        "n": jnp.arange(3),
        "frozen": jnp.ones((10, 10)),
    }
    grads = {
        "w": jnp.full((20, 30), 0.5, jnp.bfloat16),
        "b": jnp.full(7, 0.5, jnp.bfloat16),
        "n": None,
        "frozen": None,
    }
    state = opt.init(params)
    frozen = np.asarray(state.mu["frozen"].codes)  # before donation deletes it
    top = jax.tree.structure(params)
    assert top.flatten_up_to(state.mu)[2] is None  # the int leaf
    w = state.mu["w"]
    assert w.codes.shape == (10, 64) and w.codes.dtype == jnp.uint8
    assert state.nu["w"].codes.shape == (10, 32)  # two 4-bit codes per byte
    assert w.absmax.shape == (10,) and w.shape == (20, 30)
    assert state.mu["b"].dtype == jnp.float32
    # Donated, jitted steps: no recompiles after the first, bf16 kept.
    p, s = opt.step(grads, state, params, donate=True)
    with compiles() as log:
        for _ in range(3):
            p, s = opt.step(grads, s, p, donate=True)
    assert log == []
    assert p["w"].dtype == jnp.bfloat16
    assert float(p["w"][0, 0]) < 1.0
    # A None gradient keeps that leaf's state as it was.
    np.testing.assert_array_equal(s.mu["frozen"].codes, frozen)
    # Serialises and back, equal.
    path = tmp_path / "state.eqx"
    eqx.tree_serialise_leaves(path, s)
    back = eqx.tree_deserialise_leaves(path, opt.init(params))
    assert jax.tree.structure(back) == jax.tree.structure(s)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(s)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, s)
    assert buffer.tell() > 0


def _state_bytes(opt, params):
    # XLA's memory analysis of the compiled `init`: the bytes of its outputs.
    compiled = jax.jit(lambda p: opt.init(p)).lower(params).compile()
    analysis = compiled.memory_analysis()
    return analysis.output_size_in_bytes


def test_state_bytes_per_parameter():
    n = 1 << 20
    params = {"w": jax.ShapeDtypeStruct((1024, 1024), jnp.float32)}
    per_param = {}
    for name, storage in [
        ("f32", None),
        ("8bit", eqxopt.Blockwise8bit()),
        ("4bit", eqxopt.Blockwise4bit()),
        ("companded", eqxopt.Companded8bit()),
    ]:
        opt = eqxopt.AdamW(1e-3, mu_dtype=storage, nu_dtype=storage)
        per_param[name] = _state_bytes(opt, params) / n
    # (Plus a few bytes in all: the step counter.)
    assert per_param["f32"] == pytest.approx(8.0, abs=1e-4)
    # 1 byte per moment plus 4 / 256 of a float32 absmax each: 2.03125.
    assert per_param["8bit"] == pytest.approx(2 + 8 / 256, abs=1e-4)
    assert per_param["8bit"] <= 2.1
    # Half a byte per moment plus 4 / 128 each: 1.0625.
    assert per_param["4bit"] == pytest.approx(1 + 8 / 128, abs=1e-4)
    assert per_param["4bit"] <= 1.1
    # 1 byte per moment plus 2 / 32 of a float16 scale each: 2.125.
    assert per_param["companded"] == pytest.approx(2 + 4 / 32, abs=1e-4)


def test_leaves_outside_the_engines_store_use_their_own_storage():
    # Complex leaves stay in full precision; a 0-d leaf too (under min_size).
    q = eqxopt.Blockwise8bit(block_size=2, min_size=1)
    params = {"c": jnp.ones(4, jnp.complex64), "s": jnp.ones(()), "r": jnp.ones(4)}
    state = eqxopt.Adam(1e-3, mu_dtype=q, nu_dtype=q).init(params)
    assert state.mu["c"].dtype == jnp.complex64
    assert isinstance(state.mu["s"], eqxopt.QuantizedArray)
    assert state.mu["s"].codes.shape == (1, 2)


NARROW = ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float4_e2m1fn"]


@pytest.mark.parametrize("dtype", [d for d in NARROW if hasattr(jnp, d)])
def test_narrow_float_moment_dtypes_are_refused(dtype):
    with pytest.raises(
        ValueError, match=rf"nu_dtype={dtype} cannot hold .*Blockwise8bit"
    ):
        eqxopt.AdamW(1e-3, nu_dtype=getattr(jnp, dtype))
    with pytest.raises(ValueError, match=rf"mu_dtype={dtype} cannot hold"):
        eqxopt.Lion(1e-3, mu_dtype=getattr(jnp, dtype))
    with pytest.raises(ValueError, match=rf"dtype_momentum={dtype} cannot hold"):
        eqxopt.Adafactor(1e-3, dtype_momentum=getattr(jnp, dtype))


def test_integer_moment_dtypes_are_refused():
    with pytest.raises(TypeError, match="nu_dtype must be a float dtype or None"):
        eqxopt.Adam(1e-3, nu_dtype=jnp.int8)
    with pytest.raises(TypeError, match="mu_dtype must be a float dtype or None"):
        eqxopt.Adam(1e-3, mu_dtype="uint8")


def test_storage_where_state_is_not_a_moment_is_refused():
    q = eqxopt.Blockwise8bit()
    with pytest.raises(TypeError, match="z_dtype takes a float dtype or None, not a"):
        eqxopt.ScheduleFreeAdamW(1e-3, z_dtype=q)
    with pytest.raises(TypeError, match="z_dtype takes a float dtype or None, not a"):
        eqxopt.ScheduleFreeSGD(1e-3, z_dtype=q)
    with pytest.raises(TypeError, match="dtype_momentum must be a float dtype or None"):
        eqxopt.Adafactor(1e-3, dtype_momentum=q)


# How to build each public module that has a dtype option, given that option.
def _with_dtype_option(cls, **option):
    if cls in (eqxopt.ScaleByAdam, eqxopt.ScaleByRms):
        return cls(**option)
    if cls is eqxopt.Trace:
        return cls(0.9, **option)
    if cls is eqxopt.ScheduleFree:
        return cls(eqxopt.SGD(1e-2), **option)
    if cls is eqxopt.MeasureWithEMA:
        return cls(eqxopt.global_norm, 0.9, **option)
    if cls is eqxopt.SGD:  # plain SGD keeps no velocity to store
        return cls(1e-2, momentum=0.9, **option)
    return cls(1e-2, **option)


DTYPE_OPTIONS = [
    (name, field.name)
    for name in eqxopt.__all__
    if isinstance(getattr(eqxopt, name), type)
    and issubclass(getattr(eqxopt, name), eqx.Module)
    and dataclasses.is_dataclass(getattr(eqxopt, name))
    for field in dataclasses.fields(getattr(eqxopt, name))
    if field.name.endswith("_dtype") or field.name.startswith("dtype_")
]


@pytest.mark.parametrize(
    "name, option", DTYPE_OPTIONS, ids=[f"{n}-{o}" for n, o in DTYPE_OPTIONS]
)
def test_every_dtype_option_stores_a_storage_or_refuses_it_at_construction(
    name, option
):
    # Either the option quantizes its state (init and a step run, and the state
    # holds `QuantizedArray`s), or building the module raises, naming the option:
    # never a failure inside `init` or a step.
    q = eqxopt.Blockwise8bit(block_size=16, min_size=16)
    cls = getattr(eqxopt, name)
    # A matrix and a vector, both large enough to be quantized (Muon keeps its
    # `nu` for the vector only).
    params = {"w": jnp.ones((8, 8)), "b": jnp.ones(32)}
    grads = {"w": jnp.full((8, 8), 0.1), "b": jnp.full(32, 0.1)}
    # Sophia estimates the Hessian's diagonal from the loss.
    extra = {"obj_fn": lambda p: sum(jnp.sum(x**2) for x in jax.tree.leaves(p))}
    try:
        opt = _with_dtype_option(cls, **{option: q})
    except TypeError as error:
        assert re.match(
            rf"{option} (takes a float dtype or None, not a quantized storage "
            rf"\(Blockwise8bit\)|must be a float dtype or None)",
            str(error),
        ), str(error)
        assert name not in STORES_A_STORAGE, (name, str(error))
        return
    assert name not in REFUSES_A_STORAGE, name
    state = opt.init(params)
    updates, state = opt.update(
        grads, state, params, **(extra if cls is eqxopt.Sophia else {})
    )
    assert any(
        isinstance(x, eqxopt.QuantizedArray)
        for x in jax.tree.leaves(
            state, is_leaf=lambda x: isinstance(x, eqxopt.QuantizedArray)
        )
    ), name
    assert all(bool(jnp.all(jnp.isfinite(u))) for u in jax.tree.leaves(updates))


# Known answers of the sweep above: state kept in a form of its own refuses a
# storage at construction (GaLore's projected moments, ScheduleFree's iterate);
# the Adam family and the building blocks store one.
REFUSES_A_STORAGE = {"GaLore", "APOLLO", "ScheduleFree", "ScheduleFreeSGD", "Adafactor"}
STORES_A_STORAGE = {"AdamW", "Lion", "SGD", "ScaleByAdam", "ScaleByRms", "Trace"}


def test_storage_refused_at_construction_names_the_option():
    q = eqxopt.Blockwise8bit()
    message = r"takes a float dtype or None, not a quantized storage \(Blockwise8bit\)"
    with pytest.raises(TypeError, match=rf"^mu_dtype {message}"):
        eqxopt.GaLore(1e-2, mu_dtype=q)
    with pytest.raises(TypeError, match=rf"^z_dtype {message}"):
        eqxopt.ScheduleFree(eqxopt.SGD(1e-2), z_dtype=q)


def test_bad_storage_options_are_refused():
    with pytest.raises(ValueError, match="Blockwise4bit: block_size must be even"):
        eqxopt.Blockwise4bit(block_size=5)
    with pytest.raises(ValueError, match="Blockwise8bit: block_size must be >= 1"):
        eqxopt.Blockwise8bit(block_size=0)
    with pytest.raises(ValueError, match="BlockwiseFp8: min_size must be >= 0"):
        eqxopt.BlockwiseFp8(min_size=-1)
    with pytest.raises(TypeError, match="Blockwise8bit: block_size must be an int"):
        eqxopt.Blockwise8bit(block_size=2.5)  # pyright: ignore
    with pytest.raises(ValueError, match="Companded8bit: block_size must be >= 1"):
        eqxopt.Companded8bit(block_size=0)


def test_other_optimizers_with_moment_dtypes_take_storage():
    # Through the engine without code of their own: NAdam, Muon, ScheduleFreeAdamW.
    q = eqxopt.Blockwise8bit(block_size=16, min_size=16)
    params = {"w": jnp.ones((8, 8)), "b": jnp.ones(4)}
    grads = {"w": jnp.full((8, 8), 0.1), "b": jnp.full(4, 0.1)}
    for opt in [
        eqxopt.NAdam(1e-2, mu_dtype=q, nu_dtype=q),
        eqxopt.Muon(1e-2, mu_dtype=q, nu_dtype=q),
        eqxopt.ScheduleFreeAdamW(1e-2, nu_dtype=q),
    ]:
        state = opt.init(params)
        p, state = opt.step(grads, state, params)
        assert float(p["w"][0, 0]) < 1.0, type(opt).__name__


def test_wrappers_carry_quantized_inner_state():
    q = eqxopt.Blockwise8bit(block_size=16, min_size=16)
    params = {"w": jnp.ones((8, 8)), "b": jnp.ones(4)}
    grads = {"w": jnp.full((8, 8), 0.1), "b": jnp.full(4, 0.1)}
    for opt in [
        eqxopt.MultiSteps(eqxopt.AdamW(1e-2, mu_dtype=q, nu_dtype=q), 2),
        eqxopt.Masked(eqxopt.Lion(1e-2, mu_dtype=q), {"w": True, "b": False}),
    ]:
        p = jax.tree.map(jnp.copy, params)
        state = opt.init(p)
        for _ in range(2):
            p, state = opt.step(grads, state, p, donate=True)
        assert float(p["w"][0, 0]) < 1.0, type(opt).__name__


@pytest.mark.parametrize("donate", [False, True], ids=["xla", "donated"])
@pytest.mark.parametrize("kind", ["8bit", "4bit", "fp8", "companded"])
def test_zero_size_leaves_with_min_size_0_step_and_dequantize(kind, donate):
    # `min_size=0` quantizes a leaf of no elements too: no blocks, nothing to read.
    storage = type(STORAGE[kind])(min_size=0)
    opt = eqxopt.AdamW(1e-2, mu_dtype=storage, nu_dtype=storage)
    rng = np.random.default_rng(4)
    params = {
        "empty": jnp.ones((0, 4)),
        "v": jnp.asarray(rng.standard_normal(300), jnp.float32),
    }
    grads = [
        {"empty": jnp.ones((0, 4)), "v": jnp.asarray(rng.standard_normal(300))}
        for _ in range(3)
    ]
    state = opt.init(params)
    empty = state.mu["empty"]
    assert isinstance(empty, eqxopt.QuantizedArray) and empty.codes.shape[0] == 0
    assert empty.dequantize().shape == (0, 4)
    # The empty leaf changes nothing: `v` steps as it does alone (on the same path).
    alone = {"v": jnp.copy(params["v"])}
    alone_state = opt.init(alone)
    p = jax.tree.map(jnp.copy, params)
    for g in grads:
        p, state = opt.step(g, state, p, donate=donate)
        alone, alone_state = opt.step({"v": g["v"]}, alone_state, alone, donate=donate)
    assert p["empty"].shape == (0, 4) and p["empty"].dtype == jnp.float32
    assert state.nu["empty"].dequantize().shape == (0, 4)
    np.testing.assert_array_equal(np.asarray(p["v"]), np.asarray(alone["v"]))
    assert not np.array_equal(np.asarray(p["v"]), np.asarray(params["v"]))


# One NaN, one inf and one -inf gradient element, each in a block of its own.
NON_FINITE = [(0, 5, np.nan), (9, 100, np.inf), (20, 7, -np.inf)]


def _steps_with_non_finite_gradients(opt, path):
    """The parameters and state after each of 4 steps of `opt`, the second with
    `NON_FINITE` gradient elements, by `path`: `"xla"` (a step that is not donated),
    `"donated"` (native kernels off) or `"donated-native"`."""
    rng = np.random.default_rng(5)
    params = {"w": jnp.asarray(rng.standard_normal((32, 256)), jnp.float32)}
    eqxopt.set_native_kernels(path == "donated-native")
    try:
        state = opt.init(params)
        history = []
        for i in range(4):
            g = jnp.asarray(rng.standard_normal((32, 256)), jnp.float32)
            if i == 1:
                for row, col, value in NON_FINITE:
                    g = g.at[row, col].set(value)
            before = jax.tree.map(np.asarray, state)  # a donated step deletes it
            params, state = opt.step({"w": g}, state, params, donate=path != "xla")
            history.append((np.asarray(params["w"]), before, np.asarray(g)))
        return history, state
    finally:
        eqxopt.set_native_kernels(True)


@pytest.mark.parametrize(
    "path",
    [
        "xla",
        "donated",
        pytest.param("donated-native", marks=pytest.mark.needs_compiler),
    ],
)
@pytest.mark.parametrize("kind", ["8bit", "4bit", "fp8", "companded"])
def test_non_finite_gradient_elements_turn_only_their_parameters_nan(kind, path):
    storage = STORAGE[kind]
    b1 = 0.9
    opt = eqxopt.AdamW(1e-2, b1=b1, mu_dtype=storage, nu_dtype=storage)
    ours, state = _steps_with_non_finite_gradients(opt, path)
    exact, _ = _steps_with_non_finite_gradients(eqxopt.AdamW(1e-2, b1=b1), "xla")
    bad = np.zeros((32, 256), bool)
    for row, col, _ in NON_FINITE:
        bad[row, col] = True
    # The same parameters turn NaN as with float32 moments: those three, from the
    # step of the bad gradient on (not the blocks they lie in).
    for step, ((p, _, _), (p32, _, _)) in enumerate(zip(ours, exact)):
        np.testing.assert_array_equal(np.isnan(p), np.isnan(p32), f"step {step}")
        np.testing.assert_array_equal(np.isnan(p), bad if step else np.zeros_like(bad))
    # The moment of the step of the bad gradient, by plain arithmetic from the
    # one before it: a value that is not finite is stored as 0, and each block's
    # scale is the largest magnitude of its finite values.
    _, before, g = ours[1]
    after = ours[2][1]
    mu = before.mu["w"].dequantize().reshape(-1)
    new_mu = (b1 * mu + (1 - b1) * g.reshape(-1)).astype(np.float32)
    new_mu = np.where(np.isfinite(new_mu), new_mu, 0.0).astype(np.float32)
    blocks = new_mu.reshape(-1, storage.block_size)
    absmax = np.maximum(np.abs(blocks).max(axis=1), 1e-12)
    if kind == "fp8":
        absmax = absmax / 448
    # Companded scales are float16 (to within one of its steps: the moment here
    # is formed in NumPy, not by the step's own program).
    rtol = 1e-3 if kind == "companded" else 1e-6
    np.testing.assert_allclose(after.mu["w"].absmax.astype(np.float32), absmax, rtol)
    stored = np.asarray(after.mu["w"].dequantize())
    assert np.all(stored[bad] == 0.0)
    resolution = {"fp8": 2.0**-4, "4bit": 0.1125, "companded": 1 / 127 + 2.0**-10}
    resolution = resolution.get(kind, 1 / 142)
    scale = np.repeat(np.abs(blocks).max(axis=1), storage.block_size)
    assert np.all(np.abs(stored.reshape(-1) - new_mu) <= resolution * scale * 1.01)
    # And the state holds finite numbers only, to the end.
    for moment in (state.mu["w"], state.nu["w"]):
        assert np.all(np.isfinite(np.asarray(moment.absmax)))
        assert np.all(np.isfinite(np.asarray(moment.dequantize())))
