"""Inside `jax.shard_map`, Adafactor and AdaptiveGradClip reduce over some dimensions
of a leaf only, and SOAP gathers split leaves whole, so they must know which
dimension is split: `param_specs` declares it
(the leaves' `PartitionSpec`s), and a leaf split along dimension 1 then agrees with
the unsharded run. Without it (the default) a leaf is taken to be split along
dimension 0, which for this leaf gives different numbers (shown, so the agreement
proves something). A spec that disagrees with the leaf is an error naming the leaf.
Runs in a subprocess with 8 host devices.

Tolerance: `rtol=1e-5, atol=1e-6` (float32 sums taken in another order)."""

import textwrap

import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import eqxopt
from eqxopt._core._jax_api import varying_axes
from helpers import run_on_8_devices

needs_types = pytest.mark.skipif(
    varying_axes(jnp.zeros(())) is None,
    reason="this JAX has no varying-axes types (jax.typeof(x).vma, JAX >= 0.6)",
)

SCRIPT = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, PartitionSpec as P

    import eqxopt
    from eqxopt._core._jax_api import shard_map
    from helpers import assert_moved, trained_by_update

    jax.config.update("jax_platforms", "cpu")
    mesh = Mesh(np.array(jax.devices()), ("fsdp",))
    A = "fsdp"
    RTOL, ATOL = 1e-5, 1e-6
    # "w" is split along dimension 1 (tensor parallel), "u" along dimension 0
    # (FSDP), "b" replicated.
    shapes = {"w": (6, 16), "u": (16, 12), "b": (12,)}
    specs = {"w": P(None, A), "u": P(A), "b": P()}
    rng = np.random.default_rng(0)
    params = {k: jnp.asarray(rng.normal(size=s), jnp.float32)
              for k, s in shapes.items()}
    STEPS = 4
    grads = [{k: jnp.asarray(3 * rng.normal(size=s), jnp.float32)
              for k, s in shapes.items()} for _ in range(STEPS)]


    def sharded(opt):
        return jax.jit(shard_map(trained_by_update(opt), mesh=mesh,
                                 in_specs=(specs, [specs] * STEPS),
                                 out_specs=specs))(params, grads)


    def difference(a, b):
        # The largest |a - b| over tolerance.
        worst = 0.0
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
            worst = max(worst, float(np.max(np.abs(x - y) / (ATOL + RTOL * np.abs(y)))))
        return worst


    makers = {
        "Adafactor": lambda **kw: eqxopt.Adafactor(
            0.05, min_dim_size_to_factor=4, **kw),
        "AdaptiveGradClip": lambda **kw: eqxopt.Chain(
            eqxopt.AdaptiveGradClip(0.05, **kw), eqxopt.SGD(0.1)),
        "SOAP": lambda **kw: eqxopt.SOAP(0.05, precondition_frequency=2, **kw),
        "SOAP-kl": lambda **kw: eqxopt.SOAP(
            0.05, precondition_frequency=2, factor_update="kl", **kw),
        "KLShampoo": lambda **kw: eqxopt.KLShampoo(
            0.05, precondition_frequency=2, **kw),
    }
    for name, make in makers.items():
        single = jax.jit(trained_by_update(make()))(params, grads)
        assert_moved(params, single, RTOL, ATOL)
        declared = difference(sharded(make(axis_name=A, param_specs=specs)), single)
        assert declared <= 1, (name, declared)
        # The default (split along dimension 0) is wrong for "w".
        default = difference(sharded(make(axis_name=A)), single)
        assert default > 100, (name, default)
        print("agrees", name, f"{declared:.3g}", "default", f"{default:.3g}")

    # A spec that disagrees with what the leaf's type says varies is an error
    # naming the leaf: "b" declared split, and "w" declared replicated.
    for wrong, leaf in (({**specs, "b": P(A)}, "b"), ({**specs, "w": P()}, "w")):
        for name, make in makers.items():
            try:
                sharded(make(axis_name=A, param_specs=wrong))
            except ValueError as e:
                assert f"param_specs['{leaf}']" in str(e), e
                assert "varies over" in str(e), e
            else:
                raise AssertionError((name, leaf))
    # More entries than dimensions.
    try:
        sharded(makers["Adafactor"](axis_name=A,
                                    param_specs={**specs, "b": P(None, None)}))
    except ValueError as e:
        assert "with more entries than params['b'] has" in str(e), e
    else:
        raise AssertionError("too many entries")
    print("SPLIT-OK")
    """
)


@pytest.mark.slow
@needs_types
def test_a_leaf_split_along_dim_1_agrees_with_its_declared_spec():
    out = run_on_8_devices(SCRIPT)
    assert "SPLIT-OK" in out, out


@pytest.mark.parametrize(
    "make", [eqxopt.Adafactor, eqxopt.AdaptiveGradClip, eqxopt.SOAP]
)
def test_param_specs_are_validated(make):
    args = (0.1,) if make is eqxopt.AdaptiveGradClip else ()
    with pytest.raises(
        TypeError, match=r"param_specs\['w'\] must be a jax.sharding.PartitionSpec"
    ):
        make(*args, param_specs={"w": "fsdp"})
    # Equal trees of specs are equal options (one compiled step).
    a = make(*args, axis_name="x", param_specs={"w": P("x"), "b": None})
    b = make(*args, axis_name="x", param_specs={"w": P("x"), "b": None})
    assert a.param_specs == b.param_specs
    assert hash(a.param_specs) == hash(b.param_specs)


def test_param_specs_must_be_a_prefix_of_params():
    opt = eqxopt.AdaptiveGradClip(0.1, param_specs={"w": P(), "v": P()})
    params = {"w": jnp.ones((3, 2))}
    state = opt.init(params)
    with pytest.raises(ValueError, match="param_specs"):
        opt.update(params, state, params)
