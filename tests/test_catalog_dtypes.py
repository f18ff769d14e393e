"""Catalog properties over parameter dtypes and shapes: complex64 leaves, float64
leaves under `jax_enable_x64`, and zero-size leaves, run over `catalog.all_cases()`.

Complex leaves: every configuration either matches optax's equivalent over several
steps (where optax has one), or rejects the complex leaf with a `TypeError` naming
the leaf and itself. Every configuration that takes complex leaves also passes a
complex-aware reference of its own: a real problem turned by a unit phase `w`
(parameters, gradients and targets times `w`) must give the real run's parameters
times `w`. That holds for any rule built on `|g|**2`, `Re(conj(a) * b)`, norms and
signs `g / |g|`, and fails for `g * g` (which turns with `w**2`).
"""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import eqxopt
from catalog import all_cases, swept
from helpers import enable_x64, nested_tree

CASES = all_cases()
NAMES = {c.name for c in CASES}
STEPS = 5
PHASE = np.exp(0.6j)


def _matrices(params):
    return jax.tree.map(lambda x: x.ndim >= 2, params)


def _same(schedule):
    """An optax-style function calling the eqxopt schedule, so both runs see
    bit-identical values."""
    return lambda step: schedule(jnp.asarray(step, jnp.int32))


# The optax transformation equal to each catalog configuration (tests/cases_*.py),
# as the family test files (test_*_family.py, test_transforms.py,
# test_wrappers.py) check it on real leaves. Left out where optax is not
# complex-aware: optax.adadelta and contrib.prodigy square `g * g` (eqxopt takes
# |g|**2); the phase reference below covers those, and the configurations optax
# lacks.
OPTAX = {
    "SGD": lambda: optax.sgd(0.05),
    "SGD-momentum": lambda: optax.sgd(0.05, momentum=0.9),
    "SGD-nesterov": lambda: optax.sgd(0.05, momentum=0.9, nesterov=True),
    "Adam": lambda: optax.adam(0.05),
    "AdamW": lambda: optax.adamw(0.05, weight_decay=0.01),
    "AdamW-schedule": lambda: optax.adamw(
        _same(eqxopt.WarmupCosine(0.05, 0.005, 3, 50))
    ),
    "Adam-nesterov": lambda: optax.adam(0.05, nesterov=True),
    "AdamW-mask-nu32": lambda: optax.adamw(0.05, weight_decay=0.1, mask=_matrices),
    "AdamW-wd-schedule": lambda: optax.adamw(
        0.05, weight_decay=_same(eqxopt.WarmupCosine(0.1, 0.01, 2, 50))
    ),
    "NAdam": lambda: optax.nadam(0.05),
    "NAdamW": lambda: optax.nadamw(0.05, weight_decay=0.1),
    "AMSGrad": lambda: optax.amsgrad(0.05),
    "Adamax": lambda: optax.adamax(0.05),
    "AdamaxW": lambda: optax.adamaxw(0.05, weight_decay=0.1),
    "AdaBelief": lambda: optax.adabelief(0.05),
    "Yogi": lambda: optax.yogi(0.05),
    "AdEMAMix": lambda: optax.contrib.ademamix(0.05, b3=0.999, weight_decay=0.01),
    "OptimisticAdam": lambda: optax.optimistic_adam_v2(0.05),
    "LAMB": lambda: optax.lamb(0.05, weight_decay=0.01, mask=_matrices),
    "LARS": lambda: optax.lars(5.0, weight_decay=1e-4, nesterov=True),
    "Fromage": lambda: optax.fromage(0.05),
    "NovoGrad": lambda: optax.novograd(0.02, weight_decay=1e-3),
    "Adan": lambda: optax.adan(0.05, weight_decay=0.01, mask=_matrices),
    "Muon": lambda: optax.contrib.muon(0.05, weight_decay=0.01),
    "ScheduleFreeSGD": lambda: optax.contrib.schedule_free_sgd(0.05),
    "ScheduleFreeAdamW": lambda: optax.contrib.schedule_free_adamw(
        0.05, weight_decay=0.01
    ),
    "ScheduleFree-Adam": lambda: optax.contrib.schedule_free(
        optax.adam(0.05, b1=0.0), 0.05
    ),
    "LBFGS": lambda: optax.lbfgs(memory_size=5),
    "Adagrad": lambda: optax.adagrad(0.1),
    "RMSProp": lambda: optax.rmsprop(0.01),
    "RMSProp-centered-nesterov": lambda: optax.rmsprop(
        0.01, centered=True, momentum=0.9, nesterov=True
    ),
    "SignSGD": lambda: optax.sign_sgd(0.01),
    "Signum": lambda: optax.signum(0.01),
    "Lion": lambda: optax.lion(0.01, weight_decay=0.1),
    "NoisySGD": lambda: optax.noisy_sgd(0.05, key=0),
    "OptimisticGradientDescent": lambda: optax.optimistic_gradient_descent(0.05),
    "PolyakSGD": lambda: optax.polyak_sgd(max_learning_rate=0.1),
    "Chain-ClipByGlobalNorm-AdamW": lambda: optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(0.05, weight_decay=0.01)
    ),
    "Chain-AGC-BlockRMS-Adam": lambda: optax.chain(
        optax.adaptive_grad_clip(0.5), optax.clip_by_block_rms(1.0), optax.adam(0.05)
    ),
    # optax's default float32 accumulator drops the imaginary parts: accumulate in
    # the parameters' dtype, as eqxopt does.
    "MultiSteps-SGD": lambda: optax.MultiSteps(
        optax.sgd(0.05, momentum=0.5), 2, accumulator_dtype=jnp.complex64
    ),
    "SkipNonFinite-ZeroNans-Adam": lambda: optax.apply_if_finite(
        optax.chain(optax.zero_nans(), optax.adam(0.05)), 2
    ),
    "Freeze-Adam": lambda: optax.adam(0.05),
}

