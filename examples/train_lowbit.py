"""Low-bit optimizer state and bf16 parameters on a real language-modelling
   task.

Trains a small byte-level transformer language model (written here in Equinox)
on the Python standard library's own source (the `.py` files in
`sysconfig.get_paths()["stdlib"]`, no download) with `eqxopt.AdamW` in several
precision set-ups, the same warmup + cosine schedule, data order and
initialisation for each, and compares their validation losses:

- `f32`: float32 parameters and moments (the reference);
- `8bit`, `4bit`: float32 parameters, both moments `eqxopt.Blockwise8bit()` /
  `eqxopt.Blockwise4bit()`;
- `bf16-master`: float32 master weights, the model run on their bf16 rounding
  (the usual mixed-precision set-up: 4 bytes of master copy per parameter);
- `bf16`: bf16 parameters updated in place, no master copy (plain rounding);
- `bf16-sr`: bf16 parameters, `eqxopt.StochasticRounding(AdamW, key=seed)`;
- `bf16-kahan`: bf16 parameters, `eqxopt.KahanSummation(AdamW)`.

The bf16 set-ups keep float32 moments, so the only difference between them is
how the parameter update is applied. The forward and backward passes compute in
float32 in every set-up (bf16 parameters are upcast inside the loss), so what is
compared is the optimizer's storage, not bf16 arithmetic.

    python examples/train_lowbit.py [--steps 1000] [--seeds 0 1 2]
                                    [--peak-lr 2e-3] [--configs f32 8bit ...]
                                    [--out examples/out] [--quick]
                                    [--update-sizes]

Writes `lowbit_lm.json` (settings, curves, final losses) and `lowbit_lm.png`
(the validation curves) into `--out`. `--update-sizes` instead measures how
large each configuration's update is against f32's on the same batches
(`update_sizes.json`). The pieces (`load_text`, `TransformerLM`, `CONFIGS`,
`train_one`, `update_sizes`, `summarise`, `plot`) are importable;
`tests/test_train_lowbit.py` runs a tiny version end to end.
"""

import argparse
import dataclasses
import json
import math
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

import eqxopt

DEFAULT_OUT = Path(__file__).resolve().parent / "out"
VOCAB = 256  # bytes


# ------------------------------------------------------------------------- data


@dataclasses.dataclass(frozen=True)
class Text:
    """The corpus as bytes (`uint8` arrays) and the files it came from."""

    train: np.ndarray
    valid: np.ndarray
    train_files: int
    valid_files: int
    root: str


