"""The native kernels in a process of 8 host devices: parameters on one device (any
of them) run the kernel there; parameters sharded over a mesh (split or replicated)
run it on each device's shard, with no collective, their shardings kept and the
step in place; mixed placements keep XLA's code. Each script runs in a subprocess
(the device count must be set before JAX starts)."""

import textwrap

import pytest

from helpers import run_on_8_devices

# The native backend's own tests: skipped where the kernels are not available.
pytestmark = pytest.mark.needs_compiler

PRELUDE = textwrap.dedent(
    """
    import warnings

    import re

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import eqxopt
    from helpers import assert_moved, assert_trees_close

    warnings.simplefilter("error")  # a donation XLA could not use warns
    jax.config.update("jax_platforms", "cpu")
    assert len(jax.devices()) == 8, jax.devices()
    assert eqxopt.native_kernels_available()
    COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute",
                   "reduce-scatter")
    mesh = Mesh(np.array(jax.devices()), ("fsdp",))
    rng = np.random.default_rng(0)
    # "big" takes a call of its own (split across threads); the others share one.
    shapes = {"w": (64, 24), "b": (24,), "big": (8, 1 << 14)}
    host = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    host_grads = [
        {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
        for _ in range(3)
    ]

    def place(tree, where):
        return {k: jax.device_put(v, where(k)) for k, v in tree.items()}

    def compiled_step(opt, grads, state, params):
        lowered = opt.step.lower(grads, state, params, donate=True)
        return lowered.compile().as_text()

    def run(opt, where, native, state_where=None, in_place=True):
        eqxopt.set_native_kernels(native)
        try:
            params = place(host, where)
            state = opt.init(params)
            if state_where is not None:
                state = state_where(state)
            for g in host_grads:
                # (The step counter starts uncommitted on device 0: copied over.)
                old = [x for x in jax.tree.leaves((params, state)) if x.ndim]
                params, state = opt.step(place(g, where), state, params, donate=True)
                if in_place:
                    assert all(x.is_deleted() for x in old), "a donation was not used"
            return params, state
        finally:
            eqxopt.set_native_kernels(True)

    def same_sharding(tree, like):
        for k, x in tree.items():
            want = like[k].sharding
            assert x.sharding.is_equivalent_to(want, x.ndim), (k, x.sharding, want)
    """
)

SCRIPT = PRELUDE + textwrap.dedent(
    """
    split = lambda k: NamedSharding(mesh, P("fsdp"))
    placements = {
        "device 3 of 8": lambda k: jax.devices()[3],
        "fsdp": split,
        "replicated": lambda k: NamedSharding(mesh, P()),
    }
    for name, where in placements.items():
        for opt in (eqxopt.AdamW(1e-2, weight_decay=0.1),
                    eqxopt.SGD(1e-2, momentum=0.9)):
            what = (name, type(opt).__name__)
            params = place(host, where)
            state = opt.init(params)
            grads = place(host_grads[0], where)
            text = compiled_step(opt, grads, state, params)
            assert "eqxopt_elementwise" in text, what
            assert not [op for op in COLLECTIVES if op in text], what
            # In place: no array copied (a scalar may be: `eqx.filter_jit`'s
            # int32 marker output takes the step counter's buffer).
            copies = re.findall(r"= (\\S+) copy\\(", text)
            assert all(shape.endswith("[]") for shape in copies), (what, copies)
            native = run(opt, where, True)
            xla = run(opt, where, False)
            assert_trees_close(native, xla, rtol=2e-5, atol=2e-6)
            assert_moved(host, native[0], rtol=2e-5, atol=2e-6)
            same_sharding(native[0], params)
            for moment in jax.tree.leaves(native[1]):
                if moment.ndim:
                    ref = params["big" if moment.size > 2000 else
                                 "w" if moment.ndim == 2 else "b"]
                    assert moment.sharding.is_equivalent_to(ref.sharding, 2), what

    # Inside a user's own donating jit, parameters on one device of several.
    opt = eqxopt.AdamW(1e-2)
    one = lambda k: jax.devices()[3]
    params, grads = place(host, one), place(host_grads[0], one)
    state = opt.init(params)
    step = jax.jit(lambda g, s, p: opt.step(g, s, p, donate=True),
                   donate_argnums=(1, 2))
    assert "eqxopt_elementwise" in step.lower(grads, state, params).compile().as_text()

    # Mixed placements keep XLA's code (and its numbers): moments split where the
    # parameters are replicated, gradients split where the parameters are
    # replicated. (Where XLA's step puts such moments is the state sharding's
    # business, not the kernels'.)
    replicated = lambda k: NamedSharding(mesh, P())
    params = place(host, replicated)
    state = opt.init(params)
    state = jax.tree.map(
        lambda x: jax.device_put(x, split(None)) if x.ndim else x, state)
    text = compiled_step(opt, place(host_grads[0], replicated), state, params)
    assert "eqxopt_elementwise" not in text
    moments_split = lambda s: jax.tree.map(
        lambda x: jax.device_put(x, split(None)) if x.ndim else x, s)
    mixed = run(opt, replicated, True, moments_split, in_place=False)
    assert_trees_close(mixed, run(opt, replicated, False, moments_split, False))
    text = compiled_step(opt, place(host_grads[0], split), opt.init(params), params)
    assert "eqxopt_elementwise" not in text
    print("NATIVE-SHARD-OK")
    """
)


