"""eqxopt's native CPU kernels (`_fused`, `_native`): element-wise rules translated to
C give XLA's numbers to rounding, on every optimizer that uses them, and everything
they cannot take falls back to XLA's code."""

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt
from catalog import all_cases, swept
from eqxopt._core._leafwise import map_leaves
from helpers import assert_trees_close, compiles, in_place, nested_tree, package_path
from test_catalog import extra_for, quadratic_loss

# The native backend's own tests: skipped where the kernels are not available.
pytestmark = pytest.mark.needs_compiler

CASES = all_cases()
ROOT = pathlib.Path(__file__).resolve().parents[1]

# Rules with norms, factored or matrix statistics are not element-wise and keep XLA's
# code; every other optimizer in the catalog must run through the kernels.
NOT_ELEMENTWISE = {
    "CAdamW",
    "StableAdamW",
    "LAMB",
    "LARS",
    "Fromage",
    "NovoGrad",
    "SM3",
    "Adafactor",
    "Adafactor-factored-momentum",
    "SOAP",
    "SOAP-kl",
    "KLShampoo",
    "LBFGS",
    "Shampoo",
    "PSGDKron",
    "GaLore",  # projections through each matrix's SVD
    "APOLLO",  # random projections and norms per channel
    "APOLLO-Mini",
    "AdamMini",  # one second moment per block
    "MARS",  # the corrected gradient is clipped by its leaf's norm
    "Scion",  # an oracle per leaf: Newton-Schulz, column, row or RMS norms
}


@pytest.fixture
def xla_only():
    eqxopt.set_native_kernels(False)
    yield
    eqxopt.set_native_kernels(True)


def with_native(enabled, fn, *args):
    # No cache of JAX's is cleared: eqxopt's entries put the backend in use in
    # their programs' keys (and the switch drops eqxopt's own programs), so a
    # program traced with the kernels in the other state is never reused
    # (`native_calls` and test_switching_recompiles_eqxopt_steps check it). Clearing
    # them made every later test of the process compile its eager operations again.
    eqxopt.set_native_kernels(enabled)
    try:
        return fn(*args)
    finally:
        eqxopt.set_native_kernels(True)


def native_calls(method, grads, params, state, extra=None, *, donate=True):
    """How many native calls the program of `method` (`opt.step` or `opt.update`)
    holds for these arguments."""
    lowered = method.lower(grads, state, params, donate=donate, **(extra or {}))
    text = lowered.as_text()
    # Float32 leaves' kernels, and those of leaves with stored moments.
    return text.count("eqxopt_elementwise") + text.count("eqxopt_quantized")


@pytest.mark.needs_compiler
def test_kernels_are_available_here():
    # The CPU machines this project runs on have a C++ compiler; without one the
    # library still works (see test_build_failure_warns_and_falls_back).
    assert eqxopt.native_kernels_available()


def _read(tree):
    # Error-corrected moments as the values they hold: the rule's float
    # operations agree to rounding, which can move a residual by one unit (of
    # 1/127 of half a bf16 step).
    def read(x):
        return x.dequantize() if isinstance(x, eqxopt.ErrorCorrectedArray) else x

    return jax.tree.map(
        read, tree, is_leaf=lambda x: isinstance(x, eqxopt.ErrorCorrectedArray)
    )


@pytest.mark.parametrize("case", swept(CASES))
def test_catalog_matches_xla(case):
    def run():
        # Donated steps: the ones the kernels run. One compiled gradient.
        gradient = jax.jit(jax.grad(quadratic_loss))
        opt = case.make()
        params = nested_tree()
        state = opt.init(params)
        history = []
        for _ in range(5):
            grads = gradient(params)
            extra = extra_for(case, quadratic_loss, params)
            kept = jax.tree.map(lambda x: jnp.array(x, copy=True), params)
            params, state = opt.step(grads, state, params, donate=True, **extra)
            history.append(kept)
        grads = gradient(params)
        extra = extra_for(case, quadratic_loss, params)
        updates, state = opt.update(grads, state, params, donate=True, **extra)
        return history, params, updates, state

    native = with_native(True, run)
    xla = with_native(False, run)
    assert_trees_close(_read(native), _read(xla), rtol=2e-5, atol=2e-6)

    opt = case.make()
    params = nested_tree()
    grads = jax.grad(quadratic_loss)(params)
    extra = extra_for(case, quadratic_loss, params)
    args = (opt.step, grads, params, opt.init(params), extra)
    used = native_calls(*args)
    if case.name in NOT_ELEMENTWISE:
        assert used == 0
    else:
        assert used > 0
        assert with_native(False, native_calls, *args) == 0
    # A step into new buffers keeps XLA's code (allocation-bound either way).
    assert native_calls(*args, donate=False) == 0


