"""`update`, `step` and `make_train_step` behave as `eqx.filter_jit` of the same
functions: the same outputs (static ones included), the same compiles for the same
changes of arguments, the same errors (`eqx.error_if` raising
`eqx.EquinoxRuntimeError`), donation that consumes the inputs, and `.lower`. Each
case runs through eqxopt's method and through `eqx.filter_jit` of a function that
calls it, side by side."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Int, PyTree

import eqxopt
from eqxopt import extend
from helpers import compiles


def model():
    return eqx.nn.MLP(3, 2, 8, 2, key=jax.random.key(0))


def grads_of(m, seed=0):
    def loss(m):
        x = jax.random.normal(jax.random.key(seed), (4, 3))
        return jnp.mean(jax.vmap(m)(x) ** 2)

    return eqx.filter_grad(loss)(m)


def mixed_params():
    """Arrays of two dtypes, an int array, a float, a function and a string."""
    return {
        "w": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3),
        "b": jnp.ones(3, jnp.bfloat16),
        "count": jnp.arange(2),
        "scale": 2.0,
        "act": jax.nn.relu,
        "name": "layer",
    }


def mixed_grads(params, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "w": jnp.asarray(rng.normal(size=(2, 3)), jnp.float32),
        "b": jnp.asarray(rng.normal(size=3), jnp.bfloat16),
        "count": None,
        "scale": None,
        "act": None,
        "name": None,
    }


# The same call under `eqx.filter_jit`: eqxopt's method runs inside its trace.
by_filter_jit = {
    "step": eqx.filter_jit(lambda o, g, s, p: o.step(g, s, p)),
    "update": eqx.filter_jit(lambda o, g, s, p: o.update(g, s, p)),
}
# Donating the state and the parameters, not the gradients: those go in the first
# argument, which `donate="all-except-first"` keeps.
_donated_step = eqx.filter_jit(
    lambda og, s, p: og[0].step(og[1], s, p, donate=True), donate="all-except-first"
)
by_filter_jit_donated = {"step": lambda o, g, s, p: _donated_step((o, g), s, p)}


def direct(method):
    def call(o, g, s, p, **kwargs):
        return getattr(o, method)(g, s, p, **kwargs)

    return call


def assert_same(a, b):
    """The same tree, bit for bit, with non-array leaves equal."""
    a_leaves, a_def = jax.tree.flatten(a)
    b_leaves, b_def = jax.tree.flatten(b)
    assert a_def == b_def
    for x, y in zip(a_leaves, b_leaves):
        if eqx.is_array(x):
            assert x.dtype == y.dtype and x.shape == y.shape
            np.testing.assert_array_equal(
                np.asarray(x, np.float64), np.asarray(y, np.float64)
            )
        else:
            assert type(x) is type(y) and x == y


OPTIMIZERS = {
    "AdamW": lambda: eqxopt.AdamW(0.01, weight_decay=0.1),
    "SGD-momentum": lambda: eqxopt.SGD(0.05, momentum=0.9),
    "Chain": lambda: eqxopt.Chain(eqxopt.ClipByGlobalNorm(1.0), eqxopt.Adam(0.01)),
    "Lion-schedule": lambda: eqxopt.Lion(eqxopt.WarmupCosine(1e-2, 0.0, 2, 10)),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("method", ["step", "update"])
@pytest.mark.parametrize("tree", ["mlp", "mixed"])
def test_outputs_are_those_of_filter_jit(name, method, tree):
    """Three steps each way, from the same state: every array bit for bit and every
    non-array leaf (a model's activation functions, a float, a string) equal."""
    opt = OPTIMIZERS[name]()
    params = model() if tree == "mlp" else mixed_params()
    make_grads = grads_of if tree == "mlp" else mixed_grads
    states = [opt.init(params), opt.init(params)]
    p = [params, params]
    for i in range(3):
        g = make_grads(params, seed=i)
        ours = direct(method)(opt, g, states[0], p[0])
        theirs = by_filter_jit[method](opt, g, states[1], p[1])
        assert_same(ours, theirs)
        if method == "step":
            p = [ours[0], theirs[0]]
            states = [ours[1], theirs[1]]
        else:
            states = [ours[1], theirs[1]]
    if method == "step" and tree == "mixed":
        # The non-array leaves come back as they went in.
        assert p[0]["act"] is jax.nn.relu and p[0]["name"] == "layer"
        assert p[0]["scale"] == 2.0 and type(p[0]["scale"]) is float


def count_compiles(call, cases):
    """Per case, how many programs `call(*case)` compiled (each case warmed up
    by the cases before it, none by itself)."""
    counts = []
    for case in cases:
        with compiles() as log:
            jax.block_until_ready(call(*case))
        counts.append(len(log))
    return counts


def test_the_same_changes_recompile_and_the_same_do_not():
    """A new learning rate or a new optimizer object with other values reuses the
    program; another static leaf, shape or dtype compiles one: the same for
    eqxopt's `step` and `eqx.filter_jit` of it."""
    # Shapes of this test's own, so that its first call compiles.
    params = {**mixed_params(), "w": jnp.ones((5, 7))}
    grads = {**mixed_grads(params), "w": jnp.ones((5, 7))}

    def cases(opt_of):
        base = opt_of(0.1)
        state = base.init(params)
        other_shape = {**params, "w": jnp.ones((7, 5))}
        other_dtype = {**params, "w": params["w"].astype(jnp.float16)}

        def g_of(p):
            return {**grads, "w": jnp.ones_like(p["w"])}

        return [
            (base, grads, state, params),  # first call: compiles
            (base, grads, state, params),  # the same: nothing
            (opt_of(0.2), grads, state, params),  # another value: nothing
            (base, grads, state, {**params, "name": "other"}),  # a static leaf
            (base, g_of(other_shape), base.init(other_shape), other_shape),
            (base, g_of(other_dtype), base.init(other_dtype), other_dtype),
        ]

    def opt_of(lr):
        return eqxopt.AdamW(lr)

    ours = count_compiles(direct("step"), cases(opt_of))
    theirs = count_compiles(by_filter_jit["step"], cases(opt_of))
    assert [n > 0 for n in ours] == [n > 0 for n in theirs]
    assert [n > 0 for n in ours] == [True, False, False, True, True, True]


class ErrorState(eqx.Module):
    step: Int[Array, ""]
    mu: PyTree


class RefusesLargeGradients(extend.AbstractLeafwiseOptimizer):
    """SGD that fails at run time, through `eqx.error_if`, on a gradient over 10."""

    learning_rate: extend.ScalarOrSchedule = extend.learning_rate_field()

    state_type = ErrorState
    moments = (extend.Moment("mu"),)
    elementwise = False

    def leaf(self, h, t, g, p, mu):
        g = eqx.error_if(g, jnp.max(jnp.abs(g)) > 10, "the gradient is too large")
        return -h.learning_rate * g, mu


@pytest.mark.parametrize("donate", [False, True], ids=["kept", "donated"])
def test_an_error_if_raises_equinox_runtime_error_as_filter_jit_does(donate):
    params = {"w": jnp.ones(3)}
    opt = RefusesLargeGradients(0.1)
    large = {"w": jnp.full(3, 100.0)}
    fresh = {"w": jnp.ones(3)}

    def ours():
        p = jax.tree.map(jnp.copy, params)
        return opt.step(large, opt.init(p), p, donate=donate)

    def theirs():
        p = jax.tree.map(jnp.copy, params)
        jitted = by_filter_jit_donated["step"] if donate else by_filter_jit["step"]
        return jitted(opt, large, opt.init(p), p)

    with pytest.raises(eqx.EquinoxRuntimeError, match="the gradient is too large"):
        ours()
    with pytest.raises(eqx.EquinoxRuntimeError, match="the gradient is too large"):
        theirs()
    # A call that passes the check runs as usual afterwards.
    new, _ = opt.step(fresh, opt.init(params), params, donate=donate)
    np.testing.assert_allclose(new["w"], 0.9)


def test_errors_at_trace_time_are_the_same():
    """A wrong gradient is refused at trace time, with the same error both ways."""
    params = {"w": jnp.ones(3)}
    opt = eqxopt.Adam(0.1)
    wrong = {"w": jnp.ones(2)}
    errors = []
    for call in (direct("step"), by_filter_jit["step"]):
        with pytest.raises(ValueError) as caught:
            call(opt, wrong, opt.init(params), params)
        errors.append(str(caught.value))
    assert errors[0] == errors[1]
    assert errors[0].startswith("grads['w'] has shape (2,) but params['w'] has shape")


def test_donation_consumes_the_inputs_as_filter_jit_does():
    params = {"w": jnp.ones((4, 4))}
    opt = eqxopt.AdamW(0.1)
    grads = {"w": jnp.ones((4, 4))}
    results = []
    for call in (
        lambda o, g, s, p: o.step(g, s, p, donate=True),
        by_filter_jit_donated["step"],
    ):
        p = jax.tree.map(jnp.copy, params)
        s = opt.init(p)
        g = jax.tree.map(jnp.copy, grads)
        new_p, new_s = call(opt, g, s, p)
        assert p["w"].is_deleted() and s.mu["w"].is_deleted()
        results.append((new_p, new_s))
    assert_same(results[0], results[1])


def test_lower_gives_the_program_the_call_runs():
    params = {"w": jnp.ones((8, 8))}
    grads = {"w": jnp.ones((8, 8))}
    opt = eqxopt.AdamW(0.1)
    state = opt.init(params)
    for donate in (False, True):
        for method in (opt.step, opt.update):
            lowered = method.lower(grads, state, params, donate=donate)
            assert isinstance(lowered, jax.stages.Lowered)
            compiled = lowered.compile()
            assert compiled.memory_analysis() is not None
            assert "HloModule" in compiled.as_text()


def test_make_train_step_is_filter_jit_of_the_step_by_hand():
    """`make_train_step` against the step written with `eqx.filter_jit` and
    `opt.step`: the same numbers, the model's activation functions kept, and the
    loss's `eqx.error_if` raising `eqx.EquinoxRuntimeError`."""
    opt = eqxopt.AdamW(0.01)
    x = jax.random.normal(jax.random.key(1), (8, 3))

    def loss_fn(m, x):
        return jnp.mean(jax.vmap(m)(x) ** 2)

    @eqx.filter_jit(donate="all-except-first")
    def by_hand(x, m, s):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(m, x)
        m, s = opt.step(grads, s, m, donate=True)
        return m, s, loss

    step = eqxopt.make_train_step(loss_fn, opt)
    ours = (model(), opt.init(model()))
    theirs = (model(), opt.init(model()))
    for _ in range(3):
        m, s, loss = step(*ours, x)
        ours = (m, s)
        m2, s2, loss2 = by_hand(x, *theirs)
        theirs = (m2, s2)
        assert_same((m, s, loss), (m2, s2, loss2))
    assert ours[0].activation is jax.nn.relu

    def refusing(m, x):
        loss = loss_fn(m, x)
        return eqx.error_if(loss, loss >= 0, "the loss is not negative")

    refuse = eqxopt.make_train_step(refusing, opt)
    with pytest.raises(eqx.EquinoxRuntimeError, match="the loss is not negative"):
        refuse(model(), opt.init(model()), x)


def test_the_fast_path_keeps_a_bounded_number_of_programs():
    """Programs are kept in a least-recently-used cache, not in a dict that grows
    with every new static value: past the limit the oldest is dropped."""
    from eqxopt._core import _base, _compile

    opt = eqxopt.SGD(0.1)
    grads = {"w": jnp.ones(2), "tag": None}

    def call(tag):
        params = {"w": jnp.ones(2), "tag": tag}
        return opt.step(grads, opt.init(params), params)

    kept = _compile.PROGRAMS_KEPT
    for tag in range(kept + 5):
        call(f"bounded{tag}")
    programs = _base._STEP._programs  # pyright: ignore[reportPrivateUsage]
    assert len(programs) == kept
    # (A program's key: the static argument, the arguments' structure, and a
    # static key per leaf.)
    tags = [s.obj for key in programs for s in key[2] if s is not None]
    assert f"bounded{kept + 4}" in tags and "bounded0" not in tags
