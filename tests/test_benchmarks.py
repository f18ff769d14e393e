"""benchmarks/bench_gpu.py, the XLA path against optax on whatever device JAX finds,
runs as it is in its quick mode: here on the CPU, the code path a GPU runs, with
neither torch nor eqxopt's native kernels importable."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Runs the script with torch and eqxopt's native backend made unimportable.
RUN_WITHOUT_TORCH_OR_KERNELS = textwrap.dedent(
    """
    import importlib.abc, runpy, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] == "torch" or name.startswith("eqxopt._native"):
                raise ModuleNotFoundError(f"blocked: {name}", name=name)

    sys.meta_path.insert(0, Block())
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
    """
)


@pytest.mark.slow
def test_the_gpu_benchmark_runs_in_quick_mode_on_the_cpu(tmp_path):
    results = tmp_path / "results.json"
    script = ROOT / "benchmarks" / "bench_gpu.py"
    args = ["--quick", "--platform", "cpu", "--results", str(results)]
    done = subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT_TORCH_OR_KERNELS, str(script), *args],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads(results.read_text())["gpu"]
    assert data["quick"] is True and data["machine"]["backend"] == "cpu"
    models = data["train_step"]
    assert len(models) == 4
    for r in models.values():
        assert r["paths"] == ["xla"]
        assert set(r["variants"]) == {"eqxopt helper xla", "optax"}
        helper = r["variants"]["eqxopt helper xla"]
        assert helper["ratio"] > 0 and helper["first_call_vs_optax"]["compile"] > 0
        assert helper["compiles"]["repeats"] == 1
        assert helper["compiles"]["vs_optax"]["total"] > 0
        assert helper["memory"]["peak_MB"] > 0
    layers = data["packed_layers"]["models"]
    assert sorted(r["leaves"] for r in layers.values()) == [50, 300]
    for r in layers.values():
        assert set(r["variants"]) == {"eqxopt tree xla", "eqxopt packed xla", "optax"}
    # The summary: one line per ratio, printed last (after its heading).
    summary = done.stdout.split("### Summary")[1].split("\n\n")[1].splitlines()
    assert summary == data["summary"]
    # Per model, four ratios of the helper (the first call once and repeated);
    # per size, three of each layout, two of packed against the tree; per layout,
    # its growth against optax's.
    assert len(summary) == 4 * 4 + 2 * (2 * 3 + 2) + 2
    assert all(line.endswith(")") and "x (target" in line for line in summary)
    # Case 16: the offloaded state holds no parameter-sized array in device memory.
    (offload,) = data["offload"].values()
    assert set(offload["ms"]) == {"in place", "offloaded", "optax"}
    memory = offload["memory"]
    moved = memory["offloaded"]["host_state_MB"]
    assert moved > 0.1 and moved == pytest.approx(
        memory["in place"]["device_state_MB"], abs=1e-3
    )
    assert memory["offloaded"]["device_state_MB"] < 1e-3  # the step counter


@pytest.mark.slow
def test_the_population_benchmark_runs_in_quick_mode(tmp_path):
    results = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, "bench_population.py", "--quick"],
        cwd=ROOT / "benchmarks",
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT / "src"),
            "EQXOPT_BENCH_RESULTS": str(results),
        },
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads(results.read_text())["population"]
    assert data["quick"] is True and data["rounds"] == 3 and data["members"] == 8
    assert set(data["per_model_step_ms"]) == {"population", "sequential"}
    assert all(t > 0 for t in data["per_model_step_ms"].values())
    assert data["sequential_over_population"] > 0
    assert "sequential / population" in done.stdout


@pytest.mark.slow
def test_the_direct_call_benchmark_runs_in_quick_mode(tmp_path):
    data = _quick_run("bench_direct_call.py", "direct_call", tmp_path)
    for label in ("6-leaf MLP", "200-leaf MLP"):
        case = data[label]
        assert set(case["per_call"]["us"]) == {
            "eqxopt opt.step",
            "eqx.filter_jit(opt.step)",
            "optax jax.jit step",
        }
        assert case["per_call"]["vs_optax_jit"] > 0
        assert case["checking"]["checked_ms"] > 0 and case["checking"]["ratio"] > 0
        assert case["first_call"]["eqxopt"]["vs_optax"]["total"] > 0
    assert data["python_calls"]["later"] < data["python_calls"]["first"]


def test_the_diloco_benchmark_counts_h_times_fewer_bytes(tmp_path):
    # Case 18 in quick mode: the all-reduce bytes read from the compiled programs.
    data = _quick_run("bench_diloco.py", "diloco", tmp_path)
    params, h = data["params"], data["sync_every"]
    reduces = data["all_reduces"]
    assert reduces["local step"] == {"ops": 0, "bytes": 0}
    # A synchronisation and a data-parallel step each all-reduce every float32
    # parameter once.
    assert reduces["sync"]["bytes"] == reduces["data-parallel step"]["bytes"]
    assert reduces["sync"]["bytes"] == 4 * params
    assert data["bytes_ratio"] == h
    assert all(t > 0 for t in data["ms_per_step"].values())


def _quick_run(script: str, case: str, tmp_path) -> dict:
    """Runs `benchmarks/<script>` in quick mode with its results written under
    `tmp_path`, and returns what it saved for `case`."""
    results = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, script],
        cwd=ROOT / "benchmarks",
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT / "src"),
            "EQXOPT_BENCH_RESULTS": str(results),
            "EQXOPT_BENCH_QUICK": "1",
        },
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(results.read_text())[case]
