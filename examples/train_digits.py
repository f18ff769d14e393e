"""Train a small CNN on scikit-learn's handwritten digits with eqxopt.

`make demo` runs this script. It trains an Equinox CNN on the 8x8 digits that
scikit-learn ships (1797 images, no download) with `eqxopt.AdamW` and an
`eqxopt.WarmupCosine` learning-rate schedule, passing the whole model
(activation function included) to `opt.init` / `opt.step` without `eqx.filter`.
Training images are moved by up to one pixel at random (seeded), the only
augmentation. It prints a progress bar with the loss and the current learning
rate, writes a PNG with the loss curve and the schedule, and ends with a
one-line summary. It exits with status 1 if the test accuracy is below 97%.

    python examples/train_digits.py [--steps N] [--quick] [--out PATH]
                                    [--no-progress]

The pieces (`load_data`, `CNN`, `make_optimizer`, `train`, `plot`) are
importable; `tests/test_demo.py` runs a shortened `train`.
"""

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

import eqxopt

DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "train_digits.png"
TARGET_ACCURACY = 0.97


# ------------------------------------------------------------------------- data


@dataclasses.dataclass(frozen=True)
class Digits:
    """The digits split once, with a fixed seed: images are `(N, 1, 8, 8)` in
    `[0, 1]`, labels are int32 class indices."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_data(seed: int = 0, test_fraction: float = 0.2) -> Digits:
    """scikit-learn's bundled 8x8 digits, split stratified by class."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    # (1797, 64) in 0..16, (1797,)
    pixels, labels = load_digits(return_X_y=True)
    x = (np.asarray(pixels, np.float32) / 16.0).reshape(-1, 1, 8, 8)
    y = np.asarray(labels, np.int32)
    x_train, x_test, y_train, y_test = (
        np.asarray(a)
        for a in train_test_split(
            x, y, test_size=test_fraction, random_state=seed, stratify=y
        )
    )
    return Digits(x_train, y_train, x_test, y_test)


# ------------------------------------------------------------------------ model


class CNN(eqx.Module):
    """Two 3x3 convolutions, a 2x2 max-pool and two linear layers, for one image
    of shape `(1, 8, 8)`; returns 10 logits. `activation` is a plain function
    leaf: the optimizer is given the whole module and leaves it alone."""

    conv1: eqx.nn.Conv2d
    conv2: eqx.nn.Conv2d
    pool: eqx.nn.MaxPool2d
    hidden: eqx.nn.Linear
    head: eqx.nn.Linear
    activation: Callable[[Array], Array]

    def __init__(self, key: Array, channels: int = 32, width: int = 128):
        k1, k2, k3, k4 = jax.random.split(key, 4)
        self.conv1 = eqx.nn.Conv2d(1, channels // 2, 3, padding=1, key=k1)
        self.conv2 = eqx.nn.Conv2d(
            channels // 2, channels, 3, padding=1, key=k2
        )
        self.pool = eqx.nn.MaxPool2d(2, stride=2)
        self.hidden = eqx.nn.Linear(channels * 4 * 4, width, key=k3)
        self.head = eqx.nn.Linear(width, 10, key=k4)
        self.activation = jax.nn.relu

    def __call__(self, x: Float[Array, "1 8 8"]) -> Float[Array, "10"]:
        x = self.activation(self.conv1(x))
        x = self.pool(self.activation(self.conv2(x)))
        x = self.activation(self.hidden(jnp.ravel(x)))
        return self.head(x)


def loss_fn(
    model: CNN, x: Float[Array, "b 1 8 8"], y: Int[Array, " b"]
) -> Float[Array, ""]:
    """Mean softmax cross-entropy."""
    logits = jax.vmap(model)(x)
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probs, y[:, None], axis=1))


@eqx.filter_jit
def accuracy(
    model: CNN, x: Float[Array, "n 1 8 8"], y: Int[Array, " n"]
) -> Array:
    return jnp.mean(jnp.argmax(jax.vmap(model)(x), axis=1) == y)


# -------------------------------------------------------------------- optimizer


def make_optimizer(
    total_steps: int,
    peak_lr: float = 3e-3,
    warmup_fraction: float = 0.1,
    weight_decay: float = 1e-2,
) -> eqxopt.AdamW:
    """AdamW with a linear warmup to `peak_lr` and a cosine decay to 1% of
    it."""
    warmup = max(1, int(warmup_fraction * total_steps))
    schedule = eqxopt.WarmupCosine(
        peak_lr=peak_lr,
        min_lr=0.01 * peak_lr,
        warmup_steps=warmup,
        total_steps=total_steps,
    )
    return eqxopt.AdamW(schedule, weight_decay=weight_decay)