def load_text(max_bytes: int | None = None) -> Text:
    """The top-level `.py` files of the running Python's standard library, in
    sorted order; every tenth file (index 9, 19, ...) is held out for
    validation, so validation text is code from modules never trained on.
    `max_bytes` caps each split (for quick runs)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py"))
    if not files:
        raise RuntimeError(f"no .py files in the standard library at {root}")
    train, valid = [], []
    for i, path in enumerate(files):
        (valid if i % 10 == 9 else train).append(path.read_bytes())
    sep = b"\n\n"

    def join(parts: list[bytes]) -> np.ndarray:
        data = sep.join(parts)
        if max_bytes is not None:
            data = data[:max_bytes]
        return np.frombuffer(data, np.uint8)

    return Text(join(train), join(valid), len(train), len(valid), str(root))


def windows(data: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """`(len(starts), length + 1)` int32 windows of `data` (inputs and
    targets)."""
    idx = starts[:, None] + np.arange(length + 1)[None, :]
    return data[idx].astype(np.int32)


# ------------------------------------------------------------------------ model


class Block(eqx.Module):
    """Pre-norm transformer block: causal multi-head self-attention, then a GELU
    MLP of width `4 * dim`, each with a residual connection."""

    ln1: eqx.nn.LayerNorm
    qkv: eqx.nn.Linear
    proj: eqx.nn.Linear
    ln2: eqx.nn.LayerNorm
    fc1: eqx.nn.Linear
    fc2: eqx.nn.Linear
    heads: int = eqx.field(static=True)

    def __init__(self, dim: int, heads: int, *, key: Array):
        k1, k2, k3, k4 = jax.random.split(key, 4)
        self.ln1 = eqx.nn.LayerNorm(dim)
        self.qkv = eqx.nn.Linear(dim, 3 * dim, key=k1)
        self.proj = eqx.nn.Linear(dim, dim, key=k2)
        self.ln2 = eqx.nn.LayerNorm(dim)
        self.fc1 = eqx.nn.Linear(dim, 4 * dim, key=k3)
        self.fc2 = eqx.nn.Linear(4 * dim, dim, key=k4)
        self.heads = heads

    def __call__(self, x: Float[Array, "T D"]) -> Float[Array, "T D"]:
        t, d = x.shape
        h = jax.vmap(self.ln1)(x)
        q, k, v = jnp.split(jax.vmap(self.qkv)(h), 3, axis=-1)
        q, k, v = (a.reshape(t, self.heads, d // self.heads) for a in (q, k, v))
        scores = jnp.einsum("thd,shd->hts", q, k) / math.sqrt(d // self.heads)
        causal = jnp.tril(jnp.ones((t, t), bool))
        scores = jnp.where(causal, scores, -jnp.inf)
        att = jnp.einsum("hts,shd->thd", jax.nn.softmax(scores, axis=-1), v)
        x = x + jax.vmap(self.proj)(att.reshape(t, d))
        h = jax.vmap(self.ln2)(x)
        return x + jax.vmap(self.fc2)(jax.nn.gelu(jax.vmap(self.fc1)(h)))


class TransformerLM(eqx.Module):
    """Byte-level causal language model: token and position embeddings, `depth`
    blocks, a final layer norm and an untied output layer; returns `(T, 256)`
    logits for `T <= context` tokens."""

    embed: eqx.nn.Embedding
    pos: Float[Array, "C D"]
    blocks: tuple[Block, ...]
    ln: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(
        self, dim: int, depth: int, heads: int, context: int, *, key: Array
    ):
        ke, kp, kh, *kb = jax.random.split(key, 3 + depth)
        self.embed = eqx.nn.Embedding(VOCAB, dim, key=ke)
        self.pos = 0.02 * jax.random.normal(kp, (context, dim))
        self.blocks = tuple(Block(dim, heads, key=k) for k in kb)
        self.ln = eqx.nn.LayerNorm(dim)
        self.head = eqx.nn.Linear(dim, VOCAB, use_bias=False, key=kh)

    def __call__(self, tokens: Int[Array, " T"]) -> Float[Array, "T 256"]:
        x = jax.vmap(self.embed)(tokens) + self.pos[: tokens.shape[0]]
        for block in self.blocks:
            x = block(x)
        return jax.vmap(self.head)(jax.vmap(self.ln)(x))


def cross_entropy(model: TransformerLM, batch: Int[Array, "B T1"]) -> Array:
    """Mean next-byte cross entropy (nats) of `batch[:, 1:]` given
    `batch[:, :-1]`."""
    logits = jax.vmap(model)(batch[:, :-1])
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, batch[:, 1:, None], axis=-1)
    return -jnp.mean(picked)


def _cast_floats(tree: Any, dtype: Any) -> Any:
    return jax.tree.map(
        lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, tree
    )


def _loss(model: TransformerLM, batch: Int[Array, "B T1"]) -> Array:
    # Float32 arithmetic whatever the parameters' dtype.
    return cross_entropy(_cast_floats(model, jnp.float32), batch)


def _loss_bf16_forward(
    model: TransformerLM, batch: Int[Array, "B T1"]
) -> Array:
    # The model as bf16 parameters would give it: master weights rounded to
    # bf16.
    return _loss(_cast_floats(model, jnp.bfloat16), batch)


# Module-level functions, so that every seed reuses the compiled programs.
_evaluate = eqx.filter_jit(_loss)
_evaluate_bf16_forward = eqx.filter_jit(_loss_bf16_forward)


# --------------------------------------------------------------- configurations


@dataclasses.dataclass(frozen=True)
class Config:
    """One precision set-up: the parameters' storage dtype, the optimizer (given
    the schedule and the seed) and whether the model runs on the bf16 rounding
    of float32 master weights."""

    name: str
    label: str
    param_dtype: Any
    make_opt: Callable[
        [eqxopt.WarmupCosine, float, int], eqxopt.AbstractTransform
    ]
    bf16_forward: bool = False


def _adamw(schedule, wd, **kw):
    return eqxopt.AdamW(schedule, weight_decay=wd, **kw)


_F32 = {"mu_dtype": jnp.float32, "nu_dtype": jnp.float32}
_Q8 = {"mu_dtype": eqxopt.Blockwise8bit(), "nu_dtype": eqxopt.Blockwise8bit()}
_Q4 = {"mu_dtype": eqxopt.Blockwise4bit(), "nu_dtype": eqxopt.Blockwise4bit()}
_COMPANDED = {
    "mu_dtype": eqxopt.Companded8bit(),
    "nu_dtype": eqxopt.Companded8bit(),
}
_ECC = {
    "mu_dtype": eqxopt.ErrorCorrectedBf16(),
    "nu_dtype": eqxopt.ErrorCorrectedBf16(),
}

CONFIGS: dict[str, Config] = {
    c.name: c
    for c in [
        Config(
            "f32", "f32 AdamW", jnp.float32, lambda s, wd, seed: _adamw(s, wd)
        ),
        Config(
            "8bit",
            "AdamW, 8-bit moments",
            jnp.float32,
            lambda s, wd, seed: _adamw(s, wd, **_Q8),
        ),
        Config(
            "4bit",
            "AdamW, 4-bit moments",
            jnp.float32,
            lambda s, wd, seed: _adamw(s, wd, **_Q4),
        ),
        Config(
            "companded",
            "AdamW, companded 8-bit moments",
            jnp.float32,
            lambda s, wd, seed: _adamw(s, wd, **_COMPANDED),
        ),
        Config(
            "bf16",
            "bf16 params, plain rounding",
            jnp.bfloat16,
            lambda s, wd, seed: _adamw(s, wd, **_F32),
        ),
        Config(
            "bf16-sr",
            "bf16 params, StochasticRounding",
            jnp.bfloat16,
            lambda s, wd, seed: eqxopt.StochasticRounding(
                _adamw(s, wd, **_F32), key=seed
            ),
        ),
        Config(
            "bf16-kahan",
            "bf16 params, KahanSummation",
            jnp.bfloat16,
            lambda s, wd, seed: eqxopt.KahanSummation(_adamw(s, wd, **_F32)),
        ),
        Config(
            "bf16-ecc",
            "bf16 params, ErrorCorrection",
            jnp.bfloat16,
            lambda s, wd, seed: eqxopt.ErrorCorrection(
                _adamw(s, wd, **_F32), key=seed
            ),
        ),
        Config(
            "bf16-ecc-moments",
            "bf16 params, ErrorCorrection, error-corrected bf16 moments",
            jnp.bfloat16,
            lambda s, wd, seed: eqxopt.ErrorCorrection(
                _adamw(s, wd, **_ECC), key=seed
            ),
        ),
        Config(
            "bf16-master",
            "bf16 model, f32 master weights",
            jnp.float32,
            lambda s, wd, seed: _adamw(s, wd, **_F32),
            bf16_forward=True,
        ),
    ]
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Model size, batch and schedule, the same for every configuration."""

    steps: int = 1000
    dim: int = 96
    depth: int = 2
    heads: int = 4
    context: int = 64
    batch: int = 16
    peak_lr: float = 2e-3
    min_lr: float = 1e-4
    warmup: int = 100
    weight_decay: float = 0.1
    eval_every: int = 100
    eval_windows: int = 256
    max_bytes: int | None = None


