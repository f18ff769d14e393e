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
    """The update of the authors' `laprop.py` (Z. Ziyin, LaProp-Optimizer): the
    learning rate rides inside the momentum and its running average is the
    momentum's bias correction; the decay shrinks the stepped parameter by
    `1 - weight_decay`. Their `centered` branch names a variable it never defines
    (`exp_mean_avg_beta2`, for the mean `exp_mean_avg_sq` it keeps); it is read
    here as that mean, subtracted from step 11 on."""

    def __init__(
        self,
        params,
        lr,
        betas=(0.9, 0.999),
        eps=1e-15,
        weight_decay=0.0,
        amsgrad=False,
        centered=False,
    ):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.amsgrad, self.centered = amsgrad, centered
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr = group["lr"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state.update(step=0, lr_avg=0.0, one_avg=0.0)
                    state.update(mu=torch.zeros_like(p), nu=torch.zeros_like(p))
                    state.update(mean=torch.zeros_like(p), nu_max=torch.zeros_like(p))
                state["step"] += 1
                state["nu"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                state["lr_avg"] = state["lr_avg"] * b1 + (1 - b1) * lr
                state["one_avg"] = state["one_avg"] * b2 + (1 - b2)
                step_size = lr / state["lr_avg"]
                denom = state["nu"]
                if self.centered:
                    state["mean"].mul_(b2).add_(p.grad, alpha=1 - b2)
                    if state["step"] > 10:
                        denom = denom - state["mean"] ** 2
                if self.amsgrad and not (self.centered and state["step"] <= 10):
                    torch.max(state["nu_max"], denom, out=state["nu_max"])
                    denom = state["nu_max"]
                denom = (denom / state["one_avg"]).sqrt_().add_(group["eps"])
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


# Gradients with a mean well away from zero, so that centering matters.
BIASED_GRADS = [jax.tree.map(lambda g: g + 1.5, g) for g in GRADS]


@pytest.mark.parametrize(
    "options",
    [{"centered": True}, {"amsgrad": True}, {"centered": True, "amsgrad": True}],
    ids=["centered", "amsgrad", "centered-amsgrad"],
)
@pytest.mark.parametrize("fused", [False, True], ids=["update", "step"])
def test_laprop_options_match_the_authors_code(options, fused):
    opt = eqxopt.LaProp(1e-2, b1=0.8, b2=0.9, eps=1e-8, **options)
    actual = (run_step if fused else run_eqxopt)(opt, PARAMS, BIASED_GRADS)
    expected = run_torch(
        lambda ts: TorchLaProp(ts, 1e-2, betas=(0.8, 0.9), eps=1e-8, **options),
        PARAMS,
        BIASED_GRADS,
    )
    assert_histories_close(actual, expected)
    state = opt.init(PARAMS)
    assert (state.mean is not None) == options.get("centered", False)
    assert (state.nu_max is not None) == options.get("amsgrad", False)


def test_laprop_centering_changes_the_steps_from_the_eleventh_on():
    plain = run_eqxopt(eqxopt.LaProp(1e-2, b2=0.9), PARAMS, BIASED_GRADS[:11])
    centered = eqxopt.LaProp(1e-2, b2=0.9, centered=True)
    centered = run_eqxopt(centered, PARAMS, BIASED_GRADS[:11])
    assert_histories_close(centered[:10], plain[:10], rtol=0, atol=0)
    # Step 11 divides by the root of the variance, smaller than the second moment.
    gap = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(jax.tree.leaves(centered[10]), jax.tree.leaves(plain[10]))
    )
    assert gap > 1e-3


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


# --------------------------------------------------------------------------------------
# NorMuon
# --------------------------------------------------------------------------------------

NS_EPS = 1e-7


def _torch_newton_schulz(x, coeffs=(3.4445, -4.7750, 2.0315), steps=5):
    """Jordan's `zeropower_via_newtonschulz5`, in float32 (the authors' runs in
    bfloat16)."""
    a, b, c = coeffs
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + NS_EPS)
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if tall else x


