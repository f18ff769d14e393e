"""Quantized optimizer state on FSDP-sharded parameters (8 host devices, in a
subprocess): each leaf split along its leading dimension into shards whose element
count divides by the block size gets its `codes`/`absmax` split over the same mesh
axis (no block straddles two shards), a compiled step holds no collective, and the
numbers equal the single-device run's bit for bit (the leaves whose blocks are
whole per shard; the others to one float32 rounding), a NaN or infinite gradient
element included."""

import textwrap

from helpers import run_on_8_devices

SCRIPT = textwrap.dedent(
    """
    import re
    import jax, jax.numpy as jnp, numpy as np, eqxopt
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from helpers import assert_moved

    mesh = Mesh(np.array(jax.devices()), ("fsdp",))
    rng = np.random.default_rng(0)
    # w, e: split (shards of 1024 and 1536 elements: whole 256-blocks); r: split,
    # but its shards (16 * 20 = 320) cut blocks, so its state stays replicated;
    # b: under min_size (float32 state).
    shapes = {"w": (64, 128), "e": (128, 96), "r": (128, 20), "b": (40,)}
    split = {"w": True, "e": True, "r": True, "b": False}
    params = {k: jnp.asarray(rng.normal(size=s), jnp.float32)
              for k, s in shapes.items()}
    grads = [{k: jnp.asarray(rng.normal(size=s), jnp.float32)
              for k, s in shapes.items()} for _ in range(5)]
    # A NaN and an infinity among the gradients: stored as 0 on every path, so the
    # sharded run still equals the single-device one, and only their own
    # parameters turn NaN.
    grads[1]["w"] = grads[1]["w"].at[3, 5].set(jnp.nan)
    grads[2]["e"] = grads[2]["e"].at[70, 1].set(jnp.inf)
    sh = {k: NamedSharding(mesh, P("fsdp") if split[k] else P()) for k in shapes}
    row = NamedSharding(mesh, P("fsdp"))

    for storage in (eqxopt.Blockwise8bit(min_size=1024),
                    eqxopt.Blockwise4bit(min_size=1024),
                    eqxopt.BlockwiseFp8(min_size=1024)):
        opt = eqxopt.AdamW(1e-2, mu_dtype=storage, nu_dtype=storage)

        def train(params, grads, donate):
            state = opt.init(params)
            for g in grads:
                params, state = opt.step(g, state, params, donate=donate)
            return params, state

        single, single_state = train(params, grads, False)
        assert_moved(params, single, 0.0, 1e-4)  # compared exactly below
        sp = jax.device_put(jax.tree.map(np.asarray, params), sh)  # own buffers
        sg = [jax.device_put(jax.tree.map(np.asarray, g), sh) for g in grads]
        state = opt.init(sp)
        for k in ("w", "e"):
            for q in (state.mu[k], state.nu[k]):
                assert q.codes.sharding.is_equivalent_to(row, 2), q.codes.sharding
                assert q.absmax.sharding.is_equivalent_to(row, 1), q.absmax.sharding
        assert state.mu["r"].codes.sharding.is_fully_replicated
        # No collective where every split leaf's blocks are whole per shard ("r"
        # needs its moments gathered: its shards cut blocks).
        sub = lambda t: {k: t[k] for k in ("w", "e", "b")}
        hlo = jax.jit(lambda g, s, p: opt.update(g, s, p)).lower(
            sub(sg[0]), opt.init(sub(sp)), sub(sp)).compile().as_text()
        found = re.findall(r"all-gather|all-reduce|collective-permute|all-to-all",
                           hlo)
        assert not found, found
        out, out_state = train(sp, sg, True)
        for k in shapes:
            a, b = np.asarray(out[k]), np.asarray(single[k])
            if k in ("b", "r"):  # another fusion: one float32 rounding apart
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
            else:
                np.testing.assert_array_equal(a, b)
            assert out[k].sharding.is_equivalent_to(sh[k], a.ndim)
        for k in ("w", "e"):
            q, q1 = out_state.mu[k], single_state.mu[k]
            np.testing.assert_array_equal(np.asarray(q.codes), np.asarray(q1.codes))
            assert q.codes.sharding.is_equivalent_to(row, 2), q.codes.sharding
            for moment in (q, out_state.nu[k]):
                assert np.all(np.isfinite(np.asarray(moment.absmax))), k
        assert [int(np.isnan(np.asarray(out[k])).sum()) for k in shapes] == [
            1, 1, 0, 0], type(storage).__name__
        print("ok", type(storage).__name__)
    print("QUANTIZED-SHARDED-OK")
    """
)


def test_quantized_state_is_placed_like_fsdp_params_and_steps_without_gathers():
    # Bit-for-bit equality of two programs is a claim about XLA's default code.
    out = run_on_8_devices(SCRIPT, xla_defaults=True)
    assert "QUANTIZED-SHARDED-OK" in out, out