def augment(
    x: Float[Array, "b 1 8 8"], key: Array, shift: int
) -> Float[Array, "b 1 8 8"]:
    """Moves each image by up to `shift` pixels in each direction (zero
    fill)."""
    if shift == 0:
        return x
    padded = jnp.pad(x, ((0, 0), (0, 0), (shift, shift), (shift, shift)))
    offsets = jax.random.randint(key, (x.shape[0], 2), 0, 2 * shift + 1)

    def crop(image, offset):
        return jax.lax.dynamic_slice(
            image, (0, offset[0], offset[1]), (1, 8, 8)
        )

    return jax.vmap(crop)(padded, offsets)


def augmented_loss(
    model: CNN,
    x_all: Float[Array, "n 1 8 8"],
    y_all: Int[Array, " n"],
    batch: Int[Array, " b"],
    key: Array,
    step: Array,
    shift: int = 1,
) -> Float[Array, ""]:
    """The loss on `x_all[batch]`, each image moved by up to `shift` pixels with
    a key folded from `key` and the step number."""
    x = augment(x_all[batch], jax.random.fold_in(key, step), shift)
    return loss_fn(model, x, y_all[batch])


def make_train_step(opt: eqxopt.AdamW) -> eqxopt.TrainStep:
    """The compiled train step: `step(model, state, *loss_args) -> (model,
    state, loss)`, the loss's gradients and the fused AdamW step in one `jit`
    that updates model and state in place (`eqxopt.make_train_step`). The
    optimizer's hyperparameters (schedule values included) are arguments of the
    compiled program: a new `make_optimizer(...)` of the same shape reuses it.
    The whole model goes in: the activation function gets no gradient and passes
    through.

    Written by hand, the same step is:

        @eqx.filter_jit(donate="all-except-first") def train_step(opt, model,
        state, *loss_args): loss, grads =
        eqx.filter_value_and_grad(augmented_loss)(model, *loss_args) model,
        state = opt.step(grads, state, model, donate=True) return model, state,
        loss
    """
    return eqxopt.make_train_step(augmented_loss, opt)


@eqx.filter_jit
def schedule_values(schedule: eqxopt.AbstractSchedule, steps: int) -> Array:
    """The schedule at steps `0 .. steps - 1`, in one vectorised call."""
    return schedule(jnp.arange(steps, dtype=jnp.int32))


# ------------------------------------------------------------------------ train


@dataclasses.dataclass
class Result:
    """What `train` returns."""

    model: CNN
    losses: np.ndarray  # training loss at each step, shape (steps,)
    lrs: np.ndarray  # learning rate used at each step, shape (steps,)
    schedule: np.ndarray  # the schedule over every step, shape (steps,)
    test_accuracy: float
    train_seconds: float  # the training loop, first (compiling) step included
    steps_per_second: float  # over the steps after the first