# The configurations that reject complex leaves, and the name the error gives.
REJECTS = {
    "ADOPT": "ADOPT",  # clip=True: no order on complex numbers (nor in optax)
    "Rprop": "Rprop",  # sign comparisons (optax.rprop fails likewise)
    "SM3": "SM3",
    "SOAP": "SOAP",
    "SOAP-kl": "SOAP",
    "KLShampoo": "KLShampoo",
    "Shampoo": "Shampoo",
    "PSGDKron": "PSGDKron",
    "GaLore": "GaLore",  # transposes, not conjugate transposes (as optax)
    "APOLLO": "APOLLO",  # the same projections as GaLore's
    "APOLLO-Mini": "APOLLOMini",
    "Sophia-H": "Sophia",  # a clip and a max of magnitudes (optax's fail likewise)
    "Chain-ClipByValue-Centralize-AddNoise-AddDecayedWeights-SGD": "ClipByValue",
    "Blocks-Rprop": "ScaleByRprop",
    "Blocks-Sm3": "ScaleBySm3",
    "Scion": "Scion",  # sign oracles and real norms
    "Dion": "Dion",  # its factors transpose
}

# NoisySGD draws complex noise, which no real run turned by a phase reproduces; its
# optax comparison above covers it. Lion's "smooth" direction is `tanh` of the
# complex argument, as optax's (the hard sign, `c / |c|`, is covariant).
NOT_PHASE_COVARIANT = {"NoisySGD", "Blocks-Lion-smooth"}
# Cases tagged "quantized" (cases_quantized.py) quantize real leaves block-wise and
# keep complex leaves in full precision, so a turned run differs by the real run's
# quantization error.


def test_every_case_is_classified():
    assert set(OPTAX) | set(REJECTS) <= NAMES
    assert not set(OPTAX) & set(REJECTS)


def complex_tree():
    re, im = nested_tree(0), nested_tree(3)
    return jax.tree.map(jax.lax.complex, re, im)


def complex_targets():
    re, im = nested_tree(7), nested_tree(8)
    return jax.tree.map(jax.lax.complex, re, im)


def make_loss(targets):
    def loss(params):
        return sum(
            jnp.sum(jnp.abs(p - t) ** 2 + 0.1 * jnp.abs(p) ** 4)
            for p, t in zip(jax.tree.leaves(params), jax.tree.leaves(targets))
        )

    return loss


def descent(loss, params):
    """The gradient as optax's complex optimizers take it (optax's own complex
    tests, L-BFGS included): conj of `jax.grad`; `jax.grad` for real leaves."""
    return jax.tree.map(jnp.conj, jax.grad(loss)(params))


def run_ours(case, params, loss, steps=STEPS, grad_fn=descent):
    opt = case.make()
    state = opt.init(params)
    history = []
    for _ in range(steps):
        extra = {} if case.extra is None else case.extra(loss, params)
        params, state = opt.step(grad_fn(loss, params), state, params, **extra)
        history.append(params)
    return history


def run_theirs(name, params, loss, steps=STEPS, grad_fn=descent, table=OPTAX):
    # optax promotes real to complex (and float32 to float64) implicitly: JAX's
    # standard promotion for the reference, whatever the tests' setting.
    with jax.numpy_dtype_promotion("standard"):
        tx = table[name]()
        state = tx.init(params)
        history = []
        for _ in range(steps):
            grads = grad_fn(loss, params)
            if name == "LBFGS":
                extra = {"value": loss(params), "grad": grads, "value_fn": loss}
            elif name in ("PolyakSGD", "Momo", "MomoAdam"):
                extra = {"value": loss(params)}
            else:
                extra = {}
            updates, state = tx.update(grads, state, params, **extra)
            params = optax.apply_updates(params, updates)
            history.append(params)
    return history