def quantized_fraction(model: TransformerLM, storage: Any) -> float:
    """The fraction of the parameters whose moments `storage` quantizes (leaves
    under its `min_size` stay float32)."""
    leaves = [a for a in jax.tree.leaves(model) if eqx.is_inexact_array(a)]
    total = sum(a.size for a in leaves)
    return sum(a.size for a in leaves if storage.quantizes(a)) / total


# --------------------------------------------------------------------- training


def train_one(
    config: Config, seed: int, text: Text, settings: Settings, log=print
) -> dict[str, Any]:
    """Train one configuration with one seed; returns its curves: `steps` at
    which the validation loss `valid` was measured, the mean training loss
    `train` over each interval, the final validation loss and the seconds
    taken."""
    s = settings
    model = TransformerLM(
        s.dim, s.depth, s.heads, s.context, key=jax.random.key(seed)
    )
    model = _cast_floats(model, config.param_dtype)
    schedule = eqxopt.WarmupCosine(s.peak_lr, s.min_lr, s.warmup, s.steps)
    opt = config.make_opt(schedule, s.weight_decay, seed)
    state = opt.init(model)

    loss_fn = _loss_bf16_forward if config.bf16_forward else _loss
    train_step = eqxopt.make_train_step(loss_fn, opt)
    evaluate = _evaluate_bf16_forward if config.bf16_forward else _evaluate

    # The data order depends on the seed only: every configuration sees the same
    # batches for a seed. The validation windows are the same for every run.
    rng = np.random.default_rng(seed)
    starts = rng.integers(
        0, text.train.size - s.context - 1, (s.steps, s.batch)
    )
    vstarts = np.random.default_rng(12345).integers(
        0, text.valid.size - s.context - 1, s.eval_windows
    )
    vbatch = jnp.asarray(windows(text.valid, vstarts, s.context))

    steps, valid, train = [], [], []
    running, count, t0 = 0.0, 0, time.perf_counter()
    for i in range(s.steps):
        batch = jnp.asarray(windows(text.train, starts[i], s.context))
        model, state, loss = train_step(model, state, batch)
        running, count = running + float(loss), count + 1
        done = i + 1
        if done % s.eval_every == 0 or done == s.steps:
            v = float(evaluate(model, vbatch))
            steps.append(done)
            valid.append(v)
            train.append(running / count)
            running, count = 0.0, 0
            log(
                f"  {config.name:>11} seed {seed} step {done:5d} "
                f"train {train[-1]:.4f} valid {v:.4f} "
                f"({time.perf_counter() - t0:.0f} s)"
            )
            if not math.isfinite(v):
                break
    return {
        "steps": steps,
        "valid": valid,
        "train": train,
        "final_valid": valid[-1],
        "seconds": time.perf_counter() - t0,
    }


