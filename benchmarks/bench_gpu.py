"""eqxopt's XLA path against optax on the device JAX picks (the GPU of a CUDA JAX;
the CPU where there is none), with a one-line summary of each ratio at the end.

The whole AdamW train steps of case 6 (the four models of `bench_train_step.py`)
and of case 12 (N linear layers of 64 x 64, as a tree and packed with `eqxopt.pack`,
`bench_packed_layers.py`): `eqxopt.make_train_step` (and, without `--quick`, the
step written out with `eqx.filter_jit`) against optax's documented step, through
the same code as those cases. Reports throughput, the first call's trace + lowering
and compile (once, and the median of `--compiles` repeats with JAX's caches
cleared), and XLA's memory analysis, each against optax. Needs neither torch
nor eqxopt's native CPU kernels: they are off (`EQXOPT_NATIVE=0`), so a CPU run
measures the path a GPU runs. Then case 16 (`bench_offload.py`): the optimizer
state in host memory (`eqxopt.OffloadState`), its bytes in device memory and its
step time, beside the state in place and optax.

    python benchmarks/bench_gpu.py            # 300 and 2,000 layers, 20 rounds
    python benchmarks/bench_gpu.py --quick    # 50 and 300 layers, 3 rounds

Results go to benchmarks/results.json under "gpu" (`--results` for another file).
"""

import argparse
import os
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="3 rounds, 50 and 300 layers, make_train_step only",
    )
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument(
        "--compiles",
        type=int,
        default=None,
        help="repeats of case 6's first calls, caches cleared (default 3; 1 quick)",
    )
    parser.add_argument("--leaves", type=int, nargs="+", default=None)
    parser.add_argument(
        "--only", default="", help="case 6's models whose name contains this"
    )
    parser.add_argument(
        "--platform",
        default="",
        help="JAX's platforms (jax_platforms); empty: JAX's own choice",
    )
    parser.add_argument(
        "--results",
        type=pathlib.Path,
        default=HERE / "results.json",
        help="the results file (merged into; key 'gpu')",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    # Before JAX and eqxopt start: the platform, the results file, and XLA's own
    # code (the native kernels are CPU-only; off, nothing builds them).
    os.environ["EQXOPT_BENCH_PLATFORM"] = args.platform
    os.environ["EQXOPT_BENCH_RESULTS"] = str(args.results)
    os.environ["EQXOPT_NATIVE"] = "0"
    sys.path.insert(0, str(HERE))

    import jax

    import bench_offload
    import bench_packed_layers
    import bench_train_step
    from _common import CompileEvents, machine, save, summary, warm_up

    start = time.time()
    n_rounds = args.rounds or (3 if args.quick else 20)
    leaves = args.leaves or (
        bench_packed_layers.QUICK_LEAVES if args.quick else bench_packed_layers.LEAVES
    )
    kinds = ("helper",) if args.quick else bench_train_step.KINDS
    print(f"eqxopt's XLA path on {machine()['device']} ({jax.default_backend()})")
    events = CompileEvents()
    warm_up()
    cfgs = [c for c in bench_train_step.configs() if args.only in c["name"]]
    compiles = args.compiles if args.compiles is not None else (1 if args.quick else 3)
    train = bench_train_step.run(
        cfgs, ("xla",), n_rounds, events, kinds, compiles=compiles
    )
    layers = bench_packed_layers.run(leaves, ("xla",), n_rounds, events)
    data = {"train_step": train, "packed_layers": layers}
    lines = summary(data)
    # Case 16: the state in host memory (`OffloadState`), its device memory and
    # step time beside the state kept in place and optax.
    widths = (256,) if args.quick else bench_offload.WIDTHS
    offload = bench_offload.run(widths, n_rounds)
    save(
        "gpu",
        {
            "rounds": n_rounds,
            "quick": args.quick,
            **data,
            "offload": offload,
            "summary": lines,
        },
    )
    for name, r in offload.items():
        print(
            f"OffloadState, {name}: state in device memory "
            f"{r['memory']['offloaded']['device_state_MB']:.3g} MB (in place: "
            f"{r['memory']['in place']['device_state_MB']:.3g} MB); step "
            f"{r['vs_optax']['offloaded']:.3g}x optax's (in place: "
            f"{r['vs_optax']['in place']:.3g}x)"
        )
    print(f"\n### Summary: eqxopt's XLA path against optax ({machine()['device']})\n")
    print("\n".join(lines))
    print(f"\n{time.time() - start:.0f} s; results in {args.results} under 'gpu'")


if __name__ == "__main__":
    main()