class TorchNorMuon(torch.optim.Optimizer):
    """The authors' NorMuon (zichongli5/NorMuon `normuon_update`, single device):
    a group with `normuon=True` gets NorMuon, the others their Adam group's update;
    both decay `p *= 1 - lr * weight_decay` first."""

    def __init__(self, groups, lr, weight_decay=0.0, nesterov=True):
        defaults = dict(lr=lr, weight_decay=weight_decay, nesterov=nesterov)
        defaults.update(beta=0.95, beta2=0.95, betas=(0.9, 0.999), normuon=True)
        super().__init__(groups, defaults)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                state = self.state[p]
                p.mul_(1 - lr * wd)
                if group["normuon"]:
                    if not state:
                        state["momentum"] = torch.zeros_like(p)
                        state["second"] = torch.zeros_like(p[..., 0:1])
                    p.add_(self._normuon(p.grad.clone(), state, group), alpha=-lr)
                else:
                    b1, b2 = group["betas"]
                    if not state:
                        state.update(step=0, m=torch.zeros_like(p))
                        state["v"] = torch.zeros_like(p)
                    state["step"] += 1
                    state["m"].lerp_(p.grad, 1 - b1)
                    state["v"].lerp_(p.grad.square(), 1 - b2)
                    m = state["m"] / (1 - b1 ** state["step"])
                    v = state["v"] / (1 - b2 ** state["step"])
                    p.add_(m / (v.sqrt() + 1e-8), alpha=-lr)

    @staticmethod
    def _normuon(grad, state, group):
        beta, beta2 = group["beta"], group["beta2"]
        momentum, second = state["momentum"], state["second"]
        momentum.lerp_(grad, 1 - beta)
        update = grad.lerp_(momentum, beta) if group["nesterov"] else momentum
        update = _torch_newton_schulz(update)
        vnorm = update.norm(dim=(-2, -1), keepdim=True)
        second.lerp_(torch.mean(update * update, dim=-1, keepdim=True), 1 - beta2)
        update = update / (second.sqrt() + 1e-10)
        update = update * (vnorm / (update.norm(dim=(-2, -1), keepdim=True) + 1e-10))
        return update * max(1, grad.size(-2) / grad.size(-1)) ** 0.5


MATRICES = {
    "tall": jnp.asarray(np.random.default_rng(3).normal(size=(6, 3)), jnp.float32),
    "wide": jnp.asarray(np.random.default_rng(4).normal(size=(3, 5)), jnp.float32),
    "b": jnp.asarray(np.random.default_rng(5).normal(size=(5,)), jnp.float32),
}
MATRIX_GRADS = list(grad_stream(MATRICES, STEPS, seed=6))


def _normuon_groups(tensors):
    return [
        {"params": [t for t in tensors if t.ndim == 2]},
        {"params": [t for t in tensors if t.ndim < 2], "normuon": False},
    ]


@pytest.mark.parametrize("nesterov", [True, False])
def test_normuon_matches_the_authors_code(nesterov):
    opt = eqxopt.NorMuon(
        2e-2, weight_decay=0.05, adam_weight_decay=0.05, eps=NS_EPS, nesterov=nesterov
    )
    actual = run_step(opt, MATRICES, MATRIX_GRADS)
    expected = run_torch(
        lambda ts: TorchNorMuon(
            _normuon_groups(ts), 2e-2, weight_decay=0.05, nesterov=nesterov
        ),
        MATRICES,
        MATRIX_GRADS,
    )
    assert_histories_close(actual, expected)


class TorchNorMuonRMS(TorchNorMuon):
    """The paper's scaling: each matrix's step has RMS `rms` (before the learning
    rate)."""

    rms = 0.2

    @staticmethod
    def _normuon(grad, state, group):
        update = TorchNorMuon._normuon(grad, state, group)
        m, n = update.shape[-2:]
        rms = TorchNorMuonRMS.rms
        return update * (rms * (m * n) ** 0.5 / update.norm(dim=(-2, -1), keepdim=True))


def test_normuon_consistent_rms_sets_the_rms_of_the_step():
    opt = eqxopt.NorMuon(2e-2, eps=NS_EPS, consistent_rms=0.2)
    actual = run_step(opt, MATRICES, MATRIX_GRADS)
    expected = run_torch(
        lambda ts: TorchNorMuonRMS(_normuon_groups(ts), 2e-2), MATRICES, MATRIX_GRADS
    )
    assert_histories_close(actual, expected)
    step = np.asarray(actual[1]["tall"]) - np.asarray(actual[0]["tall"])
    np.testing.assert_allclose(np.sqrt(np.mean(step**2)), 0.2 * 2e-2, rtol=1e-5)


def test_normuon_on_a_stack_of_matrices_by_mask():
    params = {"stack": jnp.stack([MATRICES["tall"], 2 * MATRICES["tall"]])}
    grads = [{"stack": jnp.stack([g["tall"], -g["tall"]])} for g in MATRIX_GRADS]
    opt = eqxopt.NorMuon(2e-2, eps=NS_EPS, muon_mask={"stack": True})
    actual = run_step(opt, params, grads)
    assert actual[-1]["stack"].shape == (2, 6, 3)
    # Each matrix of the stack is its own NorMuon matrix.
    alone = run_step(eqxopt.NorMuon(2e-2, eps=NS_EPS), MATRICES, MATRIX_GRADS)
    np.testing.assert_allclose(
        actual[-1]["stack"][0], alone[-1]["tall"], rtol=2e-5, atol=2e-6
    )


