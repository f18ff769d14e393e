"""Case 17: the optimizers added for issue 40 and 41 beside AdamW and Muon on one
model: state bytes per parameter (read from the state's arrays) and the median time
of a whole train step (`make_train_step`) over interleaved rounds, as a ratio to
AdamW's.

The model is an MLP of 4 hidden layers of width 512 (about 0.8M parameters, hidden
matrices 512 x 512) on a batch of 64, so the matrix optimizers' Newton-Schulz and
eigenbasis work weighs as it does in a small transformer.

    python benchmarks/bench_new_optimizers.py
    EQXOPT_BENCH_QUICK=1 python benchmarks/bench_new_optimizers.py

Results go to benchmarks/results.json under "new_optimizers".
"""

import functools
import os
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import eqxopt

sys.path.insert(0, os.path.dirname(__file__))
from _common import QUICK, Stepper, interleaved, machine, rounds, save, table

WIDTH, DEPTH, BATCH = (128, 2, 16) if QUICK else (512, 4, 64)


def optimizers() -> dict:
    return {
        "AdamW": eqxopt.AdamW(1e-3),
        "Muon": eqxopt.Muon(2e-2),
        "AdaMuon": eqxopt.AdaMuon(2e-2),
        "PolarGrad": eqxopt.PolarGrad(0.5),
        "Dion": eqxopt.Dion(2e-2),
        "Dion(rank_fraction=0.25)": eqxopt.Dion(2e-2, rank_fraction=0.25),
        "Dion(qr_method='cholesky')": eqxopt.Dion(2e-2, qr_method="cholesky"),
        "MuonClip (no attention)": eqxopt.MuonClip(2e-2, attention=_no_attention),
        "HyperBallAdamW": eqxopt.HyperBallAdamW(2e-2),
        "Scion": eqxopt.Scion(2e-2),
        "SOAP": eqxopt.SOAP(3e-3),
        "SOAP(factor_update='kl')": eqxopt.SOAP(3e-3, factor_update="kl", eps=1e-3),
        "KLShampoo": eqxopt.KLShampoo(3e-3),
        "APOLLO": eqxopt.APOLLO(1e-3),
        "APOLLOMini": eqxopt.APOLLOMini(1e-3),
        "OffloadState(AdamW)": eqxopt.OffloadState(eqxopt.AdamW(1e-3)),
        "AdamW, Companded8bit moments": eqxopt.AdamW(
            1e-3, mu_dtype=eqxopt.Companded8bit(), nu_dtype=eqxopt.Companded8bit()
        ),
        "AdamW, ErrorCorrectedBf16 moments": eqxopt.AdamW(
            1e-3, mu_dtype=ECC, nu_dtype=ECC
        ),
        # Below: bf16 parameters (the state bytes count the residual too).
        "bf16 ErrorCorrection(AdamW)": eqxopt.ErrorCorrection(
            eqxopt.AdamW(1e-3), key=0
        ),
        "bf16 ErrorCorrection(AdamW, ErrorCorrectedBf16 moments)": (
            eqxopt.ErrorCorrection(
                eqxopt.AdamW(1e-3, mu_dtype=ECC, nu_dtype=ECC), key=0
            )
        ),
    }


ECC = eqxopt.ErrorCorrectedBf16()


def _no_attention(model):
    return []


def _loss(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def _loss_with_logits(model, x, y):
    return _loss(model, x, y), []


def _state_bytes(state) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(state) if eqx.is_array(x))