def assert_close(actual, expected, rtol, atol, what=""):
    for step, (a_tree, e_tree) in enumerate(zip(actual, expected)):
        paths = [jax.tree_util.keystr(p) for p, _ in jax.tree.leaves_with_path(e_tree)]
        for path, a, e in zip(paths, jax.tree.leaves(a_tree), jax.tree.leaves(e_tree)):
            np.testing.assert_allclose(
                np.asarray(a),
                np.asarray(e),
                rtol=rtol,
                atol=atol,
                err_msg=f"{what} step {step} at {path}",
            )


# A few configurations run a longer chain of float32 roundings than the rest (a
# linesearch, trust ratios of whole leaves, Newton-Schulz iterations).
LOOSE = {"LBFGS": 1e-4, "Muon": 1e-4, "LARS": 1e-4, "Prodigy": 1e-4}


@pytest.mark.parametrize("case", swept([c for c in CASES if c.name in OPTAX]))
def test_complex_leaves_match_optax(case):
    name = case.name
    params, loss = complex_tree(), make_loss(complex_targets())
    ours = run_ours(case, params, loss)
    for leaf in jax.tree.leaves(ours[-1]):
        assert leaf.dtype == jnp.complex64
    theirs = run_theirs(name, params, loss)
    tol = LOOSE.get(name, 2e-5)
    assert_close(ours, theirs, rtol=tol, atol=tol / 10, what=name)


@pytest.mark.parametrize("name", sorted(REJECTS))
def test_complex_leaves_are_rejected_naming_leaf_and_optimizer(name):
    case = next(c for c in CASES if c.name == name)
    params = complex_tree()
    grads = descent(make_loss(complex_targets()), params)
    opt = case.make()
    pattern = rf"{REJECTS[name]}.*real .* only; (params|grads)\['dense'\]\['b'\] is"
    with pytest.raises(TypeError, match=pattern):
        opt.update(grads, opt.init(params), params)
    # Initialised on real leaves (or stateless), the update rejects them too.
    real = jax.tree.map(jnp.real, params)
    with contextlib.suppress(TypeError):
        state = opt.init(real)
        with pytest.raises(TypeError, match=r"\['dense'\]\['b'\]"):
            opt.update(grads, state, params)


PHASE_CASES = [
    c
    for c in CASES
    if c.name not in REJECTS
    and c.name not in NOT_PHASE_COVARIANT
    and "quantized" not in c.tags
]


@pytest.mark.parametrize("case", swept(PHASE_CASES))
def test_complex_leaves_turned_by_a_phase_follow_the_real_run(case):
    """The complex-aware reference for every configuration: `g * g` where `|g|**2`
    is meant (RMSProp, Adagrad, ScheduleFreeAdamW, Muon's Adam branch did) turns
    the second moment by `w**2` and fails this."""
    real_params, real_targets = nested_tree(0), nested_tree(7)
    turn = lambda tree: jax.tree.map(  # noqa: E731
        lambda x: x.astype(jnp.complex64) * jnp.asarray(PHASE, jnp.complex64), tree
    )
    real_loss = make_loss(real_targets)
    expected = run_ours(case, real_params, real_loss)
    actual = run_ours(case, turn(real_params), make_loss(turn(real_targets)))
    tol = LOOSE.get(case.name, 2e-5)
    assert_close(
        actual, [turn(t) for t in expected], rtol=tol, atol=tol / 10, what=case.name
    )


# ---------------------------------------------------------------------------------
# float64 leaves under jax_enable_x64.


def _steps_as_float64(schedule):
    """An optax schedule called on float64 steps: on optax's int32 count it
    computes in float32 even under x64 (int32 / int is float32 in JAX)."""
    return lambda count: schedule(jnp.asarray(count, jnp.float64))


