"""ZeRO stage 1 (`eqxopt.shard_state`, `eqxopt.state_shardings`): parameters
replicated, optimizer state split over the "data" axis of 8 host devices. `update`,
`step` and donated steps return every parameter and state leaf with its own
sharding, the numbers of a one-device run (bit for bit for AdamW's and SGD's
`update`, as docs/distributed.md says for the rest), donation reuses the buffers
(no warning), and each device holds 1/8 of the state. Runs in a subprocess
(`XLA_FLAGS=--xla_force_host_platform_device_count=8` must be set before JAX
starts); the argument errors run here."""

import textwrap

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

import eqxopt
from helpers import run_on_8_devices
from sweep_cases import every_case

SCRIPT = textwrap.dedent(
    """
    import warnings

    # A donation JAX cannot use warns ("Some donated buffers were not usable"): fail.
    warnings.filterwarnings("error", message=".*donated buffers")

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import eqxopt

    assert len(jax.devices()) == 8, jax.devices()
    OLD_JAX = tuple(map(int, jax.__version__.split(".")[:2])) < (0, 5)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated = NamedSharding(mesh, P())
    rng = np.random.default_rng(0)
    # Leaves split along their first dimension that divides by 8 (w: 0, emb: 1),
    # one with none (odd: replicated) and a 0-d one.
    shapes = {"w": (16, 12), "emb": (5, 32), "b": (8,), "odd": (3, 5), "s": ()}
    host = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    params = jax.device_put(host, replicated)
    grads = [
        jax.device_put(
            {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()},
            replicated,
        )
        for _ in range(3)
    ]
    one = jax.devices()[0]

    def same_place(tree, want, what):
        for (path, x), w in zip(
            jax.tree.leaves_with_path(tree), jax.tree.leaves(want)
        ):
            assert x.sharding.is_equivalent_to(w.sharding, x.ndim), (
                what, jax.tree_util.keystr(path), x.sharding, w.sharding)

    def equal(a, b, what):
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=what)

    # The fused step (new parameters formed in the same pass) compiles per-device
    # loops of other shapes than on one device, and XLA may contract a multiply-add
    # differently there: a few elements of a leaf split along its minor dimension
    # come out an ulp or so apart (then carried by the state); quantized and
    # clipped states alike. AdamW's and SGD's `update` are bit for bit.
    def close(a, b, what):
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
            try:
                np.testing.assert_allclose(
                    np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)
            except AssertionError as error:
                raise AssertionError(what) from error

    def split_leaves(state):
        return [x for x in jax.tree.leaves(state) if "data" in str(x.sharding.spec)]

    optimizers = {
        "AdamW": eqxopt.AdamW(1e-2, weight_decay=0.1),
        "SGD-momentum": eqxopt.SGD(1e-2, momentum=0.9),
        "Chain(ClipByGlobalNorm, AdamW)": eqxopt.Chain(
            eqxopt.ClipByGlobalNorm(0.5), eqxopt.AdamW(1e-2)),
        "AdamW 8-bit": eqxopt.AdamW(1e-2, mu_dtype=eqxopt.Blockwise8bit(
            block_size=32, min_size=0), nu_dtype=jnp.bfloat16),
        "Adafactor": eqxopt.Adafactor(1e-2),
    }
    for name, opt in optimizers.items():
        if name not in NAMES:
            continue
        state0 = eqxopt.shard_state(opt.init(params), mesh, "data")
        assert split_leaves(state0), (name, "nothing split")
        for x in jax.tree.leaves(state0):  # every leaf on the mesh, 0-d included
            assert isinstance(x.sharding, NamedSharding), (name, x.sharding)
        # The state built sharded from the start: the same placement and values
        # (on Auto axes `jax.eval_shape` records no sharding: from the state).
        shardings = eqxopt.state_shardings(opt.init(params), mesh, "data")
        built = jax.jit(lambda p: opt.init(p), out_shardings=shardings)(params)
        same_place(built, state0, (name, "jit init"))
        equal(built, state0, (name, "jit init"))

        # The references: the same calls on one device.
        def reference(kind):
            p = jax.device_put(jax.tree.map(np.copy, host), one)
            s = opt.init(p)
            out = []
            for g in grads:
                g = jax.device_put(g, one)
                if kind == "update":
                    u, s = opt.update(g, s, p)
                    p = eqxopt.apply_updates(p, u)
                else:
                    p, s = opt.step(g, s, p, donate=kind == "donated")
                out.append(jax.tree.map(np.asarray, p))  # before it is donated
            return out

        ref = {k: reference(k) for k in ("update", "step", "donated")}
        p, s = params, state0
        for i, g in enumerate(grads):  # update + apply_updates
            u, s = opt.update(g, s, p)
            same_place(u, params, (name, "updates"))
            same_place(s, state0, (name, "update state"))
            p = eqxopt.apply_updates(p, u)
            exact = name in ("AdamW", "SGD-momentum")
            (equal if exact else close)(p, ref["update"][i], (name, "update", i))
        p, s = params, state0
        for i, g in enumerate(grads):
            p, s = opt.step(g, s, p)
            same_place(p, params, (name, "step params"))
            same_place(s, state0, (name, "step state"))
            close(p, ref["step"][i], (name, "step", i))
        p = jax.tree.map(jnp.copy, params)
        s = jax.tree.map(jnp.copy, state0)
        for i, g in enumerate(grads):
            old = jax.tree.leaves((p, s))
            p, s = opt.step(g, s, p, donate=True)
            # The buffers were taken (no copy, no warning: warnings are errors),
            # but for leaves the step passes through as they are and 0-d leaves it
            # only writes (the clip's last norm: JAX drops unread inputs).
            new = {id(x) for x in jax.tree.leaves((p, s))}
            kept = [x.shape for x in old
                    if x.ndim and not x.is_deleted() and id(x) not in new]
            # JAX 0.4.38 (the floor) reuses the state's buffers but not the
            # replicated parameters' (silently): only newer JAX is held to it.
            if OLD_JAX:
                kept = [k for k in kept if k not in shapes.values()]
            assert not kept, (name, "donation unused", kept)
            same_place(p, params, (name, "donated params"))
            same_place(s, state0, (name, "donated state"))
            close(p, ref["donated"][i], (name, "donated step", i))
        s = jax.tree.map(jnp.copy, state0)
        old = jax.tree.leaves(s)
        u, s = opt.update(grads[0], s, params, donate=True)
        new = {id(x) for x in jax.tree.leaves(s)}
        kept = [x.shape for x in old
                if x.ndim and not x.is_deleted() and id(x) not in new]
        assert not kept, (name, "donated update", kept)
        same_place(s, state0, (name, "donated update state"))
        same_place(u, params, (name, "donated update updates"))

    if not CHEAP:
        print("ZERO1-OK")
        raise SystemExit
    # State bytes per device: 1/8 of the replicated state (every leaf divides; the
    # 0-d step counter is the only replicated leaf).
    big = jax.device_put(
        {"w": jnp.ones((256, 64)), "v": jnp.ones((64, 128)), "b": jnp.ones((256,))},
        replicated)
    opt = eqxopt.AdamW(1e-3)
    full = opt.init(big)
    sharded = eqxopt.shard_state(full, mesh, "data")
    total = sum(x.nbytes for x in jax.tree.leaves(full))
    for d in jax.devices():
        here = sum(
            sh.data.nbytes
            for x in jax.tree.leaves(sharded)
            for sh in x.addressable_shards
            if sh.device == d
        )
        assert here / total <= 1 / 8 * 1.01, (d, here, total)
    # The same from XLA's memory analysis of the program creating the state.
    def out(sh):
        return jax.jit(lambda p: opt.init(p), out_shardings=sh).lower(big).compile()

    per_device = out(eqxopt.state_shardings(full, mesh, "data"))
    whole = out(jax.tree.map(lambda _: replicated, full))
    ratio = (per_device.memory_analysis().output_size_in_bytes
             / whole.memory_analysis().output_size_in_bytes)
    assert ratio <= 1 / 8 * 1.01, ratio
    print("RATIO", ratio)

    # A state that already follows FSDP-sharded parameters keeps that split and
    # adds "data" on another dimension.
    mesh2 = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    w = jax.device_put(jnp.ones((5, 8)), NamedSharding(mesh2, P(None, "model")))
    st = eqxopt.shard_state(eqxopt.AdamW(1e-3).init({"w": w}), mesh2, "data")
    assert st.mu["w"].sharding.spec == P(None, "model"), st.mu["w"].sharding  # 5 % 2
    w = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh2, P(None, "model")))
    st = eqxopt.shard_state(eqxopt.AdamW(1e-3).init({"w": w}), mesh2, "data")
    assert st.mu["w"].sharding.spec == P("data", "model"), st.mu["w"].sharding
    st = eqxopt.shard_state(
        eqxopt.AdamW(1e-3).init({"w": jnp.ones((16, 3))}), mesh2, ("data", "model"))
    assert st.mu["w"].sharding.spec[0] == ("data", "model"), st.mu["w"].sharding

    # Explicit axes (jax.make_mesh's default on new JAX): the same, from the types,
    # and the state can be built split from `jax.eval_shape` (README's recipe),
    # 8-bit moments included.
    if hasattr(jax.sharding, "AxisType"):
        mesh3 = jax.make_mesh((8,), ("data",),
                              axis_types=(jax.sharding.AxisType.Explicit,))
        rep3 = NamedSharding(mesh3, P())
        p3 = jax.device_put(host, rep3)
        g3 = jax.device_put(grads[0], rep3)
        q8 = eqxopt.Blockwise8bit(block_size=32, min_size=0)
        for opt in (eqxopt.AdamW(1e-2),
                    eqxopt.AdamW(1e-2, mu_dtype=q8, nu_dtype=q8)):
            s3 = eqxopt.shard_state(opt.init(p3), mesh3, "data")
            abstract = jax.eval_shape(opt.init, p3)
            shardings = eqxopt.state_shardings(abstract, mesh3, "data")
            built = jax.jit(lambda p: opt.init(p), out_shardings=shardings)(p3)
            same_place(built, s3, "explicit jit init")
            equal(built, s3, "explicit jit init")
            want = opt.step(
                jax.device_put(grads[0], one), opt.init(jax.device_put(host, one)),
                jax.device_put(host, one))[0]
            new_p, new_s = opt.step(g3, s3, p3)
            same_place(new_p, p3, "explicit params")
            same_place(new_s, s3, "explicit state")
            close(new_p, want, "explicit")
            # Inside the user's own jit, from the types alone.
            new_p, new_s = jax.jit(opt.step)(g3, s3, p3)
            same_place(new_p, p3, "explicit jit params")
            same_place(new_s, s3, "explicit jit state")
            new_p, new_s = opt.step(
                g3, built, jax.tree.map(jnp.copy, p3), donate=True)
            same_place(new_p, p3, "explicit donated params")
            same_place(new_s, s3, "explicit donated state")
            close(new_p, want, "explicit donated")
    print("ZERO1-OK")
    """
)