@pytest.mark.needs_compiler
def test_native_kernels_run_on_one_device_of_eight_and_per_shard():
    assert "NATIVE-SHARD-OK" in run_on_8_devices(SCRIPT)


SLOW_SCRIPT = PRELUDE + textwrap.dedent(
    """
    from jax.sharding import AxisType

    # A mesh of Explicit axes (`jax.make_mesh`'s default): the specs are in the
    # arrays' types, so a user's own jit runs the kernels per shard too.
    explicit = jax.make_mesh((8,), ("fsdp",), axis_types=(AxisType.Explicit,))
    where = lambda k: NamedSharding(explicit, P("fsdp"))
    for opt in (
        eqxopt.AdamW(1e-2),
        eqxopt.Chain(eqxopt.ClipByGlobalNorm(1.0), eqxopt.AdamW(1e-2)),
        eqxopt.Lion(1e-3),
    ):
        params, grads = place(host, where), place(host_grads[0], where)
        state = opt.init(params)
        step = jax.jit(lambda g, s, p: opt.step(g, s, p, donate=True),
                       donate_argnums=(1, 2))
        text = step.lower(grads, state, params).compile().as_text()
        assert "eqxopt_elementwise" in text, type(opt).__name__
        # Only the global norm's sum crosses devices.
        assert "all-gather" not in text and "all-to-all" not in text
        native = run(opt, where, True)
        xla = run(opt, where, False)
        assert_trees_close(native, xla, rtol=2e-5, atol=2e-6)
        same_sharding(native[0], params)

    # A 2-D mesh, leaves split over one axis, both, or none.
    mesh2 = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    specs = {"w": P("data", "model"), "b": P("model"), "big": P(None, "data")}
    where = lambda k: NamedSharding(mesh2, specs[k])
    opt = eqxopt.Adam(1e-2)
    params = place(host, where)
    text = compiled_step(opt, place(host_grads[0], where), opt.init(params), params)
    assert "eqxopt_elementwise" in text
    assert not [op for op in COLLECTIVES if op in text]
    native = run(opt, where, True)
    xla = run(opt, where, False)
    assert_trees_close(native, xla, rtol=2e-5, atol=2e-6)
    same_sharding(native[0], params)

    # `update(..., donate=True)` runs them per shard too.
    opt = eqxopt.Lion(1e-3, weight_decay=0.1)
    split = lambda k: NamedSharding(mesh, P("fsdp"))

    def run_update(native):
        eqxopt.set_native_kernels(native)
        try:
            params = place(host, split)
            state = opt.init(params)
            for g in host_grads:
                updates, state = opt.update(place(g, split), state, params, donate=True)
                params = eqxopt.apply_updates(params, updates)
            return params, state, updates
        finally:
            eqxopt.set_native_kernels(True)

    params = place(host, split)
    state = opt.init(params)
    grads = place(host_grads[0], split)
    text = opt.update.lower(grads, state, params, donate=True).compile().as_text()
    assert "eqxopt_elementwise" in text
    assert not [op for op in COLLECTIVES if op in text]
    native = run_update(True)
    assert_trees_close(native, run_update(False), rtol=2e-5, atol=2e-6)
    same_sharding(native[0], params)
    same_sharding(native[2], params)
    print("NATIVE-SHARD-SLOW-OK")
    """
)


@pytest.mark.slow
@pytest.mark.needs_compiler
def test_native_kernels_per_shard_on_explicit_and_2d_meshes():
    assert "NATIVE-SHARD-SLOW-OK" in run_on_8_devices(SLOW_SCRIPT)
