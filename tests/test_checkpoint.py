"""Checkpoints keep shardings: parameters, optimizer state and the optimizer saved
with orbax and with Equinox serialisation, restored into the shardings of
`opt.init(params)`, resume bit for bit. The 8-device checks run in a subprocess
(`XLA_FLAGS=--xla_force_host_platform_device_count=8` must be set before JAX
starts); a misplaced state leaf is named in the error."""

import textwrap

import pytest

from helpers import run_on_8_devices

# Shared by the 8-device script and the single-device test: a run of `opt` on
# `params` (placed by `place`), saved after `SAVE` steps and resumed for `MORE`.
COMMON = textwrap.dedent(
    """
    import pathlib
    import tempfile

    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np

    import eqxopt

    try:
        import orbax.checkpoint as ocp
    except ImportError:  # the checkpoint extra is not installed
        ocp = None

    SAVE, MORE = 3, 3
    SHAPES = {"w1": (16, 8), "w2": (8, 16), "b": (8,), "scale": (), "emb": (32, 4)}
    DTYPES = {"emb": jnp.bfloat16}

    def make_params(place):
        rng = np.random.default_rng(0)
        return {
            k: place(k, jnp.asarray(rng.normal(size=s), DTYPES.get(k, jnp.float32)))
            for k, s in SHAPES.items()
        }

    def grads_at(i, params):
        rng = np.random.default_rng(100 + i)
        return {
            k: jax.device_put(
                jnp.asarray(rng.normal(size=p.shape), p.dtype), p.sharding)
            for k, p in params.items()
        }

    # Every way of storing a moment. Blocks of 16 from 16 elements on: `w1` and
    # `emb` (128 elements, split in shards of 16 on the 8-device mesh) quantized
    # with their blocks split like them, `w2` (split along its second dimension)
    # quantized and replicated, `b` and `scale` kept in float32.
    STORAGES = {
        "float32": None,
        "bfloat16": jnp.bfloat16,
        "Blockwise8bit": eqxopt.Blockwise8bit(16, 16),
        "Blockwise4bit": eqxopt.Blockwise4bit(16, 16),
        "BlockwiseFp8": eqxopt.BlockwiseFp8(16, 16),
        "Companded8bit": eqxopt.Companded8bit(16, 16),
        # bf16 with an int8 residual, element-wise: sharded like the parameters
        "ErrorCorrectedBf16": eqxopt.ErrorCorrectedBf16(),
    }

    def optimizers():
        by_storage = {
            f"AdamW, {name} moments": eqxopt.AdamW(
                1e-2, weight_decay=0.1, mu_dtype=storage, nu_dtype=storage)
            for name, storage in STORAGES.items()
        }
        return {
            **by_storage,
            "MultiSteps(Chain(clip, scheduled AdamW))": eqxopt.MultiSteps(
                eqxopt.Chain(
                    eqxopt.ClipByGlobalNorm(1.0),
                    eqxopt.AdamW(eqxopt.WarmupCosine(1e-2, 0.0, 2, 20)),
                ),
                2,
            ),
        }

    def run(opt, params, state, start, stop):
        for i in range(start, stop):
            params, state = opt.step(grads_at(i, params), state, params)
        return params, state

    def assert_same(restored, saved, what):
        r_leaves, r_def = jax.tree.flatten(restored)
        s_leaves, s_def = jax.tree.flatten(saved)
        assert r_def == s_def, what
        for r, s in zip(r_leaves, s_leaves):
            assert r.sharding == s.sharding, (what, r.sharding, s.sharding)
            assert r.dtype == s.dtype, what
            np.testing.assert_array_equal(np.asarray(r), np.asarray(s), what)

    def check_resume(name, opt, place, directory):
        params0 = make_params(place)
        state0 = opt.init(params0)
        if "Blockwise" in name or "Companded" in name:  # the storage is in use
            assert isinstance(state0.mu["w1"], eqxopt.QuantizedArray), name
        params, state = run(opt, params0, state0, 0, SAVE)
        saved = (params, state)
        # The uninterrupted run.
        want = run(opt, params, state, SAVE, SAVE + MORE)
        assert not np.array_equal(
            np.asarray(want[0]["w1"]), np.asarray(params["w1"])), name
        # The template: what a restarted job has before it restores.
        template = (params0, state0)
        opt_arrays, opt_static = eqx.partition(opt, eqx.is_array)
        restored = {}
        path = pathlib.Path(tempfile.mkdtemp(dir=directory)) / "checkpoint"
        eqx.tree_serialise_leaves(path.with_suffix(".eqx"), (saved, opt_arrays))
        got, got_opt = eqx.tree_deserialise_leaves(
            path.with_suffix(".eqx"), (template, opt_arrays),
            filter_spec=eqxopt.sharded_deserialise_filter_spec)
        restored["equinox"] = (got, eqx.combine(got_opt, opt_static))
        if not any(x.committed for x in jax.tree.leaves(template)):
            # Nothing placed: Equinox's own filter restores it too.
            got, got_opt = eqx.tree_deserialise_leaves(
                path.with_suffix(".eqx"), (template, opt_arrays))
            restored["equinox default"] = (got, eqx.combine(got_opt, opt_static))
        # Into shapes and shardings alone (no arrays allocated for the template).
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
            template)
        got, _ = eqx.tree_deserialise_leaves(
            path.with_suffix(".eqx"), (abstract, opt_arrays),
            filter_spec=eqxopt.sharded_deserialise_filter_spec)
        assert_same(got, saved, f"{name} restored with equinox into shapes")
        if ocp is not None:
            # orbax restores every leaf committed: the optimizer's (uncommitted)
            # hyperparameters go replicated where the parameters are.
            where = params0["b"].sharding
            opt_template = jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=where),
                opt_arrays)
            with ocp.StandardCheckpointer() as checkpointer:
                checkpointer.save(
                    path.with_suffix(".orbax").absolute(), (saved, opt_arrays))
                checkpointer.wait_until_finished()
                got, got_opt = checkpointer.restore(
                    path.with_suffix(".orbax").absolute(),
                    (jax.tree.map(ocp.utils.to_shape_dtype_struct, template),
                     opt_template))
            restored["orbax"] = (got, eqx.combine(got_opt, opt_static))
        for how, (got, got_opt) in restored.items():
            what = f"{name} restored with {how}"
            assert_same(got, saved, what)
            # Every leaf where init put it: a restore into opt.init's shardings.
            for r, t in zip(jax.tree.leaves(got), jax.tree.leaves(template)):
                assert r.sharding == t.sharding, (what, r.sharding, t.sharding)
            assert_same(run(got_opt, *got, SAVE, SAVE + MORE), want, what)
        return sorted(restored)
    """
)