def _script(names: list[str], cheap: bool) -> str:
    return f"NAMES = {names!r}\nCHEAP = {cheap!r}\n" + SCRIPT


def test_zero1_state_sharded_params_kept_same_numbers_donated_one_eighth():
    out = run_on_8_devices(_script(["AdamW"], cheap=True))
    assert "ZERO1-OK" in out, out


@pytest.mark.slow
def test_zero1_sgd_chain_clip_quantized_and_factored_states():
    names = [
        "SGD-momentum",
        "Chain(ClipByGlobalNorm, AdamW)",
        "AdamW 8-bit",
        "Adafactor",
    ]
    out = run_on_8_devices(_script(names, cheap=False))
    assert "ZERO1-OK" in out, out


# docs/distributed.md's claim, measured: ZeRO-1 `update` against one device, 3
# updates, every case of `sweep_cases.every_case()` that names a transform, the
# largest difference in each leaf over that leaf's largest value.
AGREEMENT = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import eqxopt
    from sweep_cases import every_case, per_example, transforms_in

    mesh = Mesh(np.array(jax.devices()), ("data",))
    one = jax.devices()[0]
    rng = np.random.default_rng(0)
    shapes = {"w": (16, 12), "emb": (5, 32), "b": (8,), "odd": (3, 5), "s": ()}
    host = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}

    def loss(params):
        leaves = jax.tree.leaves(params)
        return sum(jnp.sum((p - 0.3) ** 2 + 0.1 * p**4) for p in leaves)

    def run(opt, case, params, state):
        for _ in range(3):
            extra = {} if case.extra is None else case.extra(loss, params)
            grads = per_example(case, jax.grad(loss)(params))
            updates, state = opt.update(grads, state, params, **extra)
            params = eqxopt.apply_updates(params, updates)
        return params

    for case in every_case():
        if NAMES is not None and case.name not in NAMES:
            continue
        opt = case.make()
        kinds = {t.reduction() for t in transforms_in(opt)}
        p1 = jax.device_put(host, one)
        want = run(opt, case, p1, opt.init(p1))
        p8 = jax.device_put(host, NamedSharding(mesh, P()))
        got = run(opt, case, p8, eqxopt.shard_state(opt.init(p8), mesh, "data"))
        worst = max(
            float(np.max(np.abs(np.asarray(x) - np.asarray(y)), initial=0.0))
            / max(float(np.max(np.abs(np.asarray(y)), initial=0.0)), 1e-30)
            for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
        )
        kind = "elementwise" if kinds == {"nothing"} else "reduces"
        print("CASE", case.name, kind, repr(worst), flush=True)
    """
)


def _agreement(names: list[str] | None) -> dict[str, tuple[str, float]]:
    out = run_on_8_devices(f"NAMES = {names!r}\n" + AGREEMENT, xla_defaults=True)
    found = {}
    for line in out.splitlines():
        if line.startswith("CASE "):
            _, name, kind, worst = line.split()
            found[name] = (kind, float(worst))
    return found


def _check_agreement(found: dict[str, tuple[str, float]]) -> None:
    # docs/distributed.md: element-wise maths within 1e-7 of each leaf's largest
    # value (bit for bit for most), maths with reductions within 5e-7, but SOAP.
    for name, (kind, worst) in found.items():
        if name.startswith("SOAP"):
            continue
        bound = 1e-7 if kind == "elementwise" else 5e-7
        assert worst <= bound, (name, kind, worst)


def test_zero1_update_agrees_with_one_device_as_the_docs_say():
    # Issue 39, item 7: the page said "bit for bit" for every optimizer. Adan is
    # element-wise and an ulp off; LAMB reduces over each leaf.
    found = _agreement(["AdamW", "SGD-momentum", "Adan", "LAMB"])
    assert set(found) == {"AdamW", "SGD-momentum", "Adan", "LAMB"}
    assert found["AdamW"][1] == found["SGD-momentum"][1] == 0.0
    assert found["Adan"][0] == "elementwise" and found["LAMB"][0] == "reduces"
    _check_agreement(found)


@pytest.mark.slow
def test_zero1_update_agrees_with_one_device_for_every_case():
    found = _agreement(None)
    assert len(found) == len(every_case())
    exact = [n for n, (kind, worst) in found.items() if kind == "elementwise"]
    assert sum(found[n][1] == 0.0 for n in exact) > len(exact) / 2  # "most"
    _check_agreement(found)


def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()[:1]), ("data",))


def test_shard_state_rejects_an_axis_not_on_the_mesh():
    state = eqxopt.AdamW(1e-3).init({"w": jax.numpy.ones(4)})
    with pytest.raises(ValueError, match=r"axis 'batch' is not an axis of the mesh"):
        eqxopt.shard_state(state, _mesh(), "batch")
    with pytest.raises(ValueError, match=r"axis names a mesh axis twice"):
        eqxopt.state_shardings(state, _mesh(), ("data", "data"))


def test_shard_state_rejects_a_mesh_or_axis_of_the_wrong_kind():
    state = eqxopt.AdamW(1e-3).init({"w": jax.numpy.ones(4)})
    sharding = jax.sharding.NamedSharding(_mesh(), jax.sharding.PartitionSpec())
    with pytest.raises(TypeError, match=r"mesh must be a jax.sharding.Mesh, got Named"):
        eqxopt.shard_state(state, sharding, "data")  # pyright: ignore
    for axis in (0, (), ["data"]):
        with pytest.raises(TypeError, match=r"axis must be a mesh axis name or"):
            eqxopt.state_shardings(state, _mesh(), axis)  # pyright: ignore


def test_shard_state_on_one_device_changes_nothing_but_placement():
    params = {"w": jax.numpy.ones((4, 2)), "n": 3}
    opt = eqxopt.AdamW(1e-3)
    state = eqxopt.shard_state(opt.init(params), _mesh(), "data")
    assert state.mu["w"].sharding.spec[0] == "data"
    new_params, _ = opt.step({"w": jax.numpy.ones((4, 2)), "n": None}, state, params)
    assert new_params["n"] == 3


def test_state_shardings_refuses_an_abstract_state_that_records_no_sharding():
    # `jax.eval_shape` on Auto axes (or off any mesh) records no sharding: nothing
    # tells a state that follows FSDP-sharded parameters from a replicated one.
    params = {"w": jax.numpy.ones((8, 16)), "n": 3}
    abstract = jax.eval_shape(eqxopt.AdamW(1e-3).init, params)
    with pytest.raises(
        ValueError,
        match=r"state\.mu\['w'\] is a jax\.ShapeDtypeStruct with no sharding on the "
        r"mesh.*on Auto axes pass the state itself \(opt\.init\(params\)\)",
    ):
        eqxopt.state_shardings(abstract, _mesh(), "data")


@pytest.mark.skipif(
    not hasattr(jax.sharding, "AxisType"),
    reason="this JAX has no Explicit mesh axes (jax.sharding.AxisType, JAX >= 0.5)",
)
def test_abstract_state_on_explicit_axes_is_placed_as_the_state_itself():
    """`state_shardings(jax.eval_shape(opt.init, params), ...)` with FSDP-sharded
    parameters on Explicit axes keeps their split (`P('fsdp', 'data')`, not
    `P('data', None)`): the same shardings as from the state itself, for moments,
    8-bit blocks and factored statistics alike."""
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    devices = np.array(jax.devices()[:1]).reshape(1, 1)
    mesh = Mesh(devices, ("fsdp", "data"), axis_types=(AxisType.Explicit,) * 2)
    params = {
        "w": jax.device_put(jax.numpy.ones((32, 16)), NamedSharding(mesh, P("fsdp"))),
        "r": jax.device_put(jax.numpy.ones((8, 16)), NamedSharding(mesh, P())),
        "b": jax.device_put(jax.numpy.ones((16,)), NamedSharding(mesh, P("fsdp"))),
    }
    q8 = eqxopt.Blockwise8bit(block_size=32, min_size=0)
    optimizers = (
        eqxopt.AdamW(1e-3),
        eqxopt.AdamW(1e-3, mu_dtype=q8, nu_dtype=q8),
        eqxopt.Adafactor(1e-3, min_dim_size_to_factor=8),
    )
    for opt in optimizers:
        abstract = eqxopt.state_shardings(jax.eval_shape(opt.init, params), mesh)
        concrete = eqxopt.state_shardings(opt.init(params), mesh)
        for (path, a), c in zip(
            jax.tree.leaves_with_path(abstract), jax.tree.leaves(concrete), strict=True
        ):
            where = (type(opt).__name__, jax.tree_util.keystr(path))
            assert a.spec == c.spec, (*where, a.spec, c.spec)
        if isinstance(opt, eqxopt.Adafactor):
            # w's statistic over its columns keeps its rows' split.
            assert abstract.v_col["w"].spec == P("fsdp"), abstract.v_col["w"]
        else:
            mu_w = abstract.mu["w"]
            codes = mu_w.codes if isinstance(mu_w, eqxopt.QuantizedArray) else mu_w
            assert codes.spec == P("fsdp", "data"), codes.spec
