"""Muon on meshes: FSDP-sharded matrices on Explicit and Auto mesh axes give the
single-device numbers, keep their shardings, and are gathered at most once a step
(a matrix split along its long dimension, not at all); inside `shard_map` with
`axis_name`, rows split over the axis give the single-device numbers too. Runs in a
subprocess with 8 host devices (the count must be set before JAX starts)."""

import textwrap

import jax
import pytest

from helpers import run_on_8_devices

SCRIPT = textwrap.dedent(
    """
    import re

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    import eqxopt

    assert len(jax.devices()) == 8, jax.devices()
    NS_STEPS = 5
    # name: (shape, spec on the 1-D "f" mesh, spec on the 2-D ("d", "m") mesh).
    # With 5 Newton-Schulz steps a matrix stays split when its long side exceeds
    # 10 times its short one ("long"); the others are gathered once.
    LEAVES = {
        "emb": ((64, 16), P("f", None), P("d", "m")),
        "up": ((32, 64), P("f", None), P("m", "d")),
        "long": ((16, 256), P(None, "f"), P("m", "d")),
        "stack": ((8, 16, 24), P("f", None, None), P("d", None, "m")),
        "bias": ((32,), P("f"), P("d")),
        "scale": ((), P(), P()),
    }

    def gathered_elements(shape, spec, mesh):
        # What gathering this leaf's matrices once moves into each device: its
        # local size times (the shards of its matrix dimensions, less the dimension
        # that stays split) minus one; nothing for a matrix whole on each device.
        if len(shape) < 2:
            return 0
        spec = tuple(spec) + (None,) * (len(shape) - len(spec))
        ways = [int(np.prod([mesh.shape[a] for a in
                             (s if isinstance(s, tuple) else (s,))])) if s else 1
                for s in spec]
        local = int(np.prod(shape)) // int(np.prod(ways))
        m, n = shape[-2:]
        keep = max(m, n) > 2 * NS_STEPS * min(m, n)
        summed = -1 if m <= n else -2
        grown = [w for i, w in enumerate(ways[-2:], -2) if not (keep and i == summed)]
        factor = int(np.prod(grown))
        return local * (factor - 1)

    def size(dims):
        return int(np.prod([int(d) for d in dims.split(",") if d]))

    def collectives(text):
        # {op: [(result dims, operand dims)]}, from lines such as
        # "%all-gather = f32[64,16]{1,0} all-gather(%param), ..." (a combined op has
        # a tuple of results and several operands) and the operands' own
        # "%param = f32[8,16]{1,0} ...".
        dims = dict(re.findall(r"(%\\S+) = \\w+\\[([\\d,]*)\\]", text))
        found = {}
        for op in ("all-gather", "all-reduce", "reduce-scatter", "all-to-all",
                   "collective-permute"):
            found[op] = []
            pattern = r"= (\\(.*?\\)|\\S+) " + op + r"(?:-start)?\\(([^)]*)\\)"
            for results, args in re.findall(pattern, text):
                outs = re.findall(r"\\w+\\[([\\d,]*)\\]", results)
                ins = [dims.get(a.strip(), "") for a in args.split(",")]
                found[op] += list(zip(outs, ins))
        return found

    rng = np.random.default_rng(0)
    host = {k: rng.normal(size=s).astype(np.float32) for k, (s, _, _) in LEAVES.items()}
    grads_host = [
        {k: rng.normal(size=s).astype(np.float32) for k, (s, _, _) in LEAVES.items()}
        for _ in range(3)
    ]
    muon_mask = {k: len(s) >= 2 for k, (s, _, _) in LEAVES.items()}
    opt = eqxopt.Muon(0.05, weight_decay=0.1, muon_mask=muon_mask,
                      ns_steps=NS_STEPS, adam_learning_rate=0.01)

    one = jax.devices()[0]
    ref_params = jax.device_put(host, one)
    ref_state = opt.init(ref_params)
    for g in grads_host:
        ref_params, ref_state = opt.step(jax.device_put(g, one), ref_state, ref_params)

    MESHES = {meshes}
    for kind in (AxisType.Explicit, AxisType.Auto):
        for shape, names, which in MESHES:
            mesh = jax.make_mesh(shape, names, axis_types=(kind,) * len(names))
            label = f"{kind.name} {shape}"
            sh = {k: NamedSharding(mesh, v[which]) for k, v in LEAVES.items()}
            params = {k: jax.device_put(host[k], sh[k]) for k in host}
            state = opt.init(params)
            step = jax.jit(lambda g, s, p: opt.step(g, s, p), donate_argnums=(1, 2))
            for i, g in enumerate(grads_host):
                g = {k: jax.device_put(g[k], sh[k]) for k in g}
                if i == 0:
                    compiled = step.lower(g, state, params).compile()
                    text = compiled.as_text()
                if i == 2 and kind == AxisType.Explicit:  # the eager entry, donated
                    params, state = opt.step(g, state, params, donate=True)
                else:
                    params, state = compiled(g, state, params)
            for tree, ref, what in ((params, ref_params, "params"),
                                    (state.mu, ref_state.mu, "mu"),
                                    (state.nu, ref_state.nu, "nu")):
                for k, x in tree.items():
                    if x is None:
                        continue
                    assert x.sharding.is_equivalent_to(sh[k], x.ndim), (
                        label, what, k, x.sharding, sh[k])
                    np.testing.assert_allclose(
                        np.asarray(x), np.asarray(ref[k]), rtol=2e-5, atol=2e-6,
                        err_msg=f"{label} {what} {k}")
            found = collectives(text)
            moved = sum(size(out) - size(arg) for out, arg in found["all-gather"])
            bound = sum(gathered_elements(s, LEAVES[k][which], mesh)
                        for k, (s, _, _) in LEAVES.items())
            assert 0 < moved <= bound, (label, moved, bound, found["all-gather"])
            # At most one gather per mesh axis splitting a matrix, and each step's
            # Gram matrix of the split "long" leaf all-reduced, never the leaf.
            axes = sum(len([s for s in LEAVES[k][which][-2:] if s])
                       for k in ("emb", "up", "long", "stack"))
            assert len(found["all-gather"]) <= axes, (label, found["all-gather"])
            for op in ("reduce-scatter", "all-to-all", "collective-permute"):
                assert not found[op], (label, op, found[op])
            # All-reduced: norms (one per matrix) and the 16 x 16 Gram matrices.
            for dims, _ in found["all-reduce"]:
                assert size(dims) <= 8 or dims == "16,16", (label, found["all-reduce"])
            print(label, {op: len(v) for op, v in found.items()}, moved, bound)
    if MESHES == [((8,), ("f",), 1)]:
        # Inside shard_map with axis_name: each shard holds rows of every matrix
        # ("tall" stays split: 256 > 10 * 16; the others are gathered once).
        mesh = jax.make_mesh((8,), ("f",))
        shapes = {"wide": (64, 16), "tall": (256, 16), "short": (16, 64), "b": (32,)}
        host = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
        gs = [{k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
              for _ in range(3)]
        # The options that read the Gram matrix (AOL, the spectral norm, Gram
        # Newton-Schulz, the adaptive dual norm) sum it over the axis too; the split
        # sums the Gram matrix in another order, which float32 Gram Newton-Schulz
        # carries to a few 1e-6 on parameters of size ~1.
        for options in ({}, {"preconditioning": "aol", "gram_newton_schulz": True,
                             "adaptive": True}, {"preconditioning": "spectral"}):
            kw = dict(weight_decay=0.1, adam_learning_rate=0.01, **options)
            plain = eqxopt.Muon(0.05, **kw)
            ref_params = jax.device_put(host, one)
            ref_state = plain.init(ref_params)
            for g in gs:
                ref_params, ref_state = plain.step(
                    jax.device_put(g, one), ref_state, ref_params)
            opt = eqxopt.Muon(0.05, axis_name="f", **kw)
            spec = lambda t: jax.tree.map(lambda x: P() if x.ndim == 0 else P("f"), t)
            pspec, sspec = spec(host), spec(jax.eval_shape(opt.init, host))
            put = lambda t: jax.tree.map(
                lambda x, sp: jax.device_put(x, NamedSharding(mesh, sp)), t, pspec)
            init = jax.jit(jax.shard_map(
                opt.init, mesh=mesh, in_specs=(pspec,), out_specs=sspec))
            step = jax.jit(jax.shard_map(
                lambda g, s, p: opt.step(g, s, p), mesh=mesh,
                in_specs=(pspec, sspec, pspec), out_specs=(pspec, sspec)))
            params = put(host)
            state = init(params)
            for g in gs:
                params, state = step(put(g), state, params)
            for tree, ref, what in ((params, ref_params, "params"),
                                    (state.mu, ref_state.mu, "mu")):
                for k in shapes:
                    np.testing.assert_allclose(
                        np.asarray(tree[k]), np.asarray(ref[k]), rtol=2e-5,
                        atol=1e-5 if options else 2e-6,
                        err_msg=f"shard_map {options} {what} {k}")
        print("shard_map axis_name ok")

        # SOAP: a split matrix is gathered (its gradient, value and two moments,
        # once each, and twice in the rotated basis), and so are its split
        # preconditioner factors, inside the step only (docs/distributed.md,
        # "Preconditioners under FSDP"); numbers and shardings as on one device.
        soap = eqxopt.SOAP(1e-2, precondition_frequency=2)
        host = {"w": rng.normal(size=(32, 64)).astype(np.float32),
                "b": rng.normal(size=(64,)).astype(np.float32)}
        gs = [{k: rng.normal(size=v.shape).astype(np.float32)
               for k, v in host.items()} for _ in range(4)]
        ref_params = jax.device_put(host, one)
        ref_state = soap.init(ref_params)
        for g in gs:
            ref_params, ref_state = soap.step(
                jax.device_put(g, one), ref_state, ref_params)
        for kind, most in ((AxisType.Explicit, 6), (AxisType.Auto, 6)):
            mesh = jax.make_mesh((8,), ("f",), axis_types=(kind,))
            sh = {"w": NamedSharding(mesh, P("f", None)),
                  "b": NamedSharding(mesh, P("f"))}
            put = lambda t: {k: jax.device_put(v, sh[k]) for k, v in t.items()}
            params = put(host)
            state = soap.init(params)
            step = jax.jit(lambda g, s, p: soap.step(g, s, p))
            compiled = step.lower(put(gs[0]), state, params).compile()
            found = collectives(compiled.as_text())
            whole = [s for s in found["all-gather"] if s[0] == "32,64"]
            factors = [s for s in found["all-gather"] if s[0] != "32,64"]
            assert len(whole) <= most, (kind, found["all-gather"])
            assert all(s[0] in ("32,32", "64,32", "64,64") for s in factors), (
                kind, found["all-gather"])
            assert len(factors) <= 4, (kind, found["all-gather"])
            # Stepped through `soap.step`, which places every output like its
            # input (inside a user's jit on Auto axes that needs out_shardings).
            for g in gs:
                params, state = soap.step(put(g), state, params)
            for tree, ref, what in ((params, ref_params, "params"),
                                    (state.mu, ref_state.mu, "mu"),
                                    (state.nu, ref_state.nu, "nu")):
                for k, x in tree.items():
                    assert x.sharding.is_equivalent_to(sh[k], x.ndim), (
                        kind, what, k, x.sharding)
                    np.testing.assert_allclose(
                        np.asarray(x), np.asarray(ref[k]), rtol=2e-5, atol=2e-6,
                        err_msg=f"SOAP {kind.name} {what} {k}")
            print("SOAP", kind.name, {op: len(v) for op, v in found.items()})

        # KLShampoo, on SOAP's gathering: numbers and shardings as on one device.
        kl = eqxopt.KLShampoo(1e-2, precondition_frequency=2)
        ref_params = jax.device_put(host, one)
        ref_state = kl.init(ref_params)
        for g in gs:
            ref_params, ref_state = kl.step(
                jax.device_put(g, one), ref_state, ref_params)
        for kind in (AxisType.Explicit, AxisType.Auto):
            mesh = jax.make_mesh((8,), ("f",), axis_types=(kind,))
            sh = {"w": NamedSharding(mesh, P("f", None)),
                  "b": NamedSharding(mesh, P("f"))}
            put = lambda t: {k: jax.device_put(v, sh[k]) for k, v in t.items()}
            params = put(host)
            state = kl.init(params)
            for g in gs:
                params, state = kl.step(put(g), state, params)
            for tree, ref, what in ((params, ref_params, "params"),
                                    (state.mu, ref_state.mu, "mu")):
                for k, x in tree.items():
                    assert x.sharding.is_equivalent_to(sh[k], x.ndim), (
                        kind, what, k, x.sharding)
                    np.testing.assert_allclose(
                        np.asarray(x), np.asarray(ref[k]), rtol=2e-5, atol=2e-6,
                        err_msg=f"KLShampoo {kind.name} {what} {k}")
            print("KLShampoo", kind.name, "ok")
    print("MUON-MESH-OK")
    """
)
ONE_AXIS = [((8,), ("f",), 1)]
TWO_AXES = [((4, 2), ("d", "m"), 2)]


NO_AXIS_TYPES = pytest.mark.skipif(
    not hasattr(jax.sharding, "AxisType"),
    reason="mesh axis types (Explicit/Auto) and sharding in types appeared after "
    "JAX 0.4.38; there Muon leaves a mesh's matrices to the compiler",
)


@NO_AXIS_TYPES
def test_muon_fsdp_on_explicit_and_auto_meshes():
    out = run_on_8_devices(SCRIPT.replace("{meshes}", repr(ONE_AXIS)))
    assert "MUON-MESH-OK" in out, out


@NO_AXIS_TYPES
@pytest.mark.slow
def test_muon_on_two_axis_meshes():
    """Data x model meshes: matrices split along both dimensions."""
    out = run_on_8_devices(SCRIPT.replace("{meshes}", repr(TWO_AXES)))
    assert "MUON-MESH-OK" in out, out


@pytest.mark.parametrize("bad", [3, (), ("f", 2), ""])
def test_muon_axis_name_must_name_mesh_axes(bad):
    import eqxopt

    with pytest.raises(TypeError, match="axis_name must be None, a mesh axis name"):
        eqxopt.Muon(0.01, axis_name=bad)
