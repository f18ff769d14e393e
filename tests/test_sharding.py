"""Sharded parameters keep their sharding in the state, the updates and the new
parameters, and no step gathers them. Runs in a subprocess with 8 host devices
(`XLA_FLAGS=--xla_force_host_platform_device_count=8` must be set before JAX starts)."""

import os
import pathlib
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import eqxopt
    from eqxopt import _base, _dispatch

    jax.config.update("jax_platforms", "cpu")
    assert len(jax.devices()) == 8, jax.devices()
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    shardings = {
        "w": NamedSharding(mesh, P("data", "model")),
        "b": NamedSharding(mesh, P("model")),
        "scale": NamedSharding(mesh, P()),
        "half": NamedSharding(mesh, P(None, "data")),
    }
    rng = np.random.default_rng(0)
    shapes = {"w": (16, 8), "b": (8,), "scale": (), "half": (6, 8)}
    dtypes = {"w": jnp.float32, "b": jnp.float32, "scale": jnp.float32,
              "half": jnp.bfloat16}
    params = {
        k: jax.device_put(jnp.asarray(rng.normal(size=s), dtypes[k]), shardings[k])
        for k, s in shapes.items()
    }
    grads = {k: jax.device_put(jnp.ones_like(v) * 0.1, shardings[k])
             for k, v in params.items()}
    grads["scale"] = None
    host = jax.tree.map(np.asarray, params)

    def check(tree, what):
        for k, x in tree.items():
            if x is None:
                continue
            assert x.sharding.is_equivalent_to(shardings[k], x.ndim), (
                what, k, x.sharding, shardings[k])

    for opt in (eqxopt.AdamW(1e-2, weight_decay=0.1, nu_dtype=jnp.float32),
                eqxopt.SGD(1e-2, momentum=0.9)):
        state = opt.init(params)
        moments = [getattr(state, f) for f in ("mu", "nu", "velocity")
                   if hasattr(state, f)]
        for m in moments:
            check(m, "init state")  # placed like its parameter from the start
        updates, state1 = opt.update(grads, state, params)
        check(updates, "updates")
        for f in ("mu", "nu", "velocity"):
            if hasattr(state1, f):
                check(getattr(state1, f), "update state")
        new_params, state2 = opt.step(grads, state, params)
        check(new_params, "step params")
        donated_in = jax.tree.map(lambda x: jnp.array(x, copy=True), params)
        donated_in = {k: jax.device_put(v, shardings[k]) for k, v in donated_in.items()}
        p3, state3 = opt.step(grads, opt.init(donated_in), donated_in, donate=True)
        check(p3, "donated step params")
        for f in ("mu", "nu", "velocity"):
            if hasattr(state3, f):
                check(getattr(state3, f), "donated step state")
        # Same numbers as on one device.
        one = jax.devices()[0]
        host_params = jax.device_put(host, one)
        host_grads = {k: None if g is None else jax.device_put(np.asarray(g), one)
                      for k, g in grads.items()}
        single = opt.step(host_grads, opt.init(host_params), host_params)
        for k in params:
            np.testing.assert_allclose(
                np.asarray(new_params[k], np.float32),
                np.asarray(single[0][k], np.float32), rtol=1e-6, atol=1e-6)
        # No collective (gather) in the compiled step, donated or not.
        for donate in ((), (2, 3)):
            entry = _base._step_entry_donated if donate else _base._step_entry
            text = _dispatch.lower(
                entry, (opt, grads, params, state, {}), donate
            ).compile().as_text()
            for op in ("all-gather", "all-reduce", "all-to-all", "collective-permute"):
                assert op not in text, (type(opt).__name__, op)
            # Several devices: XLA's own code, never the native custom call.
            assert "eqxopt_elementwise" not in text
    print("SHARDING-OK")
    """
)


def test_sharded_params_keep_their_sharding_and_are_never_gathered():
    root = pathlib.Path(__file__).resolve().parents[1]
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(root / "src"), str(root / "tests"), env.get("PYTHONPATH", "")]
    )
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SHARDING-OK" in done.stdout
