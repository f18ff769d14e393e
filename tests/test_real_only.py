"""The real-only declaration (`real_only = RealOnly(...)` on a class) rejects complex
leaves at `init`, `update` and the fused `step` alike, naming the leaf; ADOPT's
only while `clip=True`."""

import jax
import jax.numpy as jnp
import pytest

import eqxopt


def trees():
    params = {"a": jnp.ones(3, jnp.complex64), "b": jnp.ones((2, 2))}
    return params, jax.tree.map(jnp.real, params)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: eqxopt.ADOPT(1e-2), r"ADOPT\(clip=True\) supports real parameters"),
        (lambda: eqxopt.SOAP(1e-2), r"SOAP supports real parameters"),
        (lambda: eqxopt.ClipByValue(1.0), r"ClipByValue supports real gradients"),
    ],
)
def test_step_rejects_complex_leaves_like_update(make, message):
    params, real = trees()
    opt = make()
    state = opt.init(real)
    for entry in (opt.update, opt.step):
        with pytest.raises(
            TypeError, match=message + r" only; \w+\['a'\] is complex64"
        ):
            entry(params, state, params)


def test_adopt_without_clip_takes_complex_leaves():
    params, _ = trees()
    opt = eqxopt.ADOPT(1e-2, clip=False)
    new, _ = opt.step(params, opt.init(params), params)
    assert new["a"].dtype == jnp.complex64