ORDINARY = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 1e-30, -1e-30, 3e38, -3e38, 7.25, 1e-3]
SPECIAL = np.array([*ORDINARY, np.inf, -np.inf, np.nan], np.float32)


def many_ops(g, p, m):
    a = jnp.where(g > 0, jnp.sqrt(jnp.abs(g)), jnp.exp(-jnp.abs(g)))
    b = jnp.maximum(p, m) - jnp.minimum(p, g) + jnp.sign(g) * jnp.tanh(p)
    c = jnp.clip(m, -0.5, 0.5) + jax.lax.rsqrt(jnp.abs(p) + 1) + jnp.log1p(jnp.abs(g))
    d = g**3 + (jnp.abs(p) + 1) ** -2 + jnp.expm1(p * 0.1) - jnp.log(jnp.abs(m) + 2)
    e = jnp.where((jnp.isfinite(g) & (p != 0)) | ~(m < 0), 1.0, 2.0)
    f = jax.nn.sigmoid(g) + jnp.floor(p * 3) + jnp.ceil(m * 3) + jnp.square(g)
    h = (
        g / (p + 2)
        + jnp.power(jnp.abs(p) + 1, 1.5)
        + (g >= m).astype(g.dtype) * 0.25
        - (p <= m).astype(g.dtype)
    )
    return a + b, c + d + e + f + h


@pytest.mark.needs_compiler
def test_every_translated_primitive_matches_xla():
    g, p, m = np.meshgrid(SPECIAL, SPECIAL, SPECIAL[::3], indexing="ij")
    g, p, m = (jnp.asarray(x.ravel()) for x in (g, p, m))

    @jax.jit
    def run(g, p, m):
        updates, (moment,) = in_place(
            lambda: map_leaves(many_ops, g, p, (m,), elementwise=True)
        )
        return updates, moment

    assert "eqxopt_elementwise" in run.lower(g, p, m).as_text()
    native = run(g, p, m)
    expected = jax.jit(many_ops)(g, p, m)
    for got, want in zip(native, expected):
        # tanh, exp and log come from the C library here, from XLA's own
        # approximations there: a few ulps apart (of terms of order 1).
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_call_like_primitives_are_translated():
    """Bodies of `jax.jit`, `jax.checkpoint` and `custom_jvp` functions (matched by
    primitive object, whatever this JAX names them) are translated in place."""

    def rule(g, p):
        doubled = jax.checkpoint(lambda x: x * 2.0)(g)
        return (jax.jit(jnp.tanh)(doubled) + jax.nn.relu(p) - jnp.clip(g, -0.5, 0.5),)

    g, p = jnp.linspace(-1, 1, 7), jnp.linspace(-2, 3, 7)

    @jax.jit
    def run(g, p):
        return in_place(lambda: map_leaves(rule, g, p, elementwise=True)[0])

    assert "eqxopt_elementwise" in run.lower(g, p).as_text()
    np.testing.assert_allclose(run(g, p), jax.jit(rule)(g, p)[0], rtol=1e-6)


@pytest.mark.parametrize(
    "rule",
    [
        lambda g, p: (g * jnp.sum(p),),  # a reduction (wrongly called element-wise)
        lambda g, p: ((g * 4).astype(jnp.int32).astype(jnp.float32) * p,),
        lambda g, p: (jax.lax.cumsum(g) + p,),
    ],
    ids=["reduction", "integer-maths", "cumsum"],
)
def test_untranslatable_rules_fall_back_to_xla(rule):
    g, p = jnp.linspace(-1, 1, 7), jnp.linspace(2, 3, 7)

    @jax.jit
    def run(g, p):
        return in_place(
            lambda: map_leaves(lambda g, p: rule(g, p), g, p, elementwise=True)[0]
        )

    assert "eqxopt_elementwise" not in run.lower(g, p).as_text()
    np.testing.assert_array_equal(run(g, p), jax.jit(rule)(g, p)[0])