def batches(n: int, batch_size: int, steps: int, seed: int) -> np.ndarray:
    """`(steps, batch_size)` indices: reshuffled epochs, last partial batch
    dropped, all from one seeded generator."""
    rng = np.random.default_rng(seed)
    per_epoch = n // batch_size
    epochs = -(-steps // per_epoch)
    order = np.concatenate(
        [rng.permutation(n)[: per_epoch * batch_size] for _ in range(epochs)]
    )
    return (
        order[: steps * batch_size].reshape(steps, batch_size).astype(np.int32)
    )


def train(
    steps: int = 600,
    batch_size: int = 32,
    seed: int = 0,
    peak_lr: float = 3e-3,
    weight_decay: float = 1e-2,
    shift: int = 1,
    data: Digits | None = None,
    progress: bool = True,
    log_every: int = 20,
) -> Result:
    """Trains a `CNN` on the digits; deterministic for a given `seed`."""
    from tqdm import tqdm

    data = load_data(seed) if data is None else data
    x_train, y_train = jnp.asarray(data.x_train), jnp.asarray(data.y_train)
    index = jnp.asarray(batches(len(data.y_train), batch_size, steps, seed))

    model_key, augment_key = jax.random.split(jax.random.key(seed))
    model = CNN(model_key)
    opt = make_optimizer(steps, peak_lr=peak_lr, weight_decay=weight_decay)
    state = opt.init(model)  # the whole module, no eqx.filter
    train_step = make_train_step(opt)
    # The rate of each step: the schedule at the optimizer's step count, which
    # counts the steps from 0 (checked after the loop).
    schedule = np.asarray(schedule_values(opt.learning_rate, steps))
    step_numbers = jnp.arange(steps, dtype=jnp.int32)

    losses: list[Array] = []
    start = time.perf_counter()
    first_done = start
    if progress:
        # The first call compiles the step (tens of seconds on a 2-core CPU)
        # before the bar can move: say so.
        print(
            "compiling the train step (the first step waits for XLA)...",
            flush=True,
        )
    bar = tqdm(
        range(steps), desc="compiling", unit="step", disable=not progress
    )
    for i in bar:
        # Model and state are donated (updated in place): keep only the new
        # ones.
        model, state, loss = train_step(
            model,
            state,
            x_train,
            y_train,
            index[i],
            augment_key,
            step_numbers[i],
            shift,
        )
        losses.append(loss)
        if i == 0:
            loss.block_until_ready()
            first_done = time.perf_counter()
            bar.set_description("train")
            if progress:
                seconds = first_done - start
                bar.write(f"compiled and ran the first step in {seconds:.1f} s")
        if i % log_every == 0 or i == steps - 1:
            # Reading the values waits for the step; only every `log_every`
            # steps.
            bar.set_postfix(loss=f"{float(loss):.4f}", lr=f"{schedule[i]:.2e}")
    jax.block_until_ready(model)
    end = time.perf_counter()
    bar.close()
    assert int(state.step) == steps

    test_accuracy = float(
        accuracy(model, jnp.asarray(data.x_test), jnp.asarray(data.y_test))
    )
    return Result(
        model=model,
        losses=np.asarray(jnp.stack(losses)),
        lrs=schedule,
        schedule=schedule,
        test_accuracy=test_accuracy,
        train_seconds=end - start,
        steps_per_second=(steps - 1) / max(end - first_done, 1e-9),
    )


# ------------------------------------------------------------------------- plot


def plot(result: Result, path: str | os.PathLike[str]) -> Path:
    """Writes a PNG: training loss (raw and smoothed, log scale) above the
    learning-rate schedule. Creates the parent directory."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    steps = np.arange(len(result.losses))
    window = max(1, len(steps) // 40)
    smooth = np.convolve(result.losses, np.ones(window) / window, mode="valid")

    fig, (ax_loss, ax_lr) = plt.subplots(
        2, 1, figsize=(8, 6), sharex=True, height_ratios=(3, 2)
    )
    ax_loss.plot(
        steps,
        result.losses,
        color="tab:blue",
        alpha=0.3,
        lw=0.8,
        label="per batch",
    )
    ax_loss.plot(
        steps[window - 1 :],
        smooth,
        color="tab:blue",
        lw=2,
        label=f"moving average ({window} steps)",
    )
    ax_loss.set_yscale("log")
    ax_loss.set_ylabel("training loss (cross-entropy)")
    ax_loss.grid(True, which="both", alpha=0.3)
    ax_loss.legend(loc="upper right")
    ax_loss.set_title(
        f"eqxopt.AdamW + WarmupCosine on sklearn digits: "
        f"test accuracy {100 * result.test_accuracy:.2f}%"
    )

    peak = int(np.argmax(result.schedule))
    ax_lr.plot(
        steps,
        result.schedule,
        color="tab:orange",
        lw=2,
        label=f"WarmupCosine: peak {result.schedule[peak]:.1e} at step {peak}",
    )
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("step")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    ax_lr.grid(True, alpha=0.3)
    ax_lr.legend(loc="upper right")

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    wall_start = time.perf_counter()
    parser = argparse.ArgumentParser(
        description="Train a small CNN on the sklearn digits with eqxopt."
    )
    parser.add_argument("--steps", type=int, default=600, help="training steps")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="300 steps (a smoke run; may miss 97%%)",
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--lr", type=float, default=3e-3, help="peak learning rate"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="PNG path"
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar"
    )
    args = parser.parse_args(argv)
    steps = 300 if args.quick else args.steps

    result = train(
        steps=steps,
        batch_size=args.batch_size,
        seed=args.seed,
        peak_lr=args.lr,
        progress=not args.no_progress,
    )
    png = plot(result, args.out)
    wall = time.perf_counter() - wall_start
    print(f"wrote {png}")
    ok = result.test_accuracy >= TARGET_ACCURACY
    print(
        f"test accuracy {100 * result.test_accuracy:.2f}% "
        f"({'>=' if ok else 'BELOW'} {100 * TARGET_ACCURACY:.0f}%) | "
        f"{steps} steps at {result.steps_per_second:.0f} steps/s | "
        f"final loss {result.losses[-20:].mean():.4f} | "
        f"wall time {wall:.1f} s after imports"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