# The float64 runs of optax equal to catalog configurations: the learning rate,
# schedules and global norms in float64 too, as every other number.
FLOAT64_OPTAX = {
    "Adam": lambda: optax.adam(0.05),
    "AdamW": lambda: optax.adamw(0.05, weight_decay=0.01),
    "AdamW-schedule": lambda: optax.adamw(
        _steps_as_float64(optax.warmup_cosine_decay_schedule(0.0, 0.05, 3, 50, 0.005))
    ),
    "SGD-momentum": lambda: optax.sgd(0.05, momentum=0.9),
    "RMSProp": lambda: optax.rmsprop(0.01),
    "LBFGS": lambda: optax.lbfgs(memory_size=5),
    "Chain-ClipByGlobalNorm-AdamW": lambda: optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(0.05, weight_decay=0.01)
    ),
    # The averaging weights are statistics of the learning rate: float64 too.
    "ScheduleFreeAdamW": OPTAX["ScheduleFreeAdamW"],
    "ScheduleFree-Adam": OPTAX["ScheduleFree-Adam"],
    # Step sizes from whole-tree sums, kept in the state in the sums' dtype.
    "PolyakSGD": OPTAX["PolyakSGD"],
    "Prodigy": lambda: optax.contrib.prodigy(estim_lr0=1e-2),
    "DAdaptAdamW": lambda: optax.contrib.dadapt_adamw(
        estim_lr0=1e-2, weight_decay=1e-3
    ),
    "DoG": lambda: optax.contrib.dog(init_step=("heuristic", 1e-2), weight_decay=1e-3),
    "DoWG": lambda: optax.contrib.dowg(weight_decay=1e-3),
    "Momo": lambda: optax.contrib.momo(0.1, weight_decay=1e-3),
    "MomoAdam": lambda: optax.contrib.momo_adam(0.05, adapt_lower_bound=True),
    "Mechanic-SGD": lambda: optax.contrib.mechanize(
        optax.sgd(1.0, momentum=0.9), s_init=1e-3
    ),
}
CASE_NAMED = {c.name: c for c in CASES}


@pytest.mark.parametrize("name", sorted(FLOAT64_OPTAX))
def test_float64_runs_match_optax_float64_runs(name):
    """Under `jax_enable_x64` with float64 parameters every number follows them:
    hyperparameters and schedules are float64 (the default float dtype), and so
    are the global norm of float64 gradients and every statistic a state keeps of
    sums over the parameters (`d`, distances, Momo's loss model). The runs then
    agree with optax's to float64 rounding, where a float32 learning rate or norm
    is 1e-8 off."""
    with enable_x64(True):
        start = nested_tree(dtype=jnp.float64)
        loss = make_loss(nested_tree(7, dtype=jnp.float64))
        ours = run_ours(CASE_NAMED[name], start, loss, steps=5)
        theirs = run_theirs(name, start, loss, steps=5, table=FLOAT64_OPTAX)
    assert_close(ours, theirs, rtol=1e-13, atol=1e-15, what=name)
    for leaf in jax.tree.leaves(theirs[-1]):
        assert leaf.dtype == jnp.float64


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.slow
def test_float64_leaves_keep_their_dtype_under_x64(case):
    with enable_x64(True):
        params = nested_tree(dtype=jnp.float64)
        loss = make_loss(nested_tree(7, dtype=jnp.float64))
        opt = case.make()
        state = opt.init(params)
        for _ in range(3):
            grads = jax.grad(loss)(params)
            extra = {} if case.extra is None else case.extra(loss, params)
            updates, _ = opt.update(grads, state, params, **extra)
            params, state = opt.step(grads, state, params, **extra)
        for leaf in jax.tree.leaves((updates, params)):
            assert leaf.dtype == jnp.float64
            assert bool(jnp.all(jnp.isfinite(leaf)))
        for leaf in jax.tree.leaves(state):
            if jnp.issubdtype(leaf.dtype, jnp.inexact):
                assert bool(jnp.all(jnp.isfinite(leaf)))


# ---------------------------------------------------------------------------------
# Zero-size leaves.


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.slow
def test_zero_size_leaves_get_empty_updates_and_leave_the_rest_alone(case):
    """A zero-size parameter (a 0 x 3 matrix, a 4 x 0 one, an empty vector) is
    legitimate: it gets an empty update, and the other leaves move exactly as they
    would without it."""
    base = nested_tree()
    params = {
        **base,
        "empty": {
            "rows": jnp.zeros((0, 3)),
            "cols": jnp.zeros((4, 0)),
            "vec": jnp.zeros((0,)),
        },
    }
    targets = nested_tree(7)
    targets_with_empty = {**targets, "empty": params["empty"]}
    loss = make_loss(targets_with_empty)
    base_loss = make_loss(targets)
    got = run_ours(case, params, loss, steps=3)
    want = run_ours(case, base, base_loss, steps=3)
    for name, leaf in got[-1]["empty"].items():
        assert leaf.shape == params["empty"][name].shape
        assert leaf.dtype == jnp.float32
    without = [{k: v for k, v in p.items() if k != "empty"} for p in got]
    if case.name in ("NoisySGD",) or "AddNoise" in case.name:
        # The noise keys are split per leaf: extra leaves draw other numbers.
        for leaf in jax.tree.leaves(without[-1]):
            assert bool(jnp.all(jnp.isfinite(leaf)))
        return
    assert_close(without, want, rtol=2e-6, atol=2e-7, what=case.name)