def update_sizes(
    names: list[str], seed: int, text: Text, settings: Settings
) -> dict[str, np.ndarray]:
    """Per configuration (float32 parameters only), the root mean square of
    AdamW's update at every step over the leaves quantized moments cover (the
    same batches and initialisation for each): how large a step each storage
    takes."""
    s = settings
    model0 = TransformerLM(
        s.dim, s.depth, s.heads, s.context, key=jax.random.key(seed)
    )
    covered = eqxopt.Blockwise8bit().quantizes
    starts = np.random.default_rng(seed).integers(
        0, text.train.size - s.context - 1, (s.steps, s.batch)
    )
    schedule = eqxopt.WarmupCosine(s.peak_lr, s.min_lr, s.warmup, s.steps)
    sizes = {}
    for name in names:
        opt = CONFIGS[name].make_opt(schedule, s.weight_decay, seed)

        @eqx.filter_jit
        def step(model, state, batch, opt=opt):
            grads = eqx.filter_grad(_loss)(model, batch)
            updates, state = opt.update(grads, state, model)
            leaves = [u for u in jax.tree.leaves(updates) if covered(u)]
            squares = sum(jnp.sum(jnp.square(u)) for u in leaves)
            rms = jnp.sqrt(squares / sum(u.size for u in leaves))
            return eqx.apply_updates(model, updates), state, rms

        model, state, rms = model0, opt.init(model0), []
        for i in range(s.steps):
            batch = jnp.asarray(windows(text.train, starts[i], s.context))
            model, state, size = step(model, state, batch)
            rms.append(float(size))
        sizes[name] = np.asarray(rms)
    return sizes