def run(n_rounds: int | None = None) -> dict:
    n_rounds = n_rounds or rounds(10)
    device = jax.devices()[0]
    model = eqx.nn.MLP(WIDTH, WIDTH, WIDTH, DEPTH, key=jax.random.key(0))
    model = eqx.combine(jax.device_put(eqx.filter(model, eqx.is_array), device), model)
    n = sum(x.size for x in jax.tree.leaves(eqx.filter(model, eqx.is_array)))
    x = jax.random.normal(jax.random.key(1), (BATCH, WIDTH))
    y = jnp.tanh(x)
    steppers, state_bytes = {}, {}
    for name, opt in optimizers().items():
        clip = isinstance(opt, eqxopt.MuonClip)
        step = eqxopt.make_train_step(
            _loss_with_logits if clip else _loss, opt, has_aux=clip
        )
        dtype = jnp.bfloat16 if name.startswith("bf16") else None
        m = jax.tree.map(
            lambda a, dtype=dtype: (
                jnp.array(a, dtype=dtype, copy=True) if eqx.is_array(a) else a
            ),
            model,
        )
        s = opt.init(m)
        state_bytes[name] = _state_bytes(s) / n
        steppers[name] = Stepper(
            lambda ms, step=step: step(ms[0], ms[1], x, y)[:2], (m, s)
        )
    for name, tx in optax_optimizers().items():
        params, static = eqx.partition(model, eqx.is_array)
        params = jax.tree.map(lambda a: jnp.array(a, copy=True), params)

        @functools.partial(jax.jit, donate_argnums=(0, 1))
        def optax_step(params, opt_state, x, y, tx=tx, static=static):
            grads = jax.grad(lambda p: _loss(eqx.combine(p, static), x, y))(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        state_bytes[name] = _state_bytes(tx.init(params)) / n
        steppers[name] = Stepper(
            lambda ps, step=optax_step: step(*ps, x, y), (params, tx.init(params))
        )
    # Two warm-up calls: a first call commits uncommitted arguments (optax's
    # count), which compiles once more.
    times = interleaved(steppers, n_rounds, warmup=2)
    # AdamW against optax with ten steps dispatched back to back per timing, as a
    # training loop that does not wait for each step runs them.
    burst = {}
    for name in ("AdamW", "optax.adamw"):
        one = steppers[name]

        def ten(ps, fn=one.fn):
            for _ in range(10):
                ps = fn(ps)
            return ps

        burst[name] = Stepper(ten, one.state)
    burst_times = interleaved(burst, n_rounds, warmup=1)
    return {
        "params": n,
        "native": _native_on(),
        "state_bytes_per_param": state_bytes,
        "ms": {k: v * 1e3 for k, v in times.items()},
        "vs_adamw": {k: v / times["AdamW"] for k, v in times.items()},
        "vs_optax": {
            "AdamW": times["AdamW"] / times["optax.adamw"],
            "Muon": times["Muon"] / times["optax.contrib.muon"],
            "AdamW, ten steps per timing": burst_times["AdamW"]
            / burst_times["optax.adamw"],
        },
    }


def optax_optimizers() -> dict:
    """optax's AdamW and Muon with the same settings, stepped in one donated
    `jax.jit` by hand, as an optax user writes it."""
    return {
        "optax.adamw": optax.adamw(1e-3),
        "optax.contrib.muon": optax.contrib.muon(2e-2),
    }


def _native_on() -> bool:
    return os.environ.get("EQXOPT_NATIVE", "1") != "0"


def main() -> None:
    path = "native" if _native_on() else "XLA (EQXOPT_NATIVE=0)"
    print(f"New optimizers on {machine()['device']} ({jax.default_backend()}), {path}")
    r = run()
    rows = [
        (name, r["state_bytes_per_param"][name], r["ms"][name], r["vs_adamw"][name])
        for name in r["ms"]
    ]
    table(
        f"Train step of an MLP ({r['params'] / 1e6:.2f}M parameters)",
        rows,
        ("optimizer", "state bytes / param", "ms/step", "vs AdamW"),
    )
    print(
        f"against optax: AdamW {r['vs_optax']['AdamW']:.3g}x, "
        f"Muon {r['vs_optax']['Muon']:.3g}x (step time ratios); AdamW with ten "
        f"steps per timing {r['vs_optax']['AdamW, ten steps per timing']:.3g}x"
    )
    save("new_optimizers" if _native_on() else "new_optimizers_xla", r)


if __name__ == "__main__":
    main()