@pytest.mark.parametrize(
    "rule",
    [
        lambda g, p: (g / g.size + p,),
        lambda g, p: (g * (2.0 if g.ndim else 1.0) + p,),
        lambda g, p: (g * jnp.float32(np.prod(g.shape)) - p,),
    ],
    ids=["size", "ndim-branch", "shape"],
)
def test_a_rule_that_reads_the_shape_is_not_taken_for_elementwise(rule):
    """`elementwise=True` is a promise the engine checks: a rule that reads its
    leaf's shape computes something else on the scalars the loop is made from, so it
    keeps XLA's code (the same numbers as without the promise)."""
    g, p = jnp.linspace(-1, 1, 7), jnp.linspace(2, 3, 7)

    @jax.jit
    def run(g, p):
        return in_place(lambda: map_leaves(rule, g, p, elementwise=True)[0])

    assert "eqxopt_elementwise" not in run.lower(g, p).as_text()
    np.testing.assert_array_equal(run(g, p), jax.jit(rule)(g, p)[0])
    # Where the shape makes no difference (a 0-d leaf), the loop runs it.
    g0, p0 = g[3], p[3]
    assert "eqxopt_elementwise" in run.lower(g0, p0).as_text()
    np.testing.assert_allclose(run(g0, p0), jax.jit(rule)(g0, p0)[0], rtol=1e-6)


class _SizeScaled(eqxopt.AbstractTransform):
    """`map_leaves` with a rule wrongly promised element-wise: it divides by the
    leaf's size."""

    def init(self, params):
        return eqxopt.EmptyState()

    def transform(self, grads, state, params):
        def rule(g, p):
            return (-g / g.size,)

        return eqxopt.map_leaves(rule, grads, params, elementwise=True)[0], state


def test_a_donated_step_of_a_shape_reading_rule_gives_xla_numbers():
    params = {"w": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4), "b": jnp.ones(5)}
    grads = jax.tree.map(lambda x: 0.5 * x + 1.0, params)
    opt = _SizeScaled()
    assert native_calls(opt.step, grads, params, opt.init(params)) == 0

    def run():
        return opt.step(grads, opt.init(params), fresh(params), donate=True)[0]

    expected = jax.tree.map(lambda p, g: p - g / g.size, params, grads)
    assert_trees_close(with_native(True, run), expected, rtol=1e-6, atol=0)


def test_a_leaf_the_loop_refuses_leaves_the_earlier_ones_native():
    """A 0-d leaf (where reading the size changes nothing) goes to the loop, then a
    larger leaf of the same shape-reading rule is refused: the loop still delivers
    the 0-d leaf's result, and the larger leaf gets XLA's numbers."""
    params = {"a": jnp.asarray(2.0), "w": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)}
    grads = jax.tree.map(lambda x: 0.5 * x + 1.0, params)
    opt = _SizeScaled()

    def run():
        return opt.step(grads, opt.init(params), fresh(params), donate=True)[0]

    expected = jax.tree.map(lambda p, g: p - g / g.size, params, grads)
    assert_trees_close(with_native(True, run), expected, rtol=1e-6, atol=0)


def test_large_leaf_split_across_threads_matches_xla():
    n = (1 << 19) + 13  # several threads, and a ragged last range
    params = {"w": jnp.linspace(-1.0, 1.0, n), "b": jnp.ones(5)}
    grads = jax.tree.map(lambda x: jnp.cos(7 * x) * 0.1, params)
    opt = eqxopt.AdamW(1e-2, weight_decay=0.1)

    def run(donate):
        p = jax.tree.map(lambda x: jnp.array(x, copy=True), params)
        s = opt.init(p)
        for _ in range(4):
            p, s = opt.step(grads, s, p, donate=donate)
        return p, s

    native = with_native(True, run, True)
    assert_trees_close(native, with_native(False, run, True), rtol=2e-6, atol=1e-7)
    assert_trees_close(native, with_native(True, run, False), rtol=2e-6, atol=1e-7)


