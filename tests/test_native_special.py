"""Native kernels against XLA's code on special values: a donated step (native) and
the same step with the kernels off must agree on which elements are finite, and to
rounding on the finite ones, for every element-wise optimizer in the catalog."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

import eqxopt
import fast_compile
from catalog import all_cases, swept
from test_catalog import extra_for
from test_native import NOT_ELEMENTWISE

# The native backend's own tests: skipped where the kernels are not available.
pytestmark = pytest.mark.needs_compiler

# Quantized moments keep XLA's code (a block's scale is a reduction over it).
ELEMENTWISE = [
    c
    for c in all_cases()
    if c.name not in NOT_ELEMENTWISE and "quantized" not in c.tags
]
SPECIAL = [np.nan, np.inf, -np.inf, 1e30, -1e30, 1e-40, -1e-40, -0.0, 0.0]
ORDINARY = [1.0, -0.5, 3.0, 1e-3, -2e4]
N = 32

values = st.sampled_from([*SPECIAL, *ORDINARY])
leaf = arrays(np.float32, N, elements=values)


def two_steps(opt, extra):
    """Two donated steps in one program (the second sees special values in the
    state), compiled with the kernels switched as they are now. The state is an
    argument, as in a training loop: XLA folds constants of a state made inside."""

    def run(p, s, g1, g2):
        p1, s1 = opt.step(g1, s, p, donate=True, **extra)
        p2, s2 = opt.step(g2, s1, p1, donate=True, **extra)
        return p1, s1, p2, s2

    spec = {"w": jax.ShapeDtypeStruct((N,), jnp.float32)}
    state = jax.eval_shape(opt.init, spec)
    lowered = jax.jit(run).lower(spec, state, spec, spec)
    # The kernels must agree with the code XLA compiles by default (which fuses a
    # multiply and an add into one rounding where the tests' fast code does not).
    compiled = lowered.compile(compiler_options=fast_compile.XLA_DEFAULTS)
    return lowered.as_text().count("eqxopt_elementwise"), compiled


def assert_agree(native, xla):
    for got, want in zip(jax.tree.leaves(native), jax.tree.leaves(xla)):
        got, want = np.asarray(got), np.asarray(want)
        if not np.issubdtype(got.dtype, np.floating):
            np.testing.assert_array_equal(got, want)
            continue
        finite = np.isfinite(want)
        np.testing.assert_array_equal(np.isfinite(got), finite)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(got[np.isinf(want)], want[np.isinf(want)])
        np.testing.assert_allclose(got[finite], want[finite], rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("case", swept(ELEMENTWISE))
def test_special_values_agree_with_xla(case):
    opt = case.make()
    params = {"w": jnp.linspace(-1.0, 1.0, N)}
    extra = extra_for(case, lambda q: jnp.sum(q["w"] ** 2), params)
    eqxopt.set_native_kernels(True)
    calls, native = two_steps(opt, extra)
    assert calls > 0
    eqxopt.set_native_kernels(False)
    try:
        assert two_steps(opt, extra)[0] == 0
        xla = two_steps(opt, extra)[1]
    finally:
        eqxopt.set_native_kernels(True)

    @settings(max_examples=40, deadline=None, database=None)
    @given(p=leaf, g1=leaf, g2=leaf)
    def check(p, g1, g2):
        params = {"w": jnp.asarray(p)}
        args = (
            params,
            opt.init(params),
            {"w": jnp.asarray(g1)},
            {"w": jnp.asarray(g2)},
        )
        assert_agree(native(*args), xla(*args))

    check()