def summarise(runs: dict[str, dict[str, dict]]) -> dict[str, dict[str, float]]:
    """Per configuration: mean, min, max and standard deviation of the final
    validation loss over its seeds, and the mean's ratio to `f32`'s and to
    `bf16-master`'s (where those ran)."""
    out: dict[str, dict[str, float]] = {}
    for name, by_seed in runs.items():
        finals = np.array([r["final_valid"] for r in by_seed.values()])
        out[name] = {
            "mean": float(finals.mean()),
            "min": float(finals.min()),
            "max": float(finals.max()),
            "std": float(finals.std(ddof=1)) if finals.size > 1 else 0.0,
            "seeds": len(finals),
        }
    for ref in ("f32", "bf16-master"):
        if ref in out:
            for row in out.values():
                row[f"ratio_to_{ref}"] = row["mean"] / out[ref]["mean"]
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    """Validation loss against step (mean over seeds, min-max band) on the whole
    run and on its second half."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    styles = {
        "f32": ("black", "-"),
        "8bit": ("tab:blue", "--"),
        "4bit": ("tab:cyan", "--"),
        "bf16-master": ("tab:gray", ":"),
        "bf16": ("tab:red", "-"),
        "bf16-sr": ("tab:green", "-."),
        "bf16-kahan": ("tab:orange", "-."),
    }
    total = result["settings"]["steps"]
    for ax, start in zip(axes, (0, total // 2), strict=True):
        lo_all, hi_all = np.inf, -np.inf
        for name, by_seed in result["runs"].items():
            curves = [r for r in by_seed.values()]
            n = min(len(r["valid"]) for r in curves)
            steps = np.array(curves[0]["steps"][:n])
            vals = np.array([r["valid"][:n] for r in curves])
            keep = steps >= start
            mean = vals.mean(0)
            color, ls = styles.get(name, (None, "-"))
            label = CONFIGS[name].label if name in CONFIGS else name
            ax.plot(steps[keep], mean[keep], ls, color=color, label=label)
            ax.fill_between(
                steps[keep], vals.min(0)[keep], vals.max(0)[keep], color=color,
                alpha=0.15,
            )  # fmt: skip
            if keep.any():
                lo_all = min(lo_all, vals[:, keep].min())
                hi_all = max(hi_all, vals[:, keep].max())
        if start and np.isfinite(lo_all):
            pad = 0.05 * (hi_all - lo_all)
            ax.set_ylim(lo_all - pad, hi_all + pad)
        ax.set_xlabel("step")
        ax.set_ylabel("validation loss (nats per byte)")
        ax.grid(alpha=0.3)
    axes[0].set_title("whole run")
    axes[1].set_title("second half")
    axes[0].legend(fontsize=8)
    seeds = len(next(iter(result["runs"].values())))
    fig.suptitle(
        f"Byte-level transformer on the Python standard library, AdamW: "
        f"mean over {seeds} seeds, band = min..max"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=Settings.steps)
    parser.add_argument(
        "--peak-lr",
        type=float,
        default=Settings.peak_lr,
        help="the schedule's peak (the same for every configuration)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS)
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a tiny model and corpus (for the test): seconds, not minutes",
    )
    parser.add_argument(
        "--update-sizes",
        action="store_true",
        help="instead of the comparison: the RMS of each configuration's "
        "update per step against f32's (first seed), medians over tenths of "
        "the run",
    )
    args = parser.parse_args(argv)
    if args.quick:
        settings = Settings(
            steps=args.steps, dim=64, depth=1, heads=2, context=16, batch=4,
            warmup=2, eval_every=max(1, args.steps // 2), eval_windows=8,
            max_bytes=200_000, peak_lr=args.peak_lr,
        )  # fmt: skip
    else:
        settings = Settings(
            steps=args.steps,
            eval_every=max(1, args.steps // 20),
            peak_lr=args.peak_lr,
        )
    text = load_text(settings.max_bytes)
    s = settings
    probe = TransformerLM(
        s.dim, s.depth, s.heads, s.context, key=jax.random.key(0)
    )
    n_params = sum(
        a.size for a in jax.tree.leaves(probe) if eqx.is_inexact_array(a)
    )
    fractions = {
        "8bit": quantized_fraction(probe, eqxopt.Blockwise8bit()),
        "4bit": quantized_fraction(probe, eqxopt.Blockwise4bit()),
    }
    print(
        f"stdlib {text.root}: {text.train_files} files / "
        f"{text.train.size:,} bytes "
        f"train, {text.valid_files} files / {text.valid.size:,} bytes valid; "
        f"{n_params:,} parameters, quantized moments cover "
        f"{fractions['8bit']:.1%} (8-bit) / {fractions['4bit']:.1%} (4-bit) "
        "of them"
    )
    result: dict[str, Any] = {
        "settings": dataclasses.asdict(settings),
        "python": sys.version.split()[0],
        "stdlib": text.root,
        "train_bytes": int(text.train.size),
        "valid_bytes": int(text.valid.size),
        "parameters": n_params,
        "quantized_fraction": fractions,
        "command": "python examples/train_lowbit.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "runs": {},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    if args.update_sizes:
        names = ["f32", *(n for n in args.configs if n != "f32")]
        sizes = update_sizes(names, args.seeds[0], text, settings)
        tenth = max(1, s.steps // 10)
        print(
            f"{'steps':>11} "
            + " ".join(f"{n + ' / f32':>12}" for n in names[1:])
        )
        ratios = {}
        for n in names[1:]:
            r = sizes[n] / np.maximum(sizes["f32"], np.finfo(np.float32).tiny)
            ratios[n] = [
                float(np.median(r[a : a + tenth]))
                for a in range(0, s.steps, tenth)
            ]
        for k, a in enumerate(range(0, s.steps, tenth)):
            row = " ".join(f"{ratios[n][k]:12.4f}" for n in names[1:])
            print(f"{a + 1:>5}-{min(a + tenth, s.steps):<5} {row}")
        result["update_rms"] = {n: v.tolist() for n, v in sizes.items()}
        result["update_rms_ratio_by_tenth"] = ratios
        path = args.out / "update_sizes.json"
        path.write_text(json.dumps(result, indent=1))
        print(f"wrote {path}")
        return result
    json_path, png_path = (
        args.out / "lowbit_lm.json",
        args.out / "lowbit_lm.png",
    )
    # Seed by seed, so that partial results compare every configuration.
    for seed in args.seeds:
        for name in args.configs:
            run = train_one(CONFIGS[name], seed, text, settings)
            result["runs"].setdefault(name, {})[str(seed)] = run
            result["summary"] = summarise(result["runs"])
            # partial results
            json_path.write_text(json.dumps(result, indent=1))
    plot(result, png_path)
    print(
        f"{'config':>12} {'final valid (mean)':>19} {'min..max':>16} "
        f"{'/ f32':>7}"
    )
    for name, row in result["summary"].items():
        ratio = row.get("ratio_to_f32", float("nan"))
        print(
            f"{name:>12} {row['mean']:19.4f} "
            f"{row['min']:7.4f}..{row['max']:.4f} {ratio:7.4f}"
        )
    print(f"wrote {json_path} and {png_path}")
    return result


if __name__ == "__main__":
    main()