@pytest.mark.needs_compiler
@pytest.mark.parametrize("native", [True, False], ids=["native", "xla"])
def test_donated_entries_write_in_place(native):
    eqxopt.set_native_kernels(native)
    try:
        params = {"a": jnp.zeros((256, 64)), "c": jnp.zeros(64)}
        opt = eqxopt.AdamW(1e-3)
        state = opt.init(params)
        for method in (opt.step, opt.update):
            compiled = method.lower(params, state, params, donate=True).compile()
            text = compiled.as_text()
            # Scalars and the custom calls' small result tables only; no array is
            # copied (a scalar may be: `eqx.filter_jit`'s int32 marker output takes
            # the step counter's buffer).
            assert compiled.memory_analysis().temp_size_in_bytes < 1024
            copies = re.findall(r"= (\S+) copy\(", text)
            assert all(shape.endswith("[]") for shape in copies), copies
            assert ("eqxopt_elementwise" in text) == native
            # Both (small) leaves share one call; the update of `step` is only
            # made when something reads it.
            if native and method == opt.step:
                assert text.count("custom-call(") == 1
    finally:
        eqxopt.set_native_kernels(True)


# Donation inside `jax.grad`'s trace cannot be used (JAX says so); the step runs.
@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
def test_derivatives_and_vmap_through_a_native_step():
    params = {"w": jnp.linspace(-1.0, 1.0, 6)}
    grads = {"w": jnp.linspace(0.5, -0.5, 6)}

    def loss_of_lr(lr):
        opt = eqxopt.AdamW(lr, weight_decay=0.1)
        new, _ = opt.step(grads, opt.init(params), params, donate=True)
        return jnp.sum(new["w"] ** 2)

    d_native = with_native(True, jax.grad(loss_of_lr), 0.1)
    d_xla = with_native(False, jax.grad(loss_of_lr), 0.1)
    np.testing.assert_allclose(d_native, d_xla, rtol=1e-6)

    opt = eqxopt.Adam(0.1)
    batched = jax.tree.map(lambda x: jnp.stack([x, 2 * x, -x]), grads)

    def vmapped():
        def one(g):
            return opt.step(g, opt.init(params), params, donate=True)[0]

        return jax.vmap(one)(batched)

    assert_trees_close(with_native(True, vmapped), with_native(False, vmapped))


@pytest.mark.needs_compiler
def test_only_float32_leaves_take_the_kernel():
    params = {
        "f32": jnp.linspace(-1.0, 1.0, 8),
        "bf16": jnp.linspace(-1.0, 1.0, 8).astype(jnp.bfloat16),
        "int": jnp.arange(3),
    }
    grads = {"f32": params["f32"] * 0.5, "bf16": params["bf16"] * 2, "int": None}
    for opt in [eqxopt.AdamW(1e-2), eqxopt.Adam(1e-2, mu_dtype=jnp.bfloat16)]:
        # AdamW: one call, for the f32 leaf (its unused update call is dropped);
        # Adam with bf16 moments: no leaf has all-float32 inputs.
        expected = 1 if opt.mu_dtype is None else 0
        assert native_calls(opt.step, grads, params, opt.init(params)) == expected

        def run(opt=opt):
            p = jax.tree.map(lambda x: jnp.array(x, copy=True), params)
            return opt.step(grads, opt.init(p), p, donate=True)

        native, xla = with_native(True, run), with_native(False, run)
        assert_trees_close(native, xla, rtol=1e-6, atol=1e-7)
        assert jax.tree.map(lambda x: x.dtype, native[0]) == jax.tree.map(
            lambda x: x.dtype, params
        )


def test_set_native_kernels_takes_a_bool():
    with pytest.raises(TypeError, match="enabled must be a bool, got int"):
        eqxopt.set_native_kernels(1)  # type: ignore[arg-type]


def test_switching_recompiles_eqxopt_steps(xla_only):
    params = {"w": jnp.ones(4)}
    opt = eqxopt.SGD(0.1, momentum=0.9)
    state = opt.init(params)
    opt.step(params, state, params)
    with compiles() as log:
        opt.step(params, state, params)
    assert log == []
    eqxopt.set_native_kernels(True)
    with compiles() as log:
        opt.step(params, state, params)
    assert log


