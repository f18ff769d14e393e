"""KL-SOAP (`SOAP(factor_update="kl")`) and `KLShampoo` against heavyball 3.2.1's
`KLSOAP` and `KLShampoo`, in float64 on both sides, over 25 steps of a closed loop
(each gradient taken at the current parameters)."""

import heavyball
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import eqxopt
from helpers import enable_x64

STEPS = 25


@pytest.fixture
def float64_heavyball():
    """heavyball uncompiled (its `torch.compile` refuses float64 here) and torch's
    default dtype float64, both restored after the test."""
    mode, dtype = heavyball.utils.compile_mode, torch.get_default_dtype()
    heavyball.utils.compile_mode = None
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        heavyball.utils.compile_mode = mode
        torch.set_default_dtype(dtype)


def _problem(shapes, seed=0):
    rng = np.random.default_rng(seed)
    start = [rng.normal(size=s) for s in shapes]
    noise = [[rng.normal(size=s) for s in shapes] for _ in range(STEPS)]

    def grads(step, params):  # a quadratic's gradient plus noise
        return [0.5 * p + n for p, n in zip(params, noise[step])]

    return start, grads


def _heavyball_run(cls, start, grads, **kw):
    params = [torch.nn.Parameter(torch.tensor(p)) for p in start]
    opt = cls(
        params,
        merge_dims=False,  # eqxopt's SOAP preconditions each axis of a leaf
        storage_dtype="float64",
        compile_step=False,
        multi_tensor=False,
        **kw,
    )
    history = []
    for step in range(STEPS):
        for p, g in zip(params, grads(step, [p.detach().numpy() for p in params])):
            p.grad = torch.tensor(g)
        opt.step()
        opt.zero_grad()
        history.append([p.detach().numpy().copy() for p in params])
    return history


def _eqxopt_run(opt, start, grads):
    params = [jnp.asarray(p) for p in start]
    state = opt.init(params)
    history = []
    for step in range(STEPS):
        g = [jnp.asarray(x) for x in grads(step, [np.asarray(p) for p in params])]
        params, state = opt.step(g, state, params)
        history.append([np.asarray(p) for p in params])
    return history


def _largest_difference(a, b):
    return max(
        float(np.max(np.abs(x - y)))
        for step_a, step_b in zip(a, b)
        for x, y in zip(step_a, step_b)
    )


# Square matrices: the first statistics (one gradient's outer product) are then of
# full rank. A non-square matrix's larger factor starts rank-deficient, and the
# eigenvectors of its null space (so the axes Adam normalises along) are whatever
# each LAPACK returns: no two implementations agree there, KL or not. The second
# set has a leaf whose long axis is not preconditioned (heavyball, like eqxopt,
# then keeps SOAP's one-sided statistics), a 3-D leaf (heavyball's KL update is
# for matrices only: SOAP's statistics, as eqxopt's) and a 1-D leaf (Adam).
SHAPES = {
    "square": ((4, 4), (6, 6), (3, 3)),
    "one-sided, 3-D, 1-D": ((4, 12), (2, 3, 3), (5,), (7, 7)),
}


@pytest.mark.parametrize("eps", [1e-12, 1e-8], ids=["eps=1e-12", "eps=1e-8"])
@pytest.mark.parametrize("shapes", list(SHAPES), ids=list(SHAPES))
def test_kl_soap_matches_heavyball_klsoap(float64_heavyball, shapes, eps):
    start, grads = _problem(SHAPES[shapes])
    # heavyball refreshes the eigenbases when its 1-based step is a multiple of
    # the frequency, eqxopt (as the SOAP authors' code) when its 0-based one is:
    # every step on both sides. heavyball decays the parameter before the step,
    # eqxopt's SOAP after it (as the authors' code): no decay here.
    kw = dict(shampoo_beta=0.9, eps=eps, weight_decay=0.0, precondition_frequency=1)
    expected = _heavyball_run(
        heavyball.KLSOAP,
        start,
        grads,
        lr=0.01,
        betas=(0.9, 0.95),
        max_precond_dim=8,
        **kw,
    )
    with enable_x64():
        kl = eqxopt.SOAP(
            0.01, b1=0.9, b2=0.95, max_precond_dim=8, factor_update="kl", **kw
        )
        actual = _eqxopt_run(kl, start, grads)
        plain = eqxopt.SOAP(0.01, b1=0.9, b2=0.95, max_precond_dim=8, **kw)
        plain_history = _eqxopt_run(plain, start, grads)
    # Measured: 1.8e-12 (eps 1e-12) and 1.8e-8 (eps 1e-8). The rest is eps's other
    # uses, which differ: heavyball adds it to the bias-corrected root of the
    # second moment (eqxopt's SOAP to the uncorrected one, as the authors' code)
    # and lifts each QR's input by eps times the largest eigenvalue.
    tolerance = 1e-10 if eps == 1e-12 else 1e-7
    difference = _largest_difference(actual, expected)
    assert difference < tolerance, difference
    # The KL statistics matter: SOAP's own are far from heavyball's KLSOAP.
    assert _largest_difference(plain_history, expected) > 1e-3
    # And the parameters moved well beyond the tolerance.
    assert _largest_difference(expected[-1:], [start]) > 0.05