SCRIPT = COMMON + textwrap.dedent(
    """
    import re
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    assert len(jax.devices()) == 8, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("fsdp",))
    # FSDP: the large leaves split over the devices, the small ones replicated.
    SPECS = {"w1": P("fsdp"), "w2": P(None, "fsdp"), "b": P(), "scale": P(),
             "emb": P("fsdp")}

    def on_mesh(k, x):
        return jax.device_put(x, NamedSharding(mesh, SPECS[k]))

    with tempfile.TemporaryDirectory() as directory:
        for name, opt in optimizers().items():
            hows = check_resume(name, opt, on_mesh, directory)
            if "Blockwise" in name or "Companded" in name:  # codes split as params
                codes = opt.init(make_params(on_mesh)).mu["w1"].codes
                assert codes.sharding.spec == P("fsdp"), (name, codes.sharding)
            # Step counters and every other leaf no parameter shapes: replicated.
            state = opt.init(make_params(on_mesh))
            for x in jax.tree.leaves(state):
                if x.ndim == 0:
                    assert x.sharding == NamedSharding(mesh, P()), (name, x.sharding)
        print("resumed:", ",".join(hows))

    # A misplaced state leaf is named, with the fix.
    params = make_params(on_mesh)
    opt = eqxopt.AdamW(1e-2)
    state = opt.init(params)
    grads = grads_at(0, params)

    devices = jax.devices()

    def error_of(state):
        try:
            opt.step(grads, state, params)
        except ValueError as error:
            return str(error)
        raise AssertionError("no error")

    message = error_of(
        eqx.tree_at(lambda s: s.step, state, jax.device_put(state.step, devices[3])))
    assert re.search(
        r"^state\\.step \\(int32\\[\\]\\) is on device \\[3\\] but params\\['b'\\] is "
        r"on devices \\[0, 1, 2, 3, 4, 5, 6, 7\\]", message), message
    assert "NamedSharding(mesh, PartitionSpec())" in message, message
    assert "_Direct" not in message, message
    message = error_of(eqx.tree_at(
        lambda s: s.mu["w1"], state, jax.device_put(state.mu["w1"], jax.devices()[0])))
    assert message.startswith("state.mu['w1'] (float32[16, 8]) is on device [0]"), (
        message)
    # Parameters all on one device: state goes there; a leaf elsewhere is named.
    device = jax.devices()[2]
    params = make_params(lambda k, x: jax.device_put(x, device))
    state = opt.init(params)
    assert all(x.sharding.device_set == {device} for x in jax.tree.leaves(state))
    grads = grads_at(0, params)
    message = error_of(eqx.tree_at(
        lambda s: s.step, state, jax.device_put(state.step, jax.devices()[5])))
    assert message.startswith("state.step (int32[]) is on device [5] but params"), (
        message)
    assert "jax.device_put(x, device)" in message, message
    print("errors named")
    """
)


def test_sharded_checkpoints_resume_bit_for_bit():
    out = run_on_8_devices(SCRIPT)
    assert "errors named" in out, out
    pytest.importorskip("orbax.checkpoint")
    assert "resumed: equinox,orbax" in out, out


def test_single_device_checkpoints_resume_bit_for_bit(tmp_path):
    namespace: dict = {}
    exec(compile(COMMON, "COMMON", "exec"), namespace)
    default = namespace["jax"].devices()[0]
    for name, opt in namespace["optimizers"]().items():
        for place in (
            lambda k, x: x,
            lambda k, x: namespace["jax"].device_put(x, default),
        ):
            namespace["check_resume"](name, opt, place, tmp_path)
