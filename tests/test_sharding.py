"""Sharded parameters keep their sharding in the state, the updates and the new
parameters, and no step gathers them. Runs in a subprocess with 8 host devices
(`XLA_FLAGS=--xla_force_host_platform_device_count=8` must be set before JAX starts)."""

import textwrap

import jax
import pytest

from catalog import all_cases, swept
from helpers import run_on_8_devices

SCRIPT = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import eqxopt

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
        # No collective (gather) in the compiled step, donated or not (compiled
        # through the public jit: the step inlined into a program of the user's).
        for donate in ((), (1, 2)):
            step = jax.jit(lambda g, s, p: opt.step(g, s, p), donate_argnums=donate)
            text = step.lower(grads, state, params).compile().as_text()
            for op in ("all-gather", "all-reduce", "all-to-all", "collective-permute"):
                assert op not in text, (type(opt).__name__, op)
            # A step into new buffers: XLA's own code (allocation-bound either way).
            assert "eqxopt_elementwise" not in text
        # A donated step runs the native kernels on each device's shards, with no
        # gather either (tests/test_native_shard.py checks the numbers).
        lowered = opt.step.lower(grads, state, params, donate=True)
        text = lowered.compile().as_text()
        for op in ("all-gather", "all-reduce", "all-to-all", "collective-permute"):
            assert op not in text, (type(opt).__name__, op, "donated")
        assert ("eqxopt_elementwise" in text) == eqxopt.native_kernels_available()
    print("SHARDING-OK")
    """
)


def test_sharded_params_keep_their_sharding_and_are_never_gathered():
    assert "SHARDING-OK" in run_on_8_devices(SCRIPT)


CATALOG_SCRIPT = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from catalog import all_cases

    jax.config.update("jax_platforms", "cpu")
    assert len(jax.devices()) == 8, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("fsdp",))
    # FSDP: a leaf whose leading dimension divides by 8 is split over the mesh along
    # it; the others are replicated.
    shapes = {
        "emb": (16, 6),
        "dense": {"w": (8, 16), "b": (16,), "v": (5, 8)},
        "layers": [{"w": (24, 24), "b": (3,)}, (8,)],
        "scale": (),
    }

    def spec(shape):
        return P("fsdp") if shape and shape[0] % 8 == 0 else P()

    rng = np.random.default_rng(0)
    is_shape = lambda x: isinstance(x, tuple) and all(isinstance(d, int) for d in x)
    params = jax.tree.map(
        lambda s: jax.device_put(
            jnp.asarray(rng.normal(size=s), jnp.float32),
            NamedSharding(mesh, spec(s)),
        ),
        shapes,
        is_leaf=is_shape,
    )
    targets = jax.tree.map(lambda p: 0.5 * p + 0.1, params)

    def loss_fn(params):
        return sum(
            jnp.sum((p - t) ** 2)
            for p, t in zip(jax.tree.leaves(params), jax.tree.leaves(targets))
        )

    param_paths = [
        (jax.tree_util.keystr(k), p) for k, p in jax.tree.leaves_with_path(params)
    ]

    def misplaced(tree, what):
        # A state leaf belongs to the parameter whose path ends its own
        # (`.mu['dense']['w']`, `.inner.acc['dense']['w']`).
        bad = []
        for k, x in jax.tree.leaves_with_path(tree):
            path = jax.tree_util.keystr(k)
            owners = [(q, p) for q, p in param_paths if path.endswith(q)]
            if not owners or not isinstance(x, jax.Array):
                continue
            q, p = max(owners, key=lambda o: len(o[0]))
            if x.shape == p.shape:
                want = p.sharding
            elif p.ndim and x.shape[1:] == p.shape:  # a stack (L-BFGS's memory)
                want = NamedSharding(mesh, P(None, *p.sharding.spec))
            else:
                continue
            if not x.sharding.is_equivalent_to(want, x.ndim):
                bad.append(f"{what}{path}: {x.sharding} (param {q}: {p.sharding})")
        return bad

    failures = []
    for case in all_cases():
        opt = case.make()
        extra = {} if case.extra is None else case.extra(loss_fn, params)
        state = opt.init(params)
        failures += [f"{case.name}: {b}" for b in misplaced(state, "init state")]
        grads = jax.grad(loss_fn)(params)
        new_params, new_state = opt.step(grads, state, params, **extra)
        failures += [f"{case.name}: {b}" for b in misplaced(new_state, "stepped state")]
        failures += [f"{case.name}: {b}" for b in misplaced(new_params, "params")]
    assert not failures, "\\n".join(failures)
    print("CATALOG-SHARDING-OK")
    """
)