KL_OPTIMIZERS = {
    "KL-SOAP": lambda: eqxopt.SOAP(0.01, precondition_frequency=2, factor_update="kl"),
    "KLShampoo": lambda: eqxopt.KLShampoo(0.01, precondition_frequency=2),
}


@pytest.mark.parametrize("name", list(KL_OPTIMIZERS))
def test_kl_optimizers_in_a_partition_step_their_leaves_as_alone(name):
    # The KL optimizer on the leaves labelled for it, SGD on the rest: its leaves
    # step as it given them alone (each matrix's factors fitted from each other
    # only), to float64 rounding; the SGD leaf as SGD alone.
    kl = KL_OPTIMIZERS[name]
    start, grads = _problem(((5, 5), (4, 4), (3,)), seed=1)

    with enable_x64():  # hyperparameters built in float64 too
        split = eqxopt.Partition(
            {"kl": kl(), "sgd": eqxopt.SGD(0.1)}, labels=["kl", "sgd", "kl"]
        )
        both = _eqxopt_run(split, start, grads)
        kl_alone = _eqxopt_run(
            kl(),
            [start[0], start[2]],
            lambda k, p: grads(k, [p[0], 0 * start[1], p[1]])[::2],
        )
        sgd_alone = _eqxopt_run(
            eqxopt.SGD(0.1),
            [start[1]],
            lambda k, p: grads(k, [0 * start[0], p[0], 0 * start[2]])[1:2],
        )
    for got, want_kl, want_sgd in zip(both, kl_alone, sgd_alone):
        np.testing.assert_allclose(got[0], want_kl[0], rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(got[2], want_kl[1], rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(got[1], want_sgd[0], rtol=1e-12, atol=1e-13)
    assert _largest_difference(both[-1:], [start]) > 0.05


def test_factor_update_is_checked():
    with pytest.raises(
        ValueError, match="factor_update must be one of 'shampoo', 'kl'; got 'fisher'"
    ):
        eqxopt.SOAP(factor_update="fisher")


# KLShampoo seeds its factors with init_factor * I, so non-square matrices are
# comparable from the start. heavyball decides a refresh by summing
# 1 / precondition_frequency in floating point (3 * (1/3) reaches 1, 6 * (1/3)
# falls short of 2 and skips the second refresh): frequencies that are powers of
# two, whose sums are exact. heavyball's dampening (random noise added to the
# gradient that fits the factors) is off: eqxopt has none.
KL_SHAMPOO = {
    "square, eps=1e-12": (((4, 4), (6, 6), (3, 3)), 2, 1e-12, 0.0, 2048, 1e-11),
    "non-square, decay": (((6, 4), (5, 7), (8, 3)), 4, 1e-8, 0.01, 2048, 1e-7),
    "one-sided, 3-D, 1-D, size-1 axis": (
        ((4, 12), (2, 3, 3), (5,), (1, 6), (7, 7)),
        4,
        1e-8,
        0.01,
        8,
        1e-7,
    ),
}


@pytest.mark.parametrize("config", list(KL_SHAMPOO), ids=list(KL_SHAMPOO))
def test_kl_shampoo_matches_heavyball_klshampoo(float64_heavyball, config):
    shapes, frequency, eps, decay, max_dim, tolerance = KL_SHAMPOO[config]
    start, grads = _problem(shapes)
    kw = dict(
        shampoo_beta=0.9,
        eps=eps,
        weight_decay=decay,
        precondition_frequency=frequency,
        max_precond_dim=max_dim,
        init_factor=0.1,
    )
    expected = _heavyball_run(
        heavyball.KLShampoo,
        start,
        grads,
        lr=0.01,
        betas=(0.9, 0.95),
        dampening=0.0,
        **kw,
    )
    with enable_x64():
        actual = _eqxopt_run(eqxopt.KLShampoo(0.01, b1=0.9, **kw), start, grads)
    # Measured: 4e-14 (eps 1e-12), 1e-8 and 3e-9 (eps 1e-8: heavyball lifts each
    # QR's input by eps times the factor's largest eigenvalue, eqxopt does not).
    difference = _largest_difference(actual, expected)
    assert difference < tolerance, difference
    assert _largest_difference(expected[-1:], [start]) > 0.05


def test_kl_shampoo_errors_name_the_argument():
    with pytest.raises(
        ValueError, match=r"init_factor must be in \(0.0, inf\], got 0.0"
    ):
        eqxopt.KLShampoo(init_factor=0.0)
    with pytest.raises(
        ValueError, match=r"shampoo_beta must be in \[0.0, 1.0\), got 1.0"
    ):
        eqxopt.KLShampoo(shampoo_beta=1.0)
    with pytest.raises(
        ValueError, match="precondition_frequency must be an int >= 1, got 0"
    ):
        eqxopt.KLShampoo(precondition_frequency=0)
    with pytest.raises(TypeError, match=r"KLShampoo supports real .*\['w'\]"):
        eqxopt.KLShampoo().init({"w": jnp.ones((2, 2), jnp.complex64)})
