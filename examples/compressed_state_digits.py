"""Compressed training state on the demo's model: the CNN of
`train_digits.py` (AdamW, the same warmup-cosine schedule, augmentation and 600
steps) trained with float32 parameters and moments, and with

- bf16 parameters and an int8 error-correction residual
  (`eqxopt.ErrorCorrection(AdamW)`: 3 bytes a parameter for the weights);
- the same with error-corrected bf16 moments (`ErrorCorrectedBf16`: 3 bytes a
  moment element);
- float32 parameters with FlashOptim's companded 8-bit moments
  (`Companded8bit`: 1.06 bytes a moment element),

over several seeds, printing each configuration's test accuracy and final
training loss (mean, spread) beside float32's, and writing them to
`examples/out/compressed_state_digits.json`:

    PYTHONPATH=src .venv/bin/python examples/compressed_state_digits.py
"""

import argparse
import json
import sys
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import eqxopt

sys.path.insert(0, str(Path(__file__).parent))
import train_digits as demo

OUT = Path(__file__).parent / "out" / "compressed_state_digits.json"
BF16 = jnp.bfloat16


def _cast(model, dtype):
    return jax.tree.map(
        lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, model
    )


def bf16_loss(model, x_all, y_all, batch, key, step, shift=1):
    """`train_digits.augmented_loss` with the images in the model's bf16 and the
    loss taken in float32."""
    x = demo.augment(x_all[batch], jax.random.fold_in(key, step), shift)
    logits = jax.vmap(model)(x.astype(BF16)).astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(
        jnp.take_along_axis(log_probs, y_all[batch][:, None], axis=1)
    )


NAMES = (
    "float32",
    "bf16 + ErrorCorrection",
    "bf16 + ErrorCorrection, ErrorCorrectedBf16 moments",
    "float32, Companded8bit moments",
)


def configurations(schedule, seed):
    """name -> (parameter dtype, optimizer), for each of `NAMES`."""

    def adamw(**kw):
        return eqxopt.AdamW(schedule, weight_decay=1e-2, **kw)

    ecc = eqxopt.ErrorCorrectedBf16()
    companded = eqxopt.Companded8bit()
    return {
        "float32": (jnp.float32, adamw()),
        "bf16 + ErrorCorrection": (
            BF16,
            eqxopt.ErrorCorrection(adamw(), key=seed),
        ),
        "bf16 + ErrorCorrection, ErrorCorrectedBf16 moments": (
            BF16,
            eqxopt.ErrorCorrection(adamw(mu_dtype=ecc, nu_dtype=ecc), key=seed),
        ),
        "float32, Companded8bit moments": (
            jnp.float32,
            adamw(mu_dtype=companded, nu_dtype=companded),
        ),
    }


def train(name, seed, steps, data):
    schedule = demo.make_optimizer(steps).learning_rate
    dtype, opt = configurations(schedule, seed)[name]
    model = _cast(demo.CNN(jax.random.split(jax.random.key(seed))[0]), dtype)
    state = opt.init(model)
    loss = demo.augmented_loss if dtype == jnp.float32 else bf16_loss
    step = eqxopt.make_train_step(loss, opt)
    x, y = jnp.asarray(data.x_train), jnp.asarray(data.y_train)
    index = jnp.asarray(demo.batches(len(data.y_train), 32, steps, seed))
    augment_key = jax.random.split(jax.random.key(seed))[1]
    losses = []
    for i in range(steps):
        model, state, value = step(
            model, state, x, y, index[i], augment_key, jnp.int32(i), 1
        )
        losses.append(value)
    accuracy = demo.accuracy(
        _cast(model, jnp.float32),
        jnp.asarray(data.x_test),
        jnp.asarray(data.y_test),
    )
    return {
        "test_accuracy": float(accuracy),
        "final_loss": float(jnp.mean(jnp.stack(losses[-20:]))),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    runs = {}
    for seed in args.seeds:
        data = demo.load_data(seed)
        for name in NAMES:
            run = train(name, seed, args.steps, data)
            runs.setdefault(name, {})[seed] = run
            print(f"{name} seed {seed}: {run}", flush=True)
    summary = {}
    for name, by_seed in runs.items():
        acc = np.array([r["test_accuracy"] for r in by_seed.values()])
        loss = np.array([r["final_loss"] for r in by_seed.values()])
        summary[name] = {
            "accuracy_mean": float(acc.mean()),
            "accuracy_min": float(acc.min()),
            "accuracy_max": float(acc.max()),
            "loss_mean": float(loss.mean()),
            "loss_min": float(loss.min()),
            "loss_max": float(loss.max()),
        }
    print(
        f"{'configuration':>52} {'test accuracy':>22} {'final train loss':>24}"
    )
    for name, s in summary.items():
        print(
            f"{name:>52} {100 * s['accuracy_mean']:6.2f}% "
            f"({100 * s['accuracy_min']:.2f}..{100 * s['accuracy_max']:.2f}) "
            f"{s['loss_mean']:.4f} ({s['loss_min']:.4f}..{s['loss_max']:.4f})"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"steps": args.steps, "runs": runs, "summary": summary}, indent=1
        )
    )
    print(f"wrote {args.out}")
    return summary


if __name__ == "__main__":
    main()