@pytest.mark.slow
def test_every_state_leaf_shaped_like_a_parameter_takes_its_sharding():
    """For every catalog configuration, with FSDP-sharded parameters: each state leaf
    shaped like its parameter (or a stack of such, as L-BFGS's memory) is placed
    like it at `init` (not whole on one device, an out-of-memory for a model that
    only fits sharded) and after a step."""
    assert "CATALOG-SHARDING-OK" in run_on_8_devices(CATALOG_SCRIPT)


# The catalog on meshes of Explicit axes (`jax.make_mesh`'s default), where every
# array's type carries its sharding: ZeRO-1 (parameters replicated, the state split
# over "data" by `shard_state`) and FSDP (a leaf whose leading dimension divides by
# 8 split over "fsdp" along it, its state following it). `LAYOUTS` and `NAMES` (the
# catalog cases to run) are set by each test before the script.
EXPLICIT_SCRIPT = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    import eqxopt
    from catalog import all_cases
    from helpers import assert_trees_close

    assert len(jax.devices()) == 8, jax.devices()
    explicit = (AxisType.Explicit,)
    shapes = {
        "emb": (16, 6),
        "dense": {"w": (8, 16), "b": (16,), "v": (5, 8)},
        "layers": [{"w": (24, 24), "b": (3,)}, (8,)],
        "scale": (),
    }
    is_shape = lambda x: isinstance(x, tuple) and all(isinstance(d, int) for d in x)

    def placed_by(mesh, spec):
        return jax.tree.map(
            lambda s: NamedSharding(mesh, spec(s)), shapes, is_leaf=is_shape)

    zero1_mesh = jax.make_mesh((8,), ("data",), axis_types=explicit)
    fsdp_mesh = jax.make_mesh((8,), ("fsdp",), axis_types=explicit)
    layouts = {
        "ZeRO-1": (placed_by(zero1_mesh, lambda s: P()), zero1_mesh),
        "FSDP": (
            placed_by(fsdp_mesh, lambda s: P("fsdp") if s and s[0] % 8 == 0 else P()),
            None,
        ),
    }
    rng = np.random.default_rng(0)
    draw = lambda s: rng.normal(size=s).astype(np.float32)
    host = jax.tree.map(draw, shapes, is_leaf=is_shape)
    targets = jax.tree.map(lambda p: 0.5 * p + 0.1, host)
    # Each step's gradient is the loss's plus fresh noise, as from minibatches: with
    # the loss's alone, SOAP (whose first step only gathers statistics) sees the
    # same gradient twice and its statistics are singular, so rounding alone picks
    # part of its eigenbasis, and two runs on one device in another order differ.
    noise = [jax.tree.map(draw, shapes, is_leaf=is_shape) for _ in range(3)]

    @jax.jit
    def loss_fn(params):
        return sum(
            jnp.sum((p - t) ** 2)
            for p, t in zip(jax.tree.leaves(params), jax.tree.leaves(targets))
        )

    loss_grad = jax.jit(jax.grad(loss_fn))

    def train(case, where, zero1_mesh=None):
        # Three steps from `host`, every array put on `where` (shardings or a
        # device): the parameters after each step, and the state before and after.
        opt = case.make()
        params = jax.device_put(host, where)
        state = opt.init(params)
        if zero1_mesh is not None:
            state = eqxopt.shard_state(state, zero1_mesh, "data")
        start, history = state, []
        for n in noise:
            grads = jax.tree.map(jnp.add, loss_grad(params), jax.device_put(n, where))
            extra = {} if case.extra is None else case.extra(loss_fn, params)
            params, state = opt.step(grads, state, params, **extra)
            history.append(params)
        return history, start, state

    def same_placement(tree, like):
        bad = []
        for (path, x), y in zip(
            jax.tree.leaves_with_path(tree), jax.tree.leaves(like), strict=True
        ):
            want = getattr(y, "sharding", y)
            if not x.sharding.is_equivalent_to(want, x.ndim):
                bad.append(f"{jax.tree_util.keystr(path)}: {x.sharding.spec}")
        return bad

    failures = []
    one = jax.devices()[0]
    for case in all_cases():
        if case.name not in NAMES:
            continue
        expected, _, _ = train(case, one)
        for layout in LAYOUTS:
            shardings, zero1_mesh = layouts[layout]
            what = f"{case.name} ({layout})"
            try:
                history, start, end = train(case, shardings, zero1_mesh)
                for step, (a, e) in enumerate(zip(history, expected)):
                    try:
                        assert_trees_close(a, e)
                    except AssertionError as error:
                        raise AssertionError(f"step {step}: {error}") from None
                moved = same_placement(history[-1], shardings)
                moved += same_placement(end, start)
                assert not moved, f"placed otherwise: {moved}"
            except Exception as error:
                first = str(error).strip().splitlines()[0][:300]
                failures.append(f"{what}: {type(error).__name__}: {first}")
    assert not failures, "\\n".join(failures)
    print("EXPLICIT-MESH-OK")
    """
)

needs_explicit_axes = pytest.mark.skipif(
    not hasattr(jax.sharding, "AxisType"),
    reason="this JAX has no Explicit mesh axes (jax.sharding.AxisType, JAX >= 0.5)",
)
# The first case of each family and the smoke cases run in make test, the rest in
# make test-slow (`catalog.swept`).
FAST_NAMES = [p.id for p in swept(all_cases()) if not p.marks]
SLOW_NAMES = [p.id for p in swept(all_cases()) if p.marks]


def _explicit_script(names: list[str], layouts: tuple[str, ...]) -> str:
    return f"NAMES = {names!r}\nLAYOUTS = {layouts!r}\n" + EXPLICIT_SCRIPT


@needs_explicit_axes
def test_each_family_steps_on_explicit_meshes_as_on_one_device():
    """ZeRO-1 and FSDP on meshes of Explicit axes, the first configuration of each
    catalog family: three steps give the one-device parameters (the catalog's
    tolerance), and every parameter and state leaf keeps its placement."""
    out = run_on_8_devices(_explicit_script(FAST_NAMES, ("ZeRO-1", "FSDP")))
    assert "EXPLICIT-MESH-OK" in out


@pytest.mark.slow
@needs_explicit_axes
@pytest.mark.parametrize("layout", ["ZeRO-1", "FSDP"])
def test_every_case_steps_on_explicit_meshes_as_on_one_device(layout):
    """As above, for every other catalog configuration. With XLA's default code:
    SOAP's first eigenbasis comes from statistics of one gradient, whose zero
    eigenvalue repeats, so rounding picks part of it, and the sharded and the
    one-device programs agree where XLA rounds them alike, as its default code does
    here (the tests' fast code, without fused multiply-adds, does not)."""
    out = run_on_8_devices(_explicit_script(SLOW_NAMES, (layout,)), xla_defaults=True)
    assert "EXPLICIT-MESH-OK" in out


ADAFACTOR_SCRIPT = textwrap.dedent(
    """
    import re

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    import eqxopt
    from helpers import assert_trees_close

    assert len(jax.devices()) == 8, jax.devices()
    COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all",
                   "collective-permute")

    def count(text):
        return {op: len(re.findall(r"\\b%s(?:-start)?\\(" % op, text))
                for op in COLLECTIVES}

    rng = np.random.default_rng(0)
    host = {"w": rng.normal(size=(512, 512)).astype(np.float32),
            "b": rng.normal(size=(512,)).astype(np.float32)}
    host_grads = [jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32),
                               host) for _ in range(3)]
    specs = {"w": P("fsdp", None), "b": P("fsdp")}
    opt = eqxopt.Adafactor(1e-2)
    tx = optax.adafactor(1e-2)

    def optax_step(g, s, p):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    for kind in (AxisType.Explicit, AxisType.Auto):
        mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(kind,))
        put = lambda t: {k: jax.device_put(v, NamedSharding(mesh, specs[k]))
                         for k, v in t.items()}
        with jax.sharding.set_mesh(mesh):  # optax's init needs it on Explicit axes
            params, grads = put(host), [put(g) for g in host_grads]
            state, optax_state = opt.init(params), tx.init(params)
            ours = jax.jit(lambda g, s, p: opt.step(g, s, p))
            theirs = jax.jit(optax_step)
            found = {
                "eqxopt": count(ours.lower(grads[0], state, params).compile()
                                .as_text()),
                "optax": count(theirs.lower(grads[0], optax_state, params).compile()
                               .as_text()),
            }
            print(kind.name, found)
            assert found["eqxopt"]["all-gather"] <= found["optax"]["all-gather"], found
            p, q = params, params
            for g in grads:
                p, state = ours(g, state, p)
                q, optax_state = theirs(g, optax_state, q)
                assert_trees_close(p, q)
            # Each factored statistic keeps the split of the dimension it keeps.
            assert state.v_row["w"].sharding.spec == P("fsdp"), state.v_row["w"]
    print("ADAFACTOR-OK")
    """
)


@needs_explicit_axes
def test_adafactor_on_fsdp_parameters_gathers_no_more_than_optax():
    """Adafactor's compiled step on FSDP parameters (8 devices, Explicit and Auto
    axes) holds no more all-gathers than optax's (none: each factored statistic
    is split like the dimension of its parameter that it keeps), with optax's
    numbers."""
    out = run_on_8_devices(ADAFACTOR_SCRIPT)
    assert "ADAFACTOR-OK" in out, out
