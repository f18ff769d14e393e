"""Runs the benchmark cases (`make bench`), each in its own process, then draws
benchmarks/results.png from benchmarks/results.json and prints one line per ratio
of the train-step cases (eqxopt on each path, native kernels and XLA's own code,
against optax).

Set EQXOPT_BENCH_QUICK=1 for two rounds per case instead of the default repeats.
"""

import json
import os
import subprocess
import sys
import time

from _common import HERE, RESULTS, summary

MOF_FLAG = "--xla_backend_extra_options=xla_cpu_use_multi_output_fusion"
CASES = [
    "bench_train_step.py",
    "bench_packed_layers.py",
    "bench_big_leaf.py",
    "bench_big_leaf.py+mof",
    "bench_many_leaves.py",
    "bench_overhead.py",
    "bench_direct_call.py",
    "bench_recompiles.py",
    "bench_memory.py",
    "bench_state_memory.py",
    "bench_quantized_pieces.py",
    "bench_bf16_memory.py",
    "bench_native_shard.py",
    "bench_fsdp.py",
    "bench_zero1.py",
    "bench_population.py",
    "bench_offload.py",
    "bench_new_optimizers.py",
    "bench_diloco.py",
]


def chart() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(RESULTS.read_text())
    fig, axes = plt.subplots(2, 4, figsize=(22, 9))
    fig.suptitle(
        "eqxopt vs optax / torch on a shared, noisy 2-core CPU machine "
        "(medians of interleaved runs; see results.json)",
        fontsize=11,
    )

    def bars(ax, values, title, unit, log=False, colour=None):
        names = list(values)
        drawn = ax.barh(
            names,
            [values[n] for n in names],
            color=[colour or _colour(n) for n in names],
        )
        ax.bar_label(drawn, fmt="%.3g", fontsize=7)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(unit)
        if log:
            ax.set_xscale("log")
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize=8)

    big = data.get("big_leaf", {})
    if "adamw" in big:
        adamw = dict(big["adamw"])
        mof = data.get("big_leaf_multi_output_fusion", {}).get("adamw", {})
        for name in ("eqxopt step donate", "optax jit donate", "memory floor"):
            if name in mof:
                adamw[f"{name} (+MOF flag)"] = mof[name]
        bars(axes[0, 0], adamw, "1. one 16M leaf, AdamW step", "ms")
    many = data.get("many_leaves", {})
    if many:
        ratios = {}
        for key, label in (
            ("many_2000x1000", "2000x1000"),
            ("transformer", "transformer"),
        ):
            r = many[key]
            for name, ratio in r.get("step_vs_optax", {}).items():
                if name.startswith("eqxopt"):
                    variant = name[len("eqxopt ") :]
                    ratios[f"{label} {variant}: step"] = ratio
                    ratios[f"{label} {variant}: compile"] = r["compile_vs_optax"][name][
                        "compile"
                    ]
        bars(
            axes[0, 1],
            ratios,
            "2. many leaves: eqxopt / optax",
            "ratio (1 = optax)",
            colour="tab:blue",
        )
        axes[0, 1].axvline(1.0, color="k", lw=0.8)
    over = data.get("overhead", {})
    if over:
        vals = {}
        for label, r in over.items():
            if label == "machine":
                continue
            for name, t in r.items():
                vals[f"{label[:10]}: {name}"] = t * 1e3
        bars(axes[0, 2], vals, "3. direct-call cost per step", "us per call", log=True)
    rec = data.get("recompiles", {})
    if rec:
        bars(
            axes[1, 0],
            rec["compiles"],
            f"4. compiles in {rec['steps_after_first']} steps, new lr each step",
            "compiles",
        )
    mem = data.get("memory", {})
    if mem:
        vals = {
            k: v["output_MB"] - v["aliased_MB"] + v["temp_MB"]
            for k, v in mem.items()
            if k != "machine"
        }
        bars(
            axes[1, 1],
            vals,
            "5. new memory per step (outputs not aliased + temps)",
            "MB",
        )
    if big and "sgd_momentum" in big:
        bars(
            axes[1, 2], big["sgd_momentum"], "1. one 16M leaf, SGD momentum step", "ms"
        )
    train = data.get("train_step", {})
    if train:
        ratios = {}
        for label, r in train.items():
            if not isinstance(r, dict) or "variants" not in r:
                continue
            for name, v in r["variants"].items():
                if name != "optax":
                    ratios[f"{label.split(',')[0]}: {name[len('eqxopt ') :]}"] = v[
                        "ratio"
                    ]
        bars(
            axes[0, 3],
            ratios,
            "6. train step: eqxopt / optax throughput",
            "ratio (1 = optax; higher is faster)",
            colour="tab:blue",
        )
        axes[0, 3].axvline(1.0, color="k", lw=0.8)
    layers = data.get("packed_layers", {}).get("models", {})
    if layers:
        ratios = {}
        for r in layers.values():
            for name, v in r["variants"].items():
                if name != "optax":
                    variant = f"{r['leaves']} leaves, {name[len('eqxopt ') :]}"
                    ratios[f"{variant}: step"] = v["ratio"]
                    ratios[f"{variant}: first call"] = (
                        1 / v["first_call_vs_optax"]["first_call"]
                    )
        bars(
            axes[1, 3],
            ratios,
            "12. N layers of 64x64: optax / eqxopt time",
            "ratio (1 = optax; higher is faster)",
            colour="tab:blue",
        )
        axes[1, 3].axvline(1.0, color="k", lw=0.8)
    else:
        axes[1, 3].axis("off")
    fig.tight_layout()
    fig.savefig(HERE / "results.png", dpi=90)
    print(f"wrote {HERE / 'results.png'}")


def _colour(name: str) -> str:
    if "eqxopt" in name:
        return "tab:blue"
    if "torch" in name:
        return "tab:orange"
    if "floor" in name:
        return "tab:gray"
    return "tab:green"


def main() -> None:
    start = time.time()
    failed = []
    for case in CASES:
        print(f"\n== {case}", flush=True)
        t0 = time.time()
        env = dict(os.environ)
        script = case
        if case.endswith("+mof"):
            script = case[: -len("+mof")]
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + MOF_FLAG).strip()
        rc = subprocess.call([sys.executable, str(HERE / script)], cwd=HERE, env=env)
        print(f"== {case}: {time.time() - t0:.0f} s", flush=True)
        if rc:
            failed.append(case)
    chart()
    print("\n" + "\n".join(summary(json.loads(RESULTS.read_text()))))
    print(f"\nall cases: {time.time() - start:.0f} s; results in {RESULTS}")
    print(
        "Note: the machine is shared with other jobs (see loadavg in results.json);"
        " ratios from one run are what the targets are judged on, absolute times vary."
    )
    if failed:
        sys.exit(f"failed: {failed}")


if __name__ == "__main__":
    main()