def test_normuon_errors_name_the_argument():
    with pytest.raises(ValueError, match="beta2"):
        eqxopt.NorMuon(1e-3, beta2=1.0)
    with pytest.raises(ValueError, match="consistent_rms"):
        eqxopt.NorMuon(1e-3, consistent_rms=0.0)
    with pytest.raises(ValueError, match="ns_coeffs"):
        eqxopt.NorMuon(1e-3, ns_coeffs=(1.0, 2.0))
    with pytest.raises(ValueError, match=r"muon_mask selects params\['b'\]"):
        eqxopt.NorMuon(1e-3, muon_mask={"b": True, "tall": True, "wide": True}).init(
            MATRICES
        )


# --------------------------------------------------------------------------------------
# MARS
# --------------------------------------------------------------------------------------


class TorchMARS(torch.optim.Optimizer):
    """The authors' MARS (AGI-Arena/MARS `mars.py`), `mars_type="mars-adamw"`, its
    approximate form (`is_approx=True`: the previous step's gradient) with
    `optimize_1d=True` (MARS on every parameter)."""

    def __init__(self, params, lr, betas=(0.95, 0.99), eps=1e-8, weight_decay=0.0):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.gamma = 0.025

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            b1, b2 = group["betas"]
            for p in group["params"]:
                state, grad = self.state[p], p.grad
                if not state:
                    state.update(step=0, last_grad=torch.zeros_like(p))
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                c = (grad - state["last_grad"]).mul(self.gamma * (b1 / (1.0 - b1)))
                c = c.add(grad)
                norm = torch.norm(c)
                if norm > 1.0:
                    c = c / norm
                state["exp_avg"].mul_(b1).add_(c, alpha=1.0 - b1)
                state["exp_avg_sq"].mul_(b2).addcmul_(c, c, value=1.0 - b2)
                c1 = 1.0 - b1 ** state["step"]
                c2 = 1.0 - b2 ** state["step"]
                denom = state["exp_avg_sq"].sqrt().mul(1 / c2**0.5).add(eps).mul(c1)
                p.add_(-lr * torch.mul(p, wd).add(state["exp_avg"].div(denom)))
                state["last_grad"] = grad.clone()


# Gradients of norms on both sides of the clipping threshold 1.
MARS_GRADS = [
    jax.tree.map(lambda g, k=k: g * (0.05 if k % 3 else 1.0), g)
    for k, g in enumerate(GRADS)
]


@pytest.mark.parametrize("fused", [False, True], ids=["update", "step"])
def test_mars_matches_the_authors_code(fused):
    opt = eqxopt.MARS(1e-2, weight_decay=0.05, mask=_is_matrix)
    actual = (run_step if fused else run_eqxopt)(opt, PARAMS, MARS_GRADS)
    expected = run_torch(
        lambda ts: TorchMARS(_matrix_groups(ts, weight_decay=0.05), 1e-2),
        PARAMS,
        MARS_GRADS,
    )
    assert_histories_close(actual, expected)


def test_mars_clipping_is_of_the_corrected_gradient():
    # Both sides of the threshold are exercised: some leaves' corrected gradients
    # have norm above 1 and some below.
    def corrected_norms(k):
        g, prev = MARS_GRADS[k], MARS_GRADS[k - 1]
        c = jax.tree.map(lambda a, b: a + 0.025 * 0.95 / 0.05 * (a - b), g, prev)
        return [float(jnp.linalg.norm(x)) for x in jax.tree.leaves(c)]

    norms = [n for k in range(1, STEPS) for n in corrected_norms(k)]
    assert min(norms) < 1.0 < max(norms)
    # Without the clip the steps are others.
    clipped = run_step(eqxopt.MARS(1e-2), PARAMS, MARS_GRADS)
    unclipped = run_step(eqxopt.MARS(1e-2, clip_norm=None), PARAMS, MARS_GRADS)
    assert not np.allclose(clipped[-1]["dense"]["w"], unclipped[-1]["dense"]["w"])


def test_mars_errors_name_the_argument():
    with pytest.raises(ValueError, match="gamma"):
        eqxopt.MARS(1e-3, gamma=-0.1)
    with pytest.raises(ValueError, match="clip_norm"):
        eqxopt.MARS(1e-3, clip_norm=0.0)
    with pytest.raises(ValueError, match="b1"):
        eqxopt.MARS(1e-3, b1=1.0)
    with pytest.raises(ValueError, match="weight_decay"):
        eqxopt.MARS(1e-3, weight_decay=-1.0)
