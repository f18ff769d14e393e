"""Writes the benchmark figures that README.md and docs/performance.md show, from one
source: benchmarks/results.json (the last `make bench`).

Each figure table sits between `<!-- figures: NAME -->` and `<!-- end figures -->`;
run `python docs/make_figures.py` from the repository root after `make bench` to
write them anew. tests/test_figures.py checks that the committed pages are what this
script writes, and that every count of the catalog in README, docs and CHANGELOG is
the catalog's.
"""

import json
import pathlib
import re
from collections.abc import Callable

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results.json"
PAGES = [ROOT / "README.md", ROOT / "docs" / "performance.md"]

# The train-step models, as bench_train_step.py names them, and as the pages do.
MODELS = {
    "transformer 28.7M (width 768), 1x16 tokens": (
        "transformer LM, width 768 (28.7M params), batch 1 x 16 tokens"
    ),
    "transformer 3.3M, 16x128 tokens": (
        "transformer LM, 3.3M params, batch 16 x 128 tokens"
    ),
    "CNN 1.2M, batch 64 of 28x28": "CNN, 1.2M params, batch 64",
    "MLP 32 layers of 64, batch 256": "MLP, 32 layers of 64, batch 256",
}
BIG = "transformer 28.7M (width 768), 1x16 tokens"
SMALL = "transformer 3.3M, 16x128 tokens"


def ratio(x: float) -> str:
    """A ratio as the pages write it: two decimals, one significant digit below
    0.1 (0.005)."""
    return f"{x:.2f}" if x >= 0.095 else f"{x:.1g}"


def met(value: float, target: float) -> str:
    return "met" if value <= target else "not met"


def _variant(results: dict, model: str, name: str) -> dict:
    return results["train_step"][model]["variants"][name]


def _peak(results: dict, model: str, name: str) -> float:
    peak = _variant(results, model, name)["memory"]["peak_bytes"]
    return peak / _variant(results, model, "optax")["memory"]["peak_bytes"]


def _compile_s(times: dict) -> float:
    return times["trace_s"] + times["lower_s"] + times["compile_s"]


def readme(results: dict) -> str:
    helper = lambda model, path: ratio(  # noqa: E731
        _variant(results, model, f"eqxopt helper {path}")["ratio"]
    )
    adamw = results["big_leaf"]["adamw"]
    many = results["many_leaves"]["many_2000x1000"]
    packed_step = many["step_ms"]["eqxopt packed"] / many["step_ms"]["optax jit"]
    packed_compile = _compile_s(many["compile"]["eqxopt packed"]) / _compile_s(
        many["compile"]["optax jit"]
    )
    compiles = results["recompiles"]["compiles"]
    steps = results["recompiles"]["steps_after_first"]
    memory = results["state_memory"]["memory"]
    rows = [
        (
            "whole train step, transformer LM of 28.7M params on 1 x 16 tokens "
            "(`make_train_step`)",
            f"{helper(BIG, 'native')}x the throughput ({helper(BIG, 'xla')}x with "
            "`EQXOPT_NATIVE=0`, XLA's code as on GPUs)",
        ),
        (
            "whole train step, transformer LM of 3.3M params on 16 x 128 tokens",
            f"{helper(SMALL, 'native')}x ({helper(SMALL, 'xla')}x with "
            "`EQXOPT_NATIVE=0`; forward and backward dominate)",
        ),
        (
            "AdamW, one 16M-float leaf, donated step",
            f"{ratio(adamw['eqxopt step donate'] / adamw['optax jit donate'])}x "
            "the time",
        ),
        (
            "AdamW, 2000 leaves of 1000 floats, packed (`eqxopt.pack`): step / compile",
            f"{ratio(packed_step)}x / {ratio(packed_compile)}x the time",
        ),
        (
            f"a new learning rate every step, {steps} steps",
            f"{compiles['eqxopt AdamW(lr).step']} compiles (optax under `jax.jit`: "
            f"{compiles['optax.adamw(lr) under jax.jit']})",
        ),
        (
            "AdamW state with `Blockwise8bit()` / `Blockwise4bit()` moments",
            f"{memory['8-bit']['state_bytes_per_param']:.2f} / "
            f"{memory['4-bit']['state_bytes_per_param']:.2f} bytes per parameter "
            f"(float32: {memory['float32']['state_bytes_per_param']:.0f})",
        ),
    ]
    lines = ["| case | eqxopt / optax |", "| --- | --- |"]
    return "\n".join(lines + [f"| {case} | {value} |" for case, value in rows])


