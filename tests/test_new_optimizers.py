"""LaProp, AdamMini, NorMuon and MARS against transcriptions of their authors'
reference update rules (torch, float32, as their code runs), over 30+ steps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import eqxopt
from helpers import (
    assert_histories_close,
    grad_stream,
    nested_tree,
    run_eqxopt,
    run_torch,
)

STEPS = 30
PARAMS = nested_tree()
GRADS = list(grad_stream(PARAMS, STEPS))


def run_step(opt, params, grads):
    """The parameters after each fused `opt.step`."""
    state = opt.init(params)
    history = []
    for g in grads:
        params, state = opt.step(g, state, params)
        history.append(params)
    return history


# --------------------------------------------------------------------------------------
# LaProp
# --------------------------------------------------------------------------------------


class TorchLaProp(torch.optim.Optimizer):
    """The update of the authors' `laprop.py` (Z. Ziyin, LaProp-Optimizer), without
    its `amsgrad` and `centered` options: the learning rate rides inside the
    momentum and its running average is the momentum's bias correction; the decay
    shrinks the stepped parameter by `1 - weight_decay`."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-15, weight_decay=0.0):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr = group["lr"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state.update(lr_avg=0.0, one_avg=0.0)
                    state.update(mu=torch.zeros_like(p), nu=torch.zeros_like(p))
                state["nu"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                state["lr_avg"] = state["lr_avg"] * b1 + (1 - b1) * lr
                state["one_avg"] = state["one_avg"] * b2 + (1 - b2)
                step_size = lr / state["lr_avg"]
                denom = (state["nu"] / state["one_avg"]).sqrt_().add_(group["eps"])
                state["mu"].mul_(b1).add_(p.grad / denom, alpha=(1 - b1) * lr)
                p.add_(state["mu"], alpha=-step_size)
                if group["weight_decay"] != 0:
                    p.add_(p, alpha=-group["weight_decay"])


def _matrix_groups(tensors, **decay):
    """torch parameter groups: the matrices (and higher) with `decay`, the rest
    without (the mask `ndim >= 2`)."""
    return [
        {"params": [t for t in tensors if t.ndim >= 2], **decay},
        {"params": [t for t in tensors if t.ndim < 2], "weight_decay": 0.0},
    ]


def _is_matrix(params):
    return jax.tree.map(lambda p: p.ndim >= 2, params)


@pytest.mark.parametrize("fused", [False, True], ids=["update", "step"])
def test_laprop_matches_the_authors_code(fused):
    opt = eqxopt.LaProp(3e-2, b1=0.8, b2=0.95, eps=1e-8)
    actual = (run_step if fused else run_eqxopt)(opt, PARAMS, GRADS)
    expected = run_torch(
        lambda ts: TorchLaProp(ts, 3e-2, betas=(0.8, 0.95), eps=1e-8), PARAMS, GRADS
    )
    assert_histories_close(actual, expected)


def test_laprop_decay_and_mask_match_the_authors_code():
    opt = eqxopt.LaProp(2e-2, weight_decay=0.01, mask=_is_matrix)
    actual = run_step(opt, PARAMS, GRADS)
    expected = run_torch(
        lambda ts: TorchLaProp(_matrix_groups(ts, weight_decay=0.01), 2e-2),
        PARAMS,
        GRADS,
    )
    assert_histories_close(actual, expected)


def test_laprop_schedule_keeps_the_learning_rate_outside_the_momentum():
    # The paper's form: lr(step) * mu / (1 - b1**t), with a changing lr.
    schedule = eqxopt.WarmupCosine(5e-2, 1e-3, 5, STEPS)
    actual = run_step(eqxopt.LaProp(schedule), PARAMS, GRADS)
    b1, b2, eps = 0.9, 0.999, 1e-15
    leaves = jax.tree.leaves(PARAMS)
    p = [np.asarray(x, np.float64) for x in leaves]
    mu = [np.zeros_like(x) for x in p]
    nu = [np.zeros_like(x) for x in p]
    for t, g_tree in enumerate(GRADS, start=1):
        lr = float(schedule(jnp.int32(t - 1)))
        for i, g in enumerate(jax.tree.leaves(g_tree)):
            g = np.asarray(g, np.float64)
            nu[i] = b2 * nu[i] + (1 - b2) * g * g
            mu[i] = b1 * mu[i] + (1 - b1) * g / (np.sqrt(nu[i] / (1 - b2**t)) + eps)
            p[i] = p[i] - lr * mu[i] / (1 - b1**t)
    for a, e in zip(jax.tree.leaves(actual[-1]), p):
        np.testing.assert_allclose(np.asarray(a, np.float64), e, rtol=2e-5, atol=2e-6)


def test_laprop_errors_name_the_argument():
    with pytest.raises(ValueError, match="b1"):
        eqxopt.LaProp(1e-3, b1=1.0)
    with pytest.raises(ValueError, match="b2"):
        eqxopt.LaProp(1e-3, b2=0.0)
    with pytest.raises(ValueError, match="eps"):
        eqxopt.LaProp(1e-3, eps=0.0)
    with pytest.raises(ValueError, match="weight_decay"):
        eqxopt.LaProp(1e-3, weight_decay=-0.1)
    with pytest.raises(ValueError, match="learning_rate"):
        eqxopt.LaProp(-1e-3)


# --------------------------------------------------------------------------------------
# AdamMini
# --------------------------------------------------------------------------------------


def _torch_blocks(x, partition):
    """`x` as `(blocks, block size)`, the blocks as `AdamMini(partition=...)` cuts
    them (torch's `(out, in)` layout: the authors' per-output-neuron blocks are
    `view(out, -1)`)."""
    if x.ndim < 2 or partition == "leaf":
        return x.reshape(1, -1)
    if partition == "rows":
        return x.reshape(x.shape[0], -1)
    return x.reshape(-1, x.shape[-1]).T  # "columns"


class TorchAdamMini(torch.optim.Optimizer):
    """The update of the authors' `Adam_mini` (zyushun/Adam-mini) for one block
    partition: one `vmean` per block, the decay `p *= 1 - lr * weight_decay` before
    the step."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, partition="leaf"):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                state = self.state[p]
                grad = _torch_blocks(p.grad, partition)
                if not state:
                    state.update(step=0, m=torch.zeros_like(grad))
                    state["vmean"] = torch.zeros(grad.shape[0], 1)
                state["vmean"].mul_(b2).add_(
                    torch.mean(grad * grad, dim=1, keepdim=True), alpha=1 - b2
                )
                state["step"] += 1
                if wd > 0.0:
                    p.mul_(1 - lr * wd)
                state["m"].lerp_(grad, 1 - b1)
                c1 = 1 - b1 ** state["step"]
                c2 = 1 - b2 ** state["step"]
                h = (state["vmean"].sqrt() / c2**0.5).add_(eps)
                update = state["m"] * ((1 / c1) / h)
                if partition == "columns" and p.ndim >= 2:
                    update = update.T
                p.add_(update.reshape(p.shape), alpha=-lr)


class _Partitioned(TorchAdamMini):
    def __init__(self, params, partition, **kw):
        super().__init__(params, **kw)
        self.partition = partition

    def step(self):
        super().step(self.partition)


@pytest.mark.parametrize("partition", ["leaf", "rows", "columns"])
def test_adam_mini_matches_the_authors_code(partition):
    opt = eqxopt.AdamMini(
        2e-2, b2=0.95, weight_decay=0.05, partition=partition, mask=_is_matrix
    )
    actual = run_step(opt, PARAMS, GRADS)
    expected = run_torch(
        lambda ts: _Partitioned(
            _matrix_groups(ts, weight_decay=0.05),
            partition,
            lr=2e-2,
            betas=(0.9, 0.95),
        ),
        PARAMS,
        GRADS,
    )
    assert_histories_close(actual, expected)


def test_adam_mini_update_agrees_with_step():
    opt = eqxopt.AdamMini(1e-2, partition="rows")
    stepped = run_step(opt, PARAMS, GRADS)
    updated = run_eqxopt(opt, PARAMS, GRADS)
    assert_histories_close(updated, stepped, rtol=1e-6, atol=1e-7)


def _state_bytes(state):
    return sum(x.nbytes for x in jax.tree.leaves(state))


def test_adam_mini_state_is_about_one_copy_of_the_parameters():
    # A model of matrices: its state is the first moment plus one float per row.
    key = iter(jax.random.split(jax.random.key(0), 4))
    params = {
        "embed": jax.random.normal(next(key), (512, 64)),
        "layers": [jax.random.normal(next(key), (256, 64)) for _ in range(2)],
        "head": jax.random.normal(next(key), (512, 64)),
    }
    param_bytes = _state_bytes(params)
    mini = _state_bytes(eqxopt.AdamMini(1e-3, partition="rows").init(params))
    leafwise = _state_bytes(eqxopt.AdamMini(1e-3).init(params))
    adamw = _state_bytes(eqxopt.AdamW(1e-3).init(params))
    assert mini < 1.1 * param_bytes  # measured 1.016: 1 + 1/64 per row, and the step
    assert leafwise < 1.001 * param_bytes
    assert adamw > 1.99 * param_bytes


def test_adam_mini_errors_name_the_argument():
    with pytest.raises(ValueError, match="partition"):
        eqxopt.AdamMini(1e-3, partition="heads")
    with pytest.raises(ValueError, match="b2"):
        eqxopt.AdamMini(1e-3, b2=1.0)
    with pytest.raises(ValueError, match="eps"):
        eqxopt.AdamMini(1e-3, eps=0.0)
    with pytest.raises(ValueError, match="weight_decay"):
        eqxopt.AdamMini(1e-3, weight_decay=-1.0)