def run_script(script, **env):
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env={**os.environ, "PYTHONPATH": package_path(), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


STEP_SCRIPT = """
    import warnings
    import jax.numpy as jnp
    import numpy as np
    import eqxopt
    params = {"w": jnp.linspace(-1.0, 1.0, 6)}
    opt = eqxopt.AdamW(0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = eqxopt.native_kernels_available()
        new, _ = opt.step(params, opt.init(params), params)
    print("available", available)
    print("warnings", [str(w.message) for w in caught])
    print("result", np.asarray(new["w"]).tolist())
"""


def test_build_failure_warns_and_falls_back(tmp_path):
    result = run_script(
        STEP_SCRIPT,
        CXX=str(tmp_path / "no-such-compiler"),
        EQXOPT_CACHE_DIR=str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert "available False" in result.stdout
    assert "could not build its native CPU kernels" in result.stdout
    assert "no-such-compiler" in result.stdout
    params = {"w": jnp.linspace(-1.0, 1.0, 6)}
    opt = eqxopt.AdamW(0.1)
    expected = opt.step(params, opt.init(params), params)[0]["w"]
    got = eval(result.stdout.split("result ")[1])
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_environment_variable_turns_kernels_off(tmp_path):
    result = run_script(STEP_SCRIPT, EQXOPT_NATIVE="0", EQXOPT_CACHE_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "available False" in result.stdout
    assert "warnings []" in result.stdout
    assert list(tmp_path.iterdir()) == []  # nothing was built


def test_an_untested_jax_turns_the_kernels_off_with_one_warning(tmp_path):
    """The kernels rely on JAX internals (`_native/README.md`): with a JAX outside
    the tested range they stay off, say so once, and steps give XLA's numbers."""
    script = "import jax\njax.__version__ = '0.99.0'\n" + textwrap.dedent(STEP_SCRIPT)
    result = run_script(script, EQXOPT_CACHE_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "available False" in result.stdout
    warned = eval(result.stdout.split("warnings ")[1].split("\n")[0])
    assert len(warned) == 1 and "tested with JAX" in warned[0], warned
    assert list(tmp_path.iterdir()) == []  # nothing was built
    params = {"w": jnp.linspace(-1.0, 1.0, 6)}
    opt = eqxopt.AdamW(0.1)
    expected = opt.step(params, opt.init(params), params)[0]["w"]
    got = eval(result.stdout.split("result ")[1])
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_a_rule_that_cannot_be_built_runs_xla_code(monkeypatch):
    from eqxopt._native import _build as _native

    def broken(source):
        raise OSError("No space left on device")

    monkeypatch.setattr(_native, "load_kernel", broken)
    monkeypatch.setattr(_native, "_warned", [])
    params = {"w": jnp.linspace(-1.0, 1.0, 6)}
    opt = eqxopt.AdamW(0.1)
    with pytest.warns(RuntimeWarning, match="No space left on device"):
        got = jax.jit(lambda p: opt.step(p, opt.init(p), p, donate=True))(params)
    monkeypatch.undo()
    expected = with_native(False, lambda: opt.step(params, opt.init(params), params))
    assert_trees_close(got, expected, rtol=0, atol=0)


def fresh(tree):
    return jax.tree.map(lambda x: jnp.array(x, copy=True), tree)


@pytest.mark.needs_compiler
def test_inside_a_donating_jit_donate_true_writes_in_place():
    """Nested in the user's own `jit`, `donate=True` lets the kernels write over their
    inputs: a `jit` that donates its arguments then gets no copies and no full-size
    temporaries (one that does not gets XLA's copies first, never wrong)."""
    params = {"w": jnp.ones(1 << 16), "b": jnp.ones(8)}
    grads = jax.tree.map(lambda x: 0.1 * x, params)
    opt = eqxopt.AdamW(1e-3)
    state = opt.init(params)

    def step(p, s, g):
        return opt.step(g, s, p, donate=True)

    def update(p, s, g):
        updates, s = opt.update(g, s, p, donate=True)
        return eqxopt.apply_updates(p, updates), s

    param_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    # `update` hands the updates out (optax's contract): they are the one temporary.
    for fn, temporaries in ((step, 1024), (update, param_bytes + 1024)):
        compiled = jax.jit(fn, donate_argnums=(0, 1)).lower(params, state, grads)
        compiled = compiled.compile()
        assert "eqxopt_elementwise" in compiled.as_text()
        assert " copy(" not in compiled.as_text()
        assert compiled.memory_analysis().temp_size_in_bytes < temporaries
        got = jax.jit(fn)(fresh(params), opt.init(params), grads)  # not donated
        expected = with_native(
            False, lambda fn=fn: fn(fresh(params), opt.init(params), grads)
        )
        assert_trees_close(got, expected, rtol=1e-6, atol=1e-7)