def train_step(results: dict) -> str:
    lines = [
        "| model | `make_train_step` | by hand | `make_train_step`, native kernels off"
        " | by hand, native kernels off | `make_train_step` by CPU time"
        " | peak memory vs optax (`make_train_step` / by hand) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for model, label in MODELS.items():
        helper = _variant(results, model, "eqxopt helper native")
        cells = [
            f"**{ratio(helper['ratio'])}**",
            ratio(_variant(results, model, "eqxopt by hand native")["ratio"]),
            ratio(_variant(results, model, "eqxopt helper xla")["ratio"]),
            ratio(_variant(results, model, "eqxopt by hand xla")["ratio"]),
            ratio(helper["cpu_ratio"]),
            f"{_peak(results, model, 'eqxopt helper native'):.3f} / "
            f"{_peak(results, model, 'eqxopt by hand native'):.3f}",
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def optimizer(results: dict) -> str:
    adamw, sgd = results["big_leaf"]["adamw"], results["big_leaf"]["sgd_momentum"]
    many = results["many_leaves"]["many_2000x1000"]
    tree = results["many_leaves"]["transformer"]
    tiny = results["overhead"]["tiny tree (2 leaves)"]
    memory = results["memory"]
    compiles = results["recompiles"]["compiles"]
    steps = results["recompiles"]["steps_after_first"]
    donated, optax_donated = adamw["eqxopt step donate"], adamw["optax jit donate"]
    floor = adamw["memory floor"]
    floor_all = adamw["memory floor, all cores (native loop)"]
    sgd_floor = sgd["memory floor, all cores (native loop)"]
    packed_ms, optax_ms = many["step_ms"]["eqxopt packed"], many["step_ms"]["optax jit"]
    packed_step = packed_ms / optax_ms
    optax_compile = _compile_s(many["compile"]["optax jit"])
    packed_s = _compile_s(many["compile"]["eqxopt packed"])
    packed_compile = packed_s / optax_compile
    tree_step = many["step_ms"]["eqxopt step"] / many["step_ms"]["optax jit"]
    tree_compile = _compile_s(many["compile"]["eqxopt step"]) / optax_compile
    t_ms = tree["step_ms"]["eqxopt step donate"]
    t_optax_ms = tree["step_ms"]["optax jit donate"]
    t_step = t_ms / t_optax_ms
    t_packed = tree["step_ms"]["eqxopt packed donate"] / t_optax_ms
    t_compile = _compile_s(tree["compile"]["eqxopt step donate"])
    t_optax_compile = _compile_s(tree["compile"]["optax jit donate"])
    nd_step = tree["step_ms"]["eqxopt step"] / tree["step_ms"]["optax jit"]
    nd_compile = _compile_s(tree["compile"]["eqxopt step"]) / _compile_s(
        tree["compile"]["optax jit"]
    )
    call = tiny["eqxopt opt.step"] / tiny["optax jax.jit step"]
    leaf_temp = memory["one 16M leaf, eqxopt step donate"]
    tree_temp = memory["transformer tree, eqxopt step donate"]
    aliased = all(
        m["aliased_MB"] >= m["output_MB"] - 0.01 for m in (leaf_temp, tree_temp)
    )
    ms = lambda a, b: f"{a:.1f} vs {b:.1f} ms"  # noqa: E731
    rows = [
        (
            "AdamW, one 16M leaf, `step(..., donate=True)` vs optax jitted and donated",
            f"{ratio(donated / optax_donated)} ({ms(donated, optax_donated)})",
            f"<= 1.0: {met(donated / optax_donated, 1.0)}",
        ),
        (
            "the same vs the memory floor (a donated XLA op moving 28 bytes per "
            "parameter, one core)",
            f"{ratio(donated / floor)} (floor {floor:.2f} ms; torch `fused=True` "
            f"{adamw['torch fused']:.2f} ms)",
            f"<= 1.3: {met(donated / floor, 1.3)}",
        ),
        (
            "the same vs the memory floor on all cores (the floor's op as eqxopt's "
            "one-pass native loop)",
            f"{ratio(donated / floor_all)} ({ms(donated, floor_all)})",
            f"<= 1.1: {met(donated / floor_all, 1.1)}",
        ),
        (
            "SGD with momentum, one 16M leaf, donated",
            f"{ratio(sgd['eqxopt step donate'] / sgd['optax jit donate'])} vs optax; "
            f"{ratio(sgd['eqxopt step donate'] / sgd_floor)} of its all-cores floor",
            "",
        ),
        (
            "AdamW, 2000 leaves of 1000 floats, packed (`eqxopt.pack`): step / "
            "trace + lower + compile",
            f"{ratio(packed_step)} ({ms(packed_ms, optax_ms)}) / "
            f"{ratio(packed_compile)} ({packed_s:.2f} vs {optax_compile:.1f} s)",
            f"<= 0.2 / <= 0.1: {met(max(packed_step / 0.2, packed_compile / 0.1), 1.0)}"
            " with the packed layout",
        ),
        (
            "the same as a tree of 2000 leaves (not donated: XLA's code): step / "
            "compile",
            f"{ratio(tree_step)} / {ratio(tree_compile)} (the per-array cost of "
            "crossing `jit` dominates the step; the packed layout above is the answer)",
            f"<= 0.2 / <= 0.1: {met(max(tree_step / 0.2, tree_compile / 0.1), 1.0)}"
            " as a tree",
        ),
        (
            "transformer-shaped tree (148 leaves, 24.6M params), donated step",
            f"{ratio(t_step)} ({ms(t_ms, t_optax_ms)}); packed: {ratio(t_packed)}",
            f"<= 0.8: {met(t_step, 0.8)}",
        ),
        (
            "the same, trace + lower + compile, donated",
            f"{ratio(t_compile / t_optax_compile)} ({t_compile:.2f} vs "
            f"{t_optax_compile:.2f} s)",
            f"<= 0.5: {met(t_compile / t_optax_compile, 0.5)}",
        ),
        (
            "the same, not donated: step / trace + lower + compile",
            f"{ratio(nd_step)} / {ratio(nd_compile)} (XLA's code, as optax)",
            "",
        ),
        (
            "direct `opt.step` call on a 2-leaf tree vs a `jax.jit` optax step",
            f"{ratio(call)} ({tiny['eqxopt opt.step'] * 1e3:.1f} vs "
            f"{tiny['optax jax.jit step'] * 1e3:.1f} us); `eqx.filter_jit(opt.step)`: "
            f"{ratio(tiny['eqx.filter_jit(opt.step)'] / tiny['optax jax.jit step'])}",
            f"<= 1.5: {met(call, 1.5)}",
        ),
        (
            f"a new learning rate every step, {steps} steps",
            f"{compiles['eqxopt AdamW(lr).step']} compiles (optax under `jax.jit`: "
            f"{compiles['optax.adamw(lr) under jax.jit']}; `inject_hyperparams`: "
            f"{compiles['optax.inject_hyperparams']})",
            f"0: {met(compiles['eqxopt AdamW(lr).step'], 0)}",
        ),
        (
            "donated step, temporaries (XLA memory analysis)",
            f"{leaf_temp['temp_MB'] * 1e6:.0f} bytes on the 16M leaf, "
            f"{tree_temp['temp_MB'] * 1e3:.0f} KB on the transformer tree; "
            + ("all outputs alias the inputs" if aliased else "not all outputs alias"),
            "none as large as params: "
            + met(max(leaf_temp["temp_MB"], tree_temp["temp_MB"]), 1.0),
        ),
    ]
    lines = ["| case | eqxopt / reference | target |", "| --- | --- | --- |"]
    return "\n".join(lines + [f"| {a} | {b} | {c} |" for a, b, c in rows])


def state_memory(results: dict) -> str:
    memory = results["state_memory"]["memory"]
    rows = [
        ("float32", "float32", ""),
        ("bf16", "bf16", ""),
        ("`Blockwise8bit()`", "8-bit", 2.1),
        ("`Blockwise4bit()`", "4-bit", 1.1),
        ("`BlockwiseFp8()`", "fp8", ""),
        ("`Companded8bit()`", "companded", ""),
        ("`ErrorCorrectedBf16()`", "bf16+int8", ""),
    ]
    lines = ["| moments | state bytes per parameter | target |", "| --- | --- | --- |"]
    for label, key, target in rows:
        value = memory[key]["state_bytes_per_param"]
        goal = f"<= {target}: {met(value, target)}" if target else ""
        lines.append(f"| {label} | {value:.2f} | {goal} |")
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[dict], str]] = {
    "readme": readme,
    "train_step": train_step,
    "optimizer": optimizer,
    "state_memory": state_memory,
}
_BLOCK = re.compile(r"(<!-- figures: (\w+) -->\n)(.*?)(<!-- end figures -->)", re.S)


def render(page: pathlib.Path, results: dict | None = None) -> str:
    """`page` with every figures block written anew from `results`."""
    if results is None:
        results = json.loads(RESULTS.read_text())

    def block(match: re.Match) -> str:
        return match.group(1) + BLOCKS[match.group(2)](results) + "\n" + match.group(4)

    return _BLOCK.sub(block, page.read_text())


def main() -> None:
    for page in PAGES:
        page.write_text(render(page))
        print(f"wrote {page.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
