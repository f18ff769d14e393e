"""Quantized moments in the native backend (`_native/_quantized.py`): torchao's codes
by look-up tables (`_storage.search_tables`) against the binary search, the native
pass's codes, scales and updates against XLA's code, and the donated step's
temporaries."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt
from eqxopt._core import _leafwise, _storage
from helpers import assert_moved, in_place

# The native backend's own tests: skipped where the kernels are not available.
pytestmark = pytest.mark.needs_compiler

_quantized = pytest.importorskip("eqxopt._native._quantized")

MAPS = ["dynamic8_signed", "dynamic8_unsigned", "dynamic4_signed", "linear4_unsigned"]


@pytest.mark.parametrize("name", MAPS)
def test_lookup_codes_are_the_binary_searchs(name):
    # Every threshold and map entry and their float32 neighbours, special values,
    # values of every magnitude, and a stride through all float32 bit patterns.
    table = _storage.code_map(name)
    tables = _storage.search_tables(name)
    edges = np.concatenate([tables.thresholds[:-1], table])
    rng = np.random.default_rng(0)
    parts = [
        edges,
        np.nextafter(edges, np.float32(-2)),
        np.nextafter(edges, np.float32(2)),
        [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 2.0, -2.0],
        rng.uniform(-1.1, 1.1, 20000),
        rng.standard_normal(20000) * np.exp(rng.uniform(-40, 0, 20000)),
        np.arange(0, 2**32, 65537, dtype=np.uint64).astype(np.uint32).view(np.float32),
    ]
    y = np.concatenate([np.asarray(x, np.float32) for x in parts[:-1]] + parts[-1:])
    search = jax.jit(lambda y: _storage._nearest_code_search(y, table))(y)
    lookup = jax.jit(lambda y: _storage._nearest_code(y, table, name))(y)
    np.testing.assert_array_equal(np.asarray(lookup), np.asarray(search))
    # The native kernel's one-look-up form holds one threshold per bucket.
    entries = _quantized.search_entries(name).view(np.uint32)
    assert np.all(entries >> 24 < table.size)


def _exact_rule(g, p, m, v):
    # No choice of FMA (XLA contracts a multiply whose one user is an add; a
    # dequantized moment is itself a product `map[code] * absmax`, so `m` is
    # scaled first) and no division (XLA:CPU's is not always correctly rounded):
    # every float operation rounds the same way in both.
    m = 0.5 * m - g
    v = jnp.maximum(v, jnp.abs(g))
    return m - v, m, v


def _run_leaves(moments, grads, params, donate):
    # The engine on a custom element-wise rule, as a donated step traces it
    # (`donate`: the native kernels may run) or not (XLA's code).
    def run(grads, params, moments):
        def engine():
            return _leafwise.map_leaves(
                _exact_rule, grads, params, moments, elementwise=True
            )

        return in_place(engine) if donate else engine()

    fn = jax.jit(run, donate_argnums=(2,) if donate else ())
    return fn(grads, params, moments)


def _copy(tree):
    return jax.tree.map(jnp.copy, tree)


@pytest.mark.needs_compiler
def test_native_codes_scales_and_updates_equal_xlas():
    rng = np.random.default_rng(1)
    # Padded last blocks (5000, 700), mixed maps and block sizes in one leaf, a
    # float32 moment beside a quantized one, a NaN.
    params = {
        "a": jnp.zeros(5000),
        "b": jnp.zeros((7, 100)),
        "c": jnp.zeros(3000),
    }
    q8, q4 = eqxopt.Blockwise8bit(64, 1), eqxopt.Blockwise4bit(32, 1)
    m_tree = {
        "a": q8.init_leaf(params["a"], 0.0, False),
        "b": q4.init_leaf(params["b"], 0.0, False),
        "c": jnp.zeros(3000),
    }
    v_tree = {
        "a": q4.init_leaf(params["a"], 0.0, True),
        "b": q8.init_leaf(params["b"], 0.0, True),
        "c": q8.init_leaf(params["c"], 0.0, True),
    }
    state = {"native": (m_tree, v_tree), "xla": (m_tree, v_tree)}
    for step in range(4):
        grads = jax.tree.map(
            lambda p: jnp.asarray(
                rng.standard_normal(p.shape) * np.exp(rng.uniform(-6, 0, p.shape)),
                jnp.float32,
            ),
            params,
        )
        if step == 2:
            grads["c"] = grads["c"].at[5].set(jnp.nan)
        native_updates, native = _run_leaves(
            _copy(state["native"]), grads, params, True
        )
        xla_updates, xla = _run_leaves(_copy(state["xla"]), grads, params, False)
        for a, b in zip(
            jax.tree.leaves((native_updates, native)),
            jax.tree.leaves((xla_updates, xla)),
        ):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        state = {"native": native, "xla": xla}
    # The moments moved: codes of every kind, not all zero.
    codes = np.asarray(state["native"][0]["a"].codes)
    assert len(np.unique(codes)) > 100
    # The NaN was stored as 0, and its block scaled by its finite values.
    assert np.all(np.isfinite(np.asarray(state["native"][1]["c"].absmax)))


def _bits(x):
    # Bit patterns, so that equal arrays are equal in every bit (NaN too).
    x = np.asarray(x)
    views = {2: np.uint16, 4: np.uint32}
    return (
        x.view(views[x.itemsize])
        if x.dtype.kind == "f" or x.dtype == jnp.bfloat16
        else x
    )


@pytest.mark.needs_compiler
@pytest.mark.parametrize("options", [None, "xla-defaults"])
def test_native_companded_and_error_corrected_moments_equal_xlas(options):
    # Companded8bit (signed and unsigned maps, padded last groups, saturated
    # scales) and ErrorCorrectedBf16 moments, beside each other and beside a
    # float32 moment, over magnitudes from 1e-35 to 1e5, a NaN, an infinity and
    # a value beyond bf16's range: the native pass's codes, float16 scales, bf16
    # values, residuals and updates are XLA's, bit for bit, with the tests' fast
    # compilation and with XLA's default code generation.
    from fast_compile import XLA_DEFAULTS

    compiler_options = XLA_DEFAULTS if options else None
    rng = np.random.default_rng(3)
    params = {"a": jnp.zeros(5000), "b": jnp.zeros((7, 100)), "c": jnp.zeros(3001)}
    c, e = eqxopt.Companded8bit(32, 1), eqxopt.ErrorCorrectedBf16()
    m_tree = {
        "a": c.init_leaf(params["a"], 0.0, False),
        "b": e.init_leaf(params["b"], 0.0, False),
        "c": jnp.zeros(3001),
    }
    v_tree = {
        "a": e.init_leaf(params["a"], 0.0, True),
        "b": c.init_leaf(params["b"], 0.0, True),
        "c": c.init_leaf(params["c"], 0.0, True),
    }

    def run(moments, grads, donate):
        def body(grads, params, moments):
            def engine():
                return _leafwise.map_leaves(
                    _exact_rule, grads, params, moments, elementwise=True
                )

            return in_place(engine) if donate else engine()

        fn = jax.jit(
            body,
            donate_argnums=(2,) if donate else (),
            compiler_options=compiler_options,
        )
        if donate:
            text = fn.lower(grads, params, moments).as_text()
            assert text.count("eqxopt_quantized") >= 3  # one call per leaf
        return fn(grads, params, moments)

    state = {"native": (m_tree, v_tree), "xla": (m_tree, v_tree)}
    for step in range(6):
        # Normal float32 magnitudes only: XLA:CPU flushes subnormals, and the
        # rule's maximum would keep one that XLA's code reads as 0.
        grads = jax.tree.map(
            lambda p: jnp.asarray(
                rng.choice([-1.0, 1.0], p.shape)
                * (0.5 + np.abs(rng.standard_normal(p.shape)))
                * np.exp(rng.uniform(-80, 12, p.shape)),
                jnp.float32,
            ),
            params,
        )
        if step == 2:
            grads["c"] = grads["c"].at[5].set(jnp.nan)
            grads["a"] = grads["a"].at[7].set(jnp.inf)
        if step == 3:
            grads["b"] = grads["b"].at[0, :5].set(3.4e38)  # bf16: infinity
        native = run(_copy(state["native"]), grads, True)
        xla = run(_copy(state["xla"]), grads, False)
        for a, b in zip(jax.tree.leaves(native), jax.tree.leaves(xla)):
            np.testing.assert_array_equal(_bits(a), _bits(b))
        state = {"native": native[1], "xla": xla[1]}
    m, v = state["native"]
    # Every kind of value was stored: saturated signed scales (moments beyond
    # 65520), both maps' codes over their range, nonzero residuals.
    assert np.any(np.asarray(m["a"].absmax, np.float32) == 65504.0)
    assert len(np.unique(np.asarray(m["a"].codes))) > 200
    assert len(np.unique(np.asarray(v["b"].codes))) > 100
    assert len(np.unique(np.asarray(m["b"].residual))) > 200
    assert np.all(np.isfinite(np.asarray(v["c"].absmax, np.float32)))


@pytest.mark.needs_compiler
@pytest.mark.parametrize("bits", [8, 4])
def test_native_codes_at_every_threshold_equal_xlas(bits):
    # Moments of exactly every threshold of both maps, their float32 neighbours
    # and the map entries (each block holds a 1, so its absmax is 1 and the codes
    # are searched for these values themselves). Blocks of 100 take every loop of
    # the kernel's search (64, 16 and 1 at a time).
    signed, unsigned = (
        ("dynamic8_signed", "dynamic8_unsigned")
        if bits == 8
        else ("dynamic4_signed", "linear4_unsigned")
    )
    edges = [0.0, -0.0, 1.0, -1.0]
    for name in (signed, unsigned):
        tables = _storage.search_tables(name)
        points = np.concatenate([tables.thresholds[:-1], _storage.code_map(name)])
        for direction in (-2, 2):
            edges.extend(np.nextafter(points, np.float32(direction)))
        edges.extend(points)
    values = np.asarray(edges, np.float32)
    values = values[np.abs(values) <= 1]
    block = 100
    rows = -(-values.size // (block - 1))
    rest = np.zeros(rows * (block - 1), np.float32)
    rest[: values.size] = -values
    g = np.concatenate(
        [np.full((rows, 1), -1.0, np.float32), rest.reshape(rows, -1)], 1
    )
    # And a padded last block.
    g = np.concatenate(
        [g.reshape(-1), -np.linspace(-1, 1, block - 33, dtype=np.float32)]
    )
    storage = eqxopt.Blockwise8bit if bits == 8 else eqxopt.Blockwise4bit
    q = storage(block, 1)
    params = {"w": jnp.zeros(g.size)}
    moments = (
        {"w": q.init_leaf(params["w"], 0.0, False)},
        {"w": q.init_leaf(params["w"], 0.0, True)},
    )
    grads = {"w": jnp.asarray(g)}
    _, native = _run_leaves(_copy(moments), grads, params, True)
    _, xla = _run_leaves(_copy(moments), grads, params, False)
    for a, b in zip(jax.tree.leaves(native), jax.tree.leaves(xla)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Every code of both maps was written.
    for moment, name in zip(native, (signed, unsigned)):
        stored = np.unique(np.asarray(moment["w"].dequantize()))
        np.testing.assert_array_equal(stored, np.unique(_storage.code_map(name)))
    assert np.all(np.asarray(native[0]["w"].absmax) == 1.0)


def _steps(opt, params, grads, native):
    eqxopt.set_native_kernels(native)
    try:
        p, s = _copy(params), opt.init(params)
        for g in grads:
            p, s = opt.step(g, s, p, donate=True)
        return p, s
    finally:
        eqxopt.set_native_kernels(True)


@pytest.mark.needs_compiler
@pytest.mark.parametrize(
    "make",
    [
        lambda: eqxopt.AdamW(
            1e-2, mu_dtype=eqxopt.Blockwise8bit(), nu_dtype=eqxopt.Blockwise8bit()
        ),
        lambda: eqxopt.AdamW(
            1e-2, mu_dtype=eqxopt.Blockwise4bit(), nu_dtype=eqxopt.Blockwise4bit()
        ),
        lambda: eqxopt.Lion(1e-3, mu_dtype=eqxopt.Blockwise8bit()),
        lambda: eqxopt.AdamW(
            1e-2, mu_dtype=eqxopt.Companded8bit(), nu_dtype=eqxopt.Companded8bit()
        ),
        lambda: eqxopt.AdamW(
            1e-2,
            mu_dtype=eqxopt.ErrorCorrectedBf16(),
            nu_dtype=eqxopt.ErrorCorrectedBf16(),
        ),
        lambda: eqxopt.Lion(1e-3, mu_dtype=eqxopt.ErrorCorrectedBf16()),
    ],
    ids=["adamw8", "adamw4", "lion8", "adamw-companded", "adamw-ecc", "lion-ecc"],
)
def test_engine_optimizers_native_match_xla(make):
    rng = np.random.default_rng(2)
    params = {"w": jnp.asarray(rng.standard_normal((40, 128)), jnp.float32)}
    grads = [
        {
            "w": jnp.asarray(
                (0.3 + rng.standard_normal((40, 128)))
                * np.exp(rng.uniform(-4, 0, (40, 128))),
                jnp.float32,
            )
        }
        for _ in range(6)
    ]
    opt = make()
    native_p, native_s = _steps(opt, params, grads, True)
    xla_p, xla_s = _steps(opt, params, grads, False)
    # The native step ran the kernel on the leaf.
    step = jax.jit(lambda g, s, p: opt.step(g, s, p, donate=True))
    state = opt.init(params)
    assert "eqxopt_quantized" in step.lower(grads[0], state, params).as_text()
    assert_moved(params["w"], xla_p["w"], 1e-5, 1e-5, factor=100)
    # The quantizer is exact (above); the rule's float operations agree to
    # rounding (XLA contracts `b1 * m + (1 - b1) * g` into an FMA on either
    # product depending on the fusion), so a code can land one step of the map
    # away: then its element's update differs by a fraction of lr.
    diff = np.abs(np.asarray(native_p["w"]) - np.asarray(xla_p["w"]))
    assert diff.max() <= 0.3 * 1e-2 and np.mean(diff > 1e-6) <= 0.01
    for a, b in zip(jax.tree.leaves(native_s), jax.tree.leaves(xla_s)):
        if a.dtype in (jnp.uint8, jnp.int8):
            assert np.mean(np.asarray(a) == np.asarray(b)) >= 0.99
        elif a.dtype in (jnp.bfloat16, jnp.float16):
            np.testing.assert_allclose(
                np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-2
            )
        else:
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-2)


@pytest.mark.needs_compiler
@pytest.mark.parametrize(
    "storage",
    [
        eqxopt.Blockwise8bit(),
        eqxopt.Blockwise4bit(),
        eqxopt.Companded8bit(),
        eqxopt.ErrorCorrectedBf16(),
    ],
    ids=["8bit", "4bit", "companded", "ecc"],
)
def test_donated_step_has_no_float32_moment_temporaries(storage):
    n = 1 << 20
    params = jnp.zeros(n)
    opt = eqxopt.AdamW(1e-3, mu_dtype=storage, nu_dtype=storage)
    state = opt.init(params)

    def step(p, s, g):
        return opt.step(g, s, p, donate=True)

    compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, params)
    compiled = compiled.compile()
    assert "eqxopt_quantized" in compiled.as_text()
    # The codes and scales are written in place: a few scalars of temporaries.
    assert compiled.memory_analysis().temp_size_in_bytes < 4096


@pytest.mark.needs_compiler
def test_exported_and_differentiated_steps_take_xlas_code():
    params = jnp.linspace(-1.0, 1.0, 512)
    q = eqxopt.Blockwise8bit(64, 1)
    opt = eqxopt.AdamW(1e-2, mu_dtype=q, nu_dtype=q)
    state = opt.init(params)
    grads = jnp.cos(params)

    def step(p, s, g):
        return opt.step(g, s, p, donate=True)

    expected = jax.jit(step)(_copy(params), opt.init(params), grads)
    exported = jax.export.export(jax.jit(step))(params, state, grads)
    assert "custom_call @eqxopt" not in exported.mlir_module()
    got = exported.call(_copy(params), opt.init(params), grads)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    # A derivative through the step (here of the new parameters in the gradient).
    loss = functools.partial(lambda g: jnp.sum(step(_copy(params), state, g)[0]))
    assert np.all(np.isfinite(np.asarray(jax.grad(loss)(grads))))
