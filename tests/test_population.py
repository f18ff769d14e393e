"""`eqxopt.population`: N optimizers stacked for `eqx.filter_vmap`.

Each member of a vmapped population of 4 Equinox MLPs, trained for 24 steps, must
follow its own sequential run (the same optimizer, built alone, stepping one model
in its own compiled step) to rounding: AdamW, SGD with Nesterov momentum, LAMB,
AdamW with a `WarmupCosine` per member, and a `make_train_step` step mapped with
`opt=`. Measured: at most 1.2e-7 absolute, 3.5e-7 relative to the leaf's largest
value, over every step and leaf; the tolerance is rtol=2e-5, atol=2e-6, as the
catalog's. AdamW's members are also checked against `optax.adamw`: at most 6.5e-6
absolute (1.7e-5 relative) after 24 steps at a learning rate of 3e-2, where
training amplifies the two libraries' different rounding; tolerance atol=2e-5.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import eqxopt
from helpers import compiles

N = 4
STEPS = 24
LEARNING_RATES = [1e-3, 3e-3, 1e-2, 3e-2]
WEIGHT_DECAYS = [0.0, 0.1, 0.0, 0.1]  # two values among the four members
RTOL, ATOL = 2e-5, 2e-6


def make_model(key):
    return eqx.nn.MLP(3, 2, width_size=16, depth=2, key=key)


def models_of(n=N):
    """`n` MLPs with their own initial weights, stacked on a leading axis."""
    return eqx.filter_vmap(make_model)(jax.random.split(jax.random.key(0), n))


def member(tree, i):
    """Member `i` of a stacked tree (non-array leaves, such as the activation
    functions, are shared)."""
    return jax.tree.map(lambda x: x[i] if eqx.is_array(x) else x, tree)


def host(model):
    """A copy of the float arrays on the host (the models of a donated step are
    overwritten)."""
    return jax.tree.map(np.asarray, eqx.filter(model, eqx.is_array))


def loss_fn(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def batches(steps=STEPS):
    """A new batch each step, the same for every member."""
    keys = jax.random.split(jax.random.key(1), steps)
    xs = jax.vmap(lambda k: jax.random.normal(k, (8, 3)))(keys)
    return [(x, jnp.stack([jnp.sin(x.sum(1)), jnp.cos(x[:, 0])], 1)) for x in xs]


@eqx.filter_jit
def population_step(opts, models, states, x, y):
    def one(opt, model, state):
        grads = eqx.filter_grad(loss_fn)(model, x, y)
        return opt.step(grads, state, model)

    return eqx.filter_vmap(one)(opts, models, states)


def train_population(opts, models, data=None):
    """The stacked models after each step."""
    states = eqx.filter_vmap(lambda opt, model: opt.init(model))(opts, models)
    history = []
    for x, y in batches() if data is None else data:
        models, states = population_step(opts, models, states, x, y)
        history.append(host(models))
    return history, states


@eqx.filter_jit
def grad_of(model, x, y):
    return eqx.filter_grad(loss_fn)(model, x, y)


@eqx.filter_jit
def step_alone(opt, model, state, x, y):
    return opt.step(grad_of(model, x, y), state, model)


def train_alone(opt, model):
    """One member on its own: its parameters after each step."""
    state = opt.init(model)
    history = []
    for x, y in batches():
        model, state = step_alone(opt, model, state, x, y)
        history.append(host(model))
    return history


def train_optax(tx, model):
    params, static = eqx.partition(model, eqx.is_array)

    @jax.jit
    def step(params, state, x, y):
        grads = grad_of(eqx.combine(params, static), x, y)
        with jax.numpy_dtype_promotion("standard"):
            updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    state = tx.init(params)
    history = []
    for x, y in batches():
        params, state = step(params, state, x, y)
        history.append(host(params))
    return history


def differences(stacked_history, history, i, rtol=RTOL, atol=ATOL):
    """Member `i` of a population's history against a run of its own, step by step
    and leaf by leaf; returns the largest absolute difference and the largest
    relative to a leaf's largest value (the figures in this module's docstring)."""
    worst_abs = worst_rel = 0.0
    for stacked, alone in zip(stacked_history, history, strict=True):
        for a, b in zip(jax.tree.leaves(member(stacked, i)), jax.tree.leaves(alone)):
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
            diff = float(np.abs(a - b).max())
            worst_abs = max(worst_abs, diff)
            worst_rel = max(worst_rel, diff / float(np.abs(b).max()))
    return worst_abs, worst_rel


def assert_moved(history, models):
    start = jax.tree.leaves(eqx.filter(models, eqx.is_array))
    moved = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(jax.tree.leaves(history[-1]), start)
    )
    assert moved > 100 * ATOL, f"the parameters moved only {moved}"


def adamw(learning_rate, weight_decay):
    return eqxopt.AdamW(learning_rate, weight_decay=weight_decay)


def test_adamw_members_follow_their_own_runs_and_optax():
    opts = eqxopt.population(
        adamw, learning_rate=LEARNING_RATES, weight_decay=WEIGHT_DECAYS
    )
    models = models_of()
    history, states = train_population(opts, models)
    assert_moved(history, models)
    assert states.step.tolist() == [STEPS] * N
    for i, (lr, wd) in enumerate(zip(LEARNING_RATES, WEIGHT_DECAYS)):
        differences(history, train_alone(adamw(lr, wd), member(models, i)), i)
    # optax, for the smallest and the largest learning rate (both weight decays):
    # its rounding differs from eqxopt's, and 24 steps at 3e-2 amplify it to
    # 7e-6 (eqxopt alone against optax differs as much).
    for i in (0, 3):
        tx = optax.adamw(LEARNING_RATES[i], weight_decay=WEIGHT_DECAYS[i])
        reference = train_optax(tx, member(models, i))
        differences(history, reference, i, atol=2e-5)
    # The members moved apart: the learning rates were used, each by its member.
    final = [jax.tree.leaves(member(history[-1], i)) for i in range(N)]
    assert not np.allclose(final[0][0], final[3][0], atol=1e-3)


def test_new_values_reuse_the_compiled_population_step():
    # Another population of the same size: new values, the same program (the
    # eager work around it, such as slicing the batches, is not the step's). Three
    # members: a size no other test compiles.
    models = models_of(3)
    first = eqxopt.population(
        adamw, learning_rate=[1e-3, 2e-3, 3e-3], weight_decay=[0.0] * 3
    )
    other = eqxopt.population(
        adamw, learning_rate=jnp.array([5e-4, 1e-3, 2e-3]), weight_decay=[0.2] * 3
    )
    for opts, compiled in ((first, True), (other, False)):
        with compiles() as log:
            train_population(opts, models, batches(2))
        assert ("jit(population_step)" in log) is compiled, log


def test_sgd_members_follow_their_own_runs():
    def sgd(learning_rate, momentum):
        return eqxopt.SGD(learning_rate, momentum=momentum, nesterov=True)

    momenta = [0.0, 0.5, 0.9, 0.9]
    opts = eqxopt.population(sgd, learning_rate=LEARNING_RATES, momentum=momenta)
    models = models_of()
    history, _ = train_population(opts, models)
    assert_moved(history, models)
    for i, (lr, m) in enumerate(zip(LEARNING_RATES, momenta)):
        differences(history, train_alone(sgd(lr, m), member(models, i)), i)


def test_layerwise_members_follow_their_own_runs():
    # LAMB's trust ratio is a norm of each leaf: under the map, of each member's
    # leaf, not of the stacked one.
    def lamb(learning_rate, weight_decay):
        return eqxopt.LAMB(learning_rate, weight_decay=weight_decay)

    opts = eqxopt.population(
        lamb, learning_rate=LEARNING_RATES, weight_decay=WEIGHT_DECAYS
    )
    models = models_of()
    history, _ = train_population(opts, models)
    assert_moved(history, models)
    for i, (lr, wd) in enumerate(zip(LEARNING_RATES, WEIGHT_DECAYS)):
        differences(history, train_alone(lamb(lr, wd), member(models, i)), i)


def test_schedules_as_hyperparameters():
    # Each member has its own peak and warmup: a schedule's values and step
    # counts are array fields, stacked like any other.
    def warmup_cosine(peak_lr, warmup_steps):
        schedule = eqxopt.WarmupCosine(peak_lr, 0.1 * peak_lr, warmup_steps, STEPS)
        return eqxopt.AdamW(schedule)

    peaks, warmups = [1e-2, 3e-2, 1e-2, 3e-2], [2, 2, 8, 8]
    opts = eqxopt.population(warmup_cosine, peak_lr=peaks, warmup_steps=warmups)
    assert opts.learning_rate.warmup_steps.tolist() == warmups
    models = models_of()
    history, _ = train_population(opts, models)
    for i, (peak, warmup) in enumerate(zip(peaks, warmups)):
        differences(
            history, train_alone(warmup_cosine(peak, warmup), member(models, i)), i
        )
    # A list of schedules, one per member, is the same population.
    schedules = [
        eqxopt.WarmupCosine(p, 0.1 * p, w, STEPS) for p, w in zip(peaks, warmups)
    ]
    listed = eqxopt.population(eqxopt.AdamW, learning_rate=schedules)
    assert eqx.tree_equal(listed, opts)


def test_make_train_step_mapped_with_opt():
    # A `TrainStep` called inside the map with `opt=` steps one member; the
    # enclosing `eqx.filter_jit` compiles the population's step once and donates
    # the models and states.
    opts = eqxopt.population(
        adamw, learning_rate=LEARNING_RATES, weight_decay=WEIGHT_DECAYS
    )
    train_step = eqxopt.make_train_step(loss_fn, adamw(1e-3, 0.0))

    @eqx.filter_jit(donate="all-except-first")
    def step(opts, models, states, x, y):
        def one(opt, model, state):
            return train_step(model, state, x, y, opt=opt)

        return eqx.filter_vmap(one)(opts, models, states)

    models = models_of()
    start = member(models, 2)
    states = eqx.filter_vmap(lambda opt, model: opt.init(model))(opts, models)
    history = []
    for x, y in batches():
        models, states, losses = step(opts, models, states, x, y)
        history.append(host(models))
    assert losses.shape == (N,)
    differences(
        history, train_alone(adamw(LEARNING_RATES[2], WEIGHT_DECAYS[2]), start), 2
    )


def test_update_and_apply_under_the_map():
    opts = eqxopt.population(eqxopt.Adam, learning_rate=LEARNING_RATES)
    models = models_of()
    x, y = batches(1)[0]

    def one(opt, model):
        state = opt.init(model)
        updates, _ = opt.update(grad_of(model, x, y), state, model)
        return eqxopt.apply_updates(model, updates)

    stepped = eqx.filter_jit(eqx.filter_vmap(one))(opts, models)
    for i, lr in enumerate(LEARNING_RATES):
        alone = member(models, i)
        opt = eqxopt.Adam(lr)
        expected, _ = step_alone(opt, alone, opt.init(alone), x, y)
        differences([host(stepped)], [host(expected)], i)


def test_traced_values_map_the_constructor():
    @jax.jit
    def build(learning_rates):
        return eqxopt.population(
            adamw, learning_rate=learning_rates, weight_decay=[0.1] * N
        )

    traced = build(jnp.asarray(LEARNING_RATES))
    concrete = eqxopt.population(
        adamw, learning_rate=LEARNING_RATES, weight_decay=[0.1] * N
    )
    assert jax.tree.structure(traced) == jax.tree.structure(concrete)
    for a, b in zip(jax.tree.leaves(traced), jax.tree.leaves(concrete)):
        np.testing.assert_array_equal(a, b)


def test_every_array_field_is_stacked():
    opts = eqxopt.population(
        adamw, learning_rate=LEARNING_RATES, weight_decay=WEIGHT_DECAYS
    )
    assert isinstance(opts, eqxopt.AdamW)
    assert all(x.shape == (N,) for x in jax.tree.leaves(opts))
    np.testing.assert_allclose(opts.learning_rate.value, LEARNING_RATES)
    np.testing.assert_allclose(opts.b1, [0.9] * N)


def test_a_negative_learning_rate_among_the_members():
    with pytest.raises(
        ValueError,
        match=r"population member 2 \(learning_rate=-0.01, weight_decay=0.0\): "
        r"learning_rate must be in \[0.0, inf\], got -0.01",
    ):
        eqxopt.population(
            adamw, learning_rate=[1e-3, 1e-2, -1e-2, 1e-1], weight_decay=[0.0] * 4
        )
    with pytest.raises(ValueError, match=r"population member 1 .*b2 must be in"):
        eqxopt.population(lambda b2: eqxopt.Adam(1e-3, b2=b2), b2=jnp.array([0.9, 1.0]))


def test_mismatched_population_sizes():
    with pytest.raises(
        ValueError,
        match="population sizes differ: learning_rate has 4, weight_decay has 2 "
        "values; give every hyperparameter one value per member",
    ):
        eqxopt.population(adamw, learning_rate=LEARNING_RATES, weight_decay=[0.0, 0.1])


def test_a_value_that_is_not_one_per_member():
    with pytest.raises(
        ValueError, match=r"learning_rate must hold one value per member .* got 0.001"
    ):
        eqxopt.population(eqxopt.Adam, learning_rate=1e-3)
    with pytest.raises(
        ValueError, match=r"learning_rate must hold .* got an array of shape \(\)"
    ):
        eqxopt.population(eqxopt.Adam, learning_rate=jnp.asarray(1e-3))
    with pytest.raises(
        ValueError, match="a population needs at least one member; learning_rate has 0"
    ):
        eqxopt.population(eqxopt.Adam, learning_rate=[])


def test_members_that_differ_in_structure():
    def schedule_or_number(warmup_steps):
        if warmup_steps:
            return eqxopt.AdamW(eqxopt.WarmupCosine(1e-2, 0.0, warmup_steps, 100))
        return eqxopt.AdamW(1e-2)

    with pytest.raises(
        ValueError,
        match=r"population member 1 differs from member 0 in its structure or a "
        r"static field \(AdamW\); the members may differ only in the values",
    ):
        eqxopt.population(schedule_or_number, warmup_steps=[10, 0])
    with pytest.raises(ValueError, match="member 1 differs from member 0 in its"):
        eqxopt.population(
            lambda nesterov: eqxopt.SGD(0.1, momentum=0.9, nesterov=nesterov),
            nesterov=[False, True],
        )


def test_bad_arguments():
    with pytest.raises(TypeError, match="make_opt must be callable, got float"):
        eqxopt.population(0.1, learning_rate=[0.1])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="population needs at least one hyperparameter"):
        eqxopt.population(eqxopt.Adam)
    with pytest.raises(
        TypeError, match="make_opt's result must be an eqxopt transform"
    ):
        eqxopt.population(lambda lr: optax.adam(lr), lr=[0.1])
    with pytest.raises(TypeError, match=r"population member 0 \(b1='x'\): b1 must be"):
        eqxopt.population(lambda b1: eqxopt.Adam(1e-3, b1=b1), b1=["x"])
