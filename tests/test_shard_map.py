"""Inside `jax.shard_map` with FSDP-sharded parameters and gradients (some leaves split
over the mesh axis, the others replicated across it): every transform that reduces
over parameters agrees with the unsharded run when given `axis_name` (and differs
from it without, so the comparison proves something), and every wrapper traces and
steps with sharded gradients. Runs in a subprocess with 8 host devices.

Tolerance: `rtol=1e-5, atol=1e-6` (float32 sums taken in another order: per device,
then across devices)."""

import textwrap

import jax
import jax.numpy as jnp
import pytest

import eqxopt
from eqxopt._core._jax_api import varying_axes
from helpers import run_on_8_devices

# Before JAX 0.6 values carry no varying-axes types: axis_name then sums every leaf
# over every named axis (documented), so replicated leaves count once per device
# and the FSDP comparisons here do not hold.
needs_types = pytest.mark.skipif(
    varying_axes(jnp.zeros(())) is None,
    reason="this JAX has no varying-axes types (jax.typeof(x).vma, JAX >= 0.6)",
)

# The script: `CHECKS` (the names of the agreement checks to run) and `WRAPPERS`
# (catalog case names, or "all") are set by each test before it.
SCRIPT = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, PartitionSpec as P

    import eqxopt
    from eqxopt._core._jax_api import shard_map, varying_axes
    from helpers import assert_moved, trained_by_update

    jax.config.update("jax_platforms", "cpu")
    assert len(jax.devices()) == 8, jax.devices()
    TYPED = varying_axes(jnp.zeros(())) is not None  # JAX types what varies
    mesh = Mesh(np.array(jax.devices()), ("fsdp",))
    A = "fsdp"
    RTOL, ATOL = 1e-5, 1e-6
    # FSDP: leaves whose leading dimension divides by 8 are split along it over the
    # mesh; the others are replicated.
    shapes = {"emb": (16, 12), "dense": {"w": (8, 16), "b": (16,), "v": (5, 8)},
              "scale": ()}
    is_shape = lambda x: isinstance(x, tuple) and all(isinstance(d, int) for d in x)
    split = lambda s: bool(s) and s[0] % 8 == 0
    specs = jax.tree.map(lambda s: P(A) if split(s) else P(), shapes,
                         is_leaf=is_shape)
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s), jnp.float32),
                          shapes, is_leaf=is_shape)
    STEPS = 4
    grads = [jax.tree.map(lambda p: jnp.asarray(3 * rng.normal(size=p.shape),
                                                jnp.float32), params)
             for _ in range(STEPS)]


    def run(opt, sharded, probe=lambda s: (), grads=grads, steps=STEPS, extra={}):
        # `steps` updates from `params`; the new params and `probe(state)`. Sharded:
        # inside shard_map, every output stacked per device (so that a value that
        # differs between devices comes back as it is, whatever its type).
        def train(params, grads):
            state = opt.init(params)
            for g in grads[:steps]:
                u, state = opt.update(g, state, params, **extra)
                params = eqxopt.apply_updates(params, u)
            return params, probe(state)

        if not sharded:
            return jax.jit(train)(params, grads)

        def stacked(params, grads):
            return jax.tree.map(lambda x: jnp.asarray(x)[None], train(params, grads))

        out_p, out_probe = jax.jit(shard_map(
            stacked, mesh=mesh, in_specs=(specs, [specs] * len(grads)),
            out_specs=P(A)))(params, grads)
        # Split leaves: the blocks in order; replicated ones: every device's copy.
        whole = jax.tree.map(
            lambda x, s: x.reshape(s) if split(s) else x, out_p, shapes,
            is_leaf=lambda x: is_shape(x) or isinstance(x, jax.Array))
        return whole, out_probe


    def difference(sharded, single):
        # The largest |sharded - single| over tolerance (replicated leaves: over
        # every device's copy).
        worst = 0.0
        for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(single)):
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
            b = np.broadcast_to(b, a.shape)
            worst = max(worst, float(np.max(np.abs(a - b) / (ATOL + RTOL * np.abs(b)))))
        return worst


    def agree(name, make, probe=lambda s: (), grads=grads, differs=True, extra={}):
        single = run(make(None), False, probe, grads, extra=extra)
        assert_moved((params, jax.tree.map(jnp.zeros_like, single[1])), single,
                     RTOL, ATOL)
        with_axis = difference(run(make(A), True, probe, grads, extra=extra), single)
        assert with_axis <= 1, (name, "with axis_name", with_axis)
        if differs:
            without = difference(run(make(None), True, probe, grads, extra=extra),
                                 single)
            assert without > 100, (name, "without axis_name", without)
        print("agrees", name, f"{with_axis:.3g}")


    sgd = lambda: eqxopt.SGD(0.1)
    # Half the steps' gradients are above it (unsharded), none of a device's blocks.
    median_sq = float(np.median(
        [sum(np.sum(np.asarray(x) ** 2) for x in jax.tree.leaves(g)) for g in grads]))
    CHECKS_ = {
        "ClipByGlobalNorm": lambda: agree(
            "ClipByGlobalNorm",
            lambda a: eqxopt.Chain(eqxopt.ClipByGlobalNorm(1.0, axis_name=a), sgd()),
            probe=lambda s: s.states[0].norm),
        "global_norm": lambda: agree(
            "global_norm", lambda a: eqxopt.Monitor(sgd(), axis_name=a),
            probe=lambda s: (s.grad_norm, s.update_norm)),
        "SkipNonFinite": check_skip_non_finite,
        "SkipLargeUpdates": lambda: agree(
            "SkipLargeUpdates",
            lambda a: eqxopt.SkipLargeUpdates(sgd(), median_sq, axis_name=a),
            probe=lambda s: (s.should_skip.astype(jnp.float32), s.norm_squared)),
        "LAMB": lambda: agree("LAMB", lambda a: eqxopt.LAMB(0.05, axis_name=a)),
        "LARS": lambda: agree(
            "LARS", lambda a: eqxopt.LARS(0.5, trust_coefficient=0.1, axis_name=a)),
        "Fromage": lambda: agree("Fromage", lambda a: eqxopt.Fromage(0.1, axis_name=a)),
        "NovoGrad": lambda: agree(
            "NovoGrad", lambda a: eqxopt.NovoGrad(0.1, axis_name=a)),
        "ScaleByTrustRatio": lambda: agree(
            "ScaleByTrustRatio",
            lambda a: eqxopt.Chain(eqxopt.ScaleByTrustRatio(axis_name=a), sgd())),
        "ClipByBlockRMS": lambda: agree(
            "ClipByBlockRMS",
            lambda a: eqxopt.Chain(eqxopt.ClipByBlockRMS(0.5, axis_name=a), sgd())),
        "AdaptiveGradClip": lambda: agree(
            "AdaptiveGradClip",
            lambda a: eqxopt.Chain(eqxopt.AdaptiveGradClip(0.05, axis_name=a), sgd())),
        "Adafactor": lambda: agree(
            "Adafactor",
            lambda a: eqxopt.Adafactor(0.05, min_dim_size_to_factor=4, axis_name=a)),
        "tuple-axes": check_two_axes,
        "tree_norm": check_tree_norm,
        "LBFGS": check_lbfgs,
        "DoG": lambda: agree("DoG", lambda a: eqxopt.DoG(init_value=0.1, axis_name=a)),
        "DoWG": lambda: agree(
            "DoWG", lambda a: eqxopt.DoWG(init_estim_sq_dist=1.0, axis_name=a)),
        "DAdaptAdamW": lambda: agree(
            "DAdaptAdamW", lambda a: eqxopt.DAdaptAdamW(d0=0.1, axis_name=a),
            probe=lambda s: (s.d, 1e6 * s.numerator)),  # the numerator is ~1e-6
        "DAdaptSGD": lambda: agree(
            "DAdaptSGD", lambda a: eqxopt.DAdaptSGD(d0=0.1, axis_name=a),
            probe=lambda s: (s.d, s.gsq_weighted)),
        # The loss value is the user's (a global one, the same on every device).
        "Momo": lambda: agree("Momo", lambda a: eqxopt.Momo(0.1, axis_name=a),
                              extra={"value": jnp.asarray(50.0)}),
        "MomoAdam": lambda: agree(
            "MomoAdam", lambda a: eqxopt.MomoAdam(0.1, axis_name=a),
            extra={"value": jnp.asarray(50.0)}),
        "Mechanic": lambda: agree(
            "Mechanic",
            lambda a: eqxopt.Mechanic(eqxopt.SGD(1.0), s_init=0.1, axis_name=a)),
        "Prodigy": lambda: agree(
            "Prodigy", lambda a: eqxopt.Prodigy(d0=1e-3, axis_name=a),
            probe=lambda s: (1e3 * s.d, 1e6 * s.numerator)),
        "PolyakSGD": lambda: agree(
            "PolyakSGD", lambda a: eqxopt.PolyakSGD(axis_name=a),
            extra={"value": jnp.asarray(50.0)}),
        # Without axis_name: each device's own SOAP on its blocks.
        "SOAP": lambda: agree(
            "SOAP",
            lambda a: eqxopt.SOAP(0.05, precondition_frequency=2, axis_name=a)),
        # KL-SOAP's eigenvalue floor above float32's rounding noise (SOAP's
        # docstring): the two runs sum in different orders.
        "SOAP-kl": lambda: agree(
            "SOAP-kl",
            lambda a: eqxopt.SOAP(0.05, eps=1e-3, precondition_frequency=2,
                                  factor_update="kl", axis_name=a)),
        "KLShampoo": lambda: agree(
            "KLShampoo",
            lambda a: eqxopt.KLShampoo(0.05, precondition_frequency=2,
                                       axis_name=a)),
    }
    """
)

# Checks that need more than `agree`, defined before CHECKS_ is built.
HELPERS = textwrap.dedent(
    """
    def check_skip_non_finite():
        # A NaN in one device's block of a split leaf at step 1, an inf in a
        # replicated leaf at step 3: with axis_name every device skips both.
        bad = [jax.tree.map(lambda g: g, g) for g in grads]
        bad[1]["emb"] = bad[1]["emb"].at[5, 3].set(jnp.nan)
        bad[3]["dense"]["b"] = bad[3]["dense"]["b"].at[0].set(jnp.inf)
        agree("SkipNonFinite",
              lambda a: eqxopt.SkipNonFinite(sgd(), 5, axis_name=a),
              probe=lambda s: (s.total_notfinite.astype(jnp.float32),), grads=bad,
              differs=False)
        # Without axis_name the devices without the NaN step: a different run.
        single = run(eqxopt.SkipNonFinite(sgd(), 5), False, grads=bad)
        without = run(eqxopt.SkipNonFinite(sgd(), 5), True, grads=bad)
        assert difference(without, single) > 100


    def check_tree_norm():
        # The functions: eqxopt.tree_norm (1, 2, inf) and eqxopt.global_norm.
        def norms(g, axis_name):
            return jnp.stack([eqxopt.tree_norm(g, o, axis_name=axis_name)
                              for o in (1, 2, "inf")]
                             + [eqxopt.global_norm(g, axis_name=axis_name)])

        single = norms(grads[0], None)
        for axis_name, close in ((A, True), (None, False)):
            sharded = jax.jit(shard_map(
                lambda g: norms(g, axis_name)[None], mesh=mesh, in_specs=(specs,),
                out_specs=P(A)))(grads[0])
            ok = np.allclose(sharded, np.broadcast_to(single, sharded.shape),
                             rtol=RTOL, atol=ATOL)
            assert ok == close, (axis_name, sharded, single)
        print("agrees tree_norm")


    def check_lbfgs():
        # L-BFGS with its linesearch on a whole-model loss (summed over the mesh
        # inside shard_map, as axis_name asks of value_fn): the same steps.
        flags = jax.tree.map(split, shapes, is_leaf=is_shape)

        def loss(p, sharded):
            def term(x, f):
                part = jnp.sum(x**2 + 0.1 * x**4 - x)
                return jax.lax.psum(part, A) if sharded and f else part

            return sum(jax.tree.leaves(jax.tree.map(term, p, flags)))

        def trainer(opt, sharded):
            def value_fn(p):
                return loss(p, sharded)

            def train(params):
                state = opt.init(params)
                for _ in range(STEPS):
                    v, g = jax.value_and_grad(value_fn)(params)
                    kw = {"value": v, "value_fn": value_fn} if opt.linesearch else {}
                    u, state = opt.update(g, state, params, **kw)
                    params = eqxopt.apply_updates(params, u)
                return params, (state.value, state.learning_rate)

            return train

        def sharded(opt):
            def stacked(params):
                return jax.tree.map(lambda x: jnp.asarray(x)[None],
                                    trainer(opt, True)(params))

            out_p, out_probe = jax.jit(shard_map(
                stacked, mesh=mesh, in_specs=(specs,), out_specs=P(A)))(params)
            whole = jax.tree.map(
                lambda x, s: x.reshape(s) if split(s) else x, out_p, shapes,
                is_leaf=lambda x: is_shape(x) or isinstance(x, jax.Array))
            return whole, out_probe

        # Without axis_name the devices' linesearches would take different
        # numbers of steps around the loss's psum (and hang), so the difference
        # without it is shown without linesearch.
        for search in (True, False):
            make = lambda a: eqxopt.LBFGS(
                0.5, memory_size=3, linesearch=search, axis_name=a)
            single = jax.jit(trainer(make(None), False))(params)
            assert_moved((params, (0.0, 0.0)), single, RTOL, ATOL)
            with_axis = difference(sharded(make(A)), single)
            assert with_axis <= 1, ("LBFGS with axis_name", search, with_axis)
            if not search:
                without = difference(sharded(make(None)), single)
                assert without > 100, ("LBFGS without axis_name", without)
            print("agrees LBFGS", search, f"{with_axis:.3g}")


    def check_two_axes():
        # A 2-D mesh and a tuple axis_name: leaves split over both axes, over one,
        # or replicated.
        mesh2 = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
        sp = {"emb": P("data", "model"), "dense": {"w": P("model"), "b": P(),
              "v": P(None, "data")}, "scale": P()}
        def make(axis_name):
            return eqxopt.Chain(
                eqxopt.ClipByGlobalNorm(1.0, axis_name=axis_name),
                eqxopt.LAMB(0.05, axis_name=axis_name),
            )

        def sharded(opt):
            return jax.jit(shard_map(trained_by_update(opt), mesh=mesh2,
                                     in_specs=(sp, [sp] * STEPS), out_specs=sp))

        single = jax.jit(trained_by_update(make(None)))(params, grads)
        assert difference(sharded(make(("data", "model")))(params, grads), single) <= 1
        # Per-device norms without axis_name: replicated leaves differ between
        # devices, so they cannot come back replicated.
        try:
            sharded(make(None))(params, grads)
        except Exception as e:
            assert "replicat" in str(e), e
        else:
            assert not TYPED
        print("agrees tuple-axes")
    """
)

RUN = textwrap.dedent(
    """
    for name in CHECKS:
        CHECKS_[name]()

    # Every wrapper (and any catalog case named, or every one) traces and steps inside
    # shard_map with sharded gradients.
    from catalog import all_cases

    targets = jax.tree.map(lambda p: 0.5 * p + 0.1, params)

    def loss_fn(p):
        return sum(jnp.sum((a - b) ** 2)
                   for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(targets)))

    failures = []
    for case in all_cases():
        if WRAPPERS != "all" and case.name not in WRAPPERS:
            continue
        opt = case.make()

        def train(params, targets):
            lf = lambda p: sum(jnp.sum((a - b) ** 2) for a, b in
                               zip(jax.tree.leaves(p), jax.tree.leaves(targets)))
            state = opt.init(params)
            for _ in range(2):
                g = jax.grad(lf)(params)
                extra = {} if case.extra is None else case.extra(lf, params)
                u, state = opt.update(g, state, params, **extra)
                params = eqxopt.apply_updates(params, u)
            return jax.tree.map(lambda x: x[None], params)

        try:
            out = jax.jit(shard_map(train, mesh=mesh, in_specs=(specs, specs),
                                    out_specs=P(A)))(params, targets)
            assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(out))
        except Exception as e:
            failures.append(f"{case.name}: {type(e).__name__}: "
                            + str(e).splitlines()[0][:300])
    assert not failures, "\\n".join(failures)
    print("SHARD-MAP-OK")
    """
)

# In make test (each is a compile in the subprocess); the slow test runs every case.
FAST_WRAPPERS = ("MultiSteps-SGD", "SkipNonFinite-ZeroNans-Adam")
WRAPPERS = (
    *FAST_WRAPPERS,
    "Monitor-SkipLargeUpdates-LearningRateMultipliers-Maximize-AdamW",
    "Lookahead-Adam",
    "ParamEMA-SGD",
    "Partition-AdamW-Adam",
    "Freeze-Adam",
    "Mechanic-SGD",
    "ScheduleFree-Adam",
    "SAM-SGD",
    "Chain-SGD-ReduceOnPlateau",
    "StochasticRounding-AdamW",
    "KahanSummation-SGD-momentum",
)


def _script(checks: tuple[str, ...], wrappers: object) -> str:
    names = f"CHECKS = {checks!r}\nWRAPPERS = {wrappers!r}\n"
    return HELPERS + SCRIPT + names + RUN


@needs_types
def test_global_reductions_agree_and_wrappers_trace_inside_shard_map():
    out = run_on_8_devices(
        _script(("ClipByGlobalNorm", "SkipNonFinite"), FAST_WRAPPERS)
    )
    assert "SHARD-MAP-OK" in out, out


@pytest.mark.slow
@needs_types
def test_every_axis_name_transform_agrees_and_every_case_traces_inside_shard_map():
    checks = (
        "LAMB",
        "global_norm",
        "SkipLargeUpdates",
        "LARS",
        "Fromage",
        "NovoGrad",
        "ScaleByTrustRatio",
        "ClipByBlockRMS",
        "AdaptiveGradClip",
        "Adafactor",
        "tuple-axes",
        "tree_norm",
        "DoG",
        "DoWG",
        "DAdaptAdamW",
        "DAdaptSGD",
        "Momo",
        "MomoAdam",
        "Mechanic",
        "Prodigy",
        "PolyakSGD",
        "LBFGS",
        "SOAP",
        "SOAP-kl",
        "KLShampoo",
    )
    out = run_on_8_devices(_script(checks, "all"))
    assert "SHARD-MAP-OK" in out, out


def test_axis_name_not_bound_is_an_error_naming_it():
    params = {"w": jnp.ones((3,))}
    opt = eqxopt.ClipByGlobalNorm(1.0, axis_name="fsdp")
    state = opt.init(params)
    with pytest.raises(ValueError, match="ClipByGlobalNorm: axis_name 'fsdp' is not"):
        jax.jit(lambda g: opt.update(g, state, params))(params)
    with pytest.raises(ValueError, match="axis_name 'data' is not a mesh axis"):
        eqxopt.global_norm(params, axis_name="data")


@pytest.mark.parametrize("bad", [3, (), ("a", 1)])
def test_axis_name_is_validated(bad):
    with pytest.raises(TypeError, match="axis_name must be None, a mesh axis name"):
        eqxopt.LAMB(0.1, axis_name=bad)
    with pytest.raises(ValueError, match="axis_name names a mesh axis twice"):
        eqxopt.SkipNonFinite(eqxopt.SGD(0.1), axis_name=("a", "a"))
