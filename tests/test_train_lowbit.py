"""examples/train_lowbit.py (low-bit state and bf16 parameters on a byte-level
language model), run end to end with a tiny model for a few steps."""

import json

import numpy as np
import pytest

from helpers import load_script

lowbit = load_script("examples/train_lowbit.py")


def test_corpus_is_the_stdlib_split_by_file():
    text = lowbit.load_text(max_bytes=10_000)
    assert text.train.dtype == np.uint8 and text.train.size == 10_000
    assert text.valid_files >= 1 and text.train_files >= 9 * text.valid_files
    again = lowbit.load_text(max_bytes=10_000)
    np.testing.assert_array_equal(text.valid, again.valid)


# About 12 s of CPU (compiling two train steps and the plot): `make test-slow`.
@pytest.mark.slow
def test_runs_end_to_end(tmp_path, capsys):
    # Quantized moments and stochastic rounding on bf16 parameters, two seeds (the
    # second reuses the compiled steps), a few steps: the JSON, the PNG, the table.
    args = ["--quick", "--steps", "3", "--seeds", "0", "1", "--out", str(tmp_path)]
    result = lowbit.main([*args, "--configs", "8bit", "bf16-sr"])
    assert (tmp_path / "lowbit_lm.png").stat().st_size > 0
    saved = json.loads((tmp_path / "lowbit_lm.json").read_text())
    assert set(saved["runs"]) == {"8bit", "bf16-sr"}
    assert saved["quantized_fraction"]["8bit"] > 0.5  # the big matrices really are
    for name, row in result["summary"].items():
        assert row["seeds"] == 2, name
        assert np.isfinite(row["mean"]) and row["min"] <= row["mean"] <= row["max"]
        # Three steps from a uniform guess (log 256 = 5.5 nats per byte).
        assert row["mean"] < 5.5, name
    printed = capsys.readouterr().out
    assert "bf16-sr" in printed and "wrote" in printed


@pytest.mark.slow
def test_update_sizes_compare_each_storage_with_f32(tmp_path, capsys):
    args = ["--quick", "--steps", "4", "--seeds", "0", "--out", str(tmp_path)]
    result = lowbit.main([*args, "--configs", "8bit", "--update-sizes"])
    sizes = result["update_rms"]
    assert set(sizes) == {"f32", "8bit"} and len(sizes["f32"]) == 4
    # Warmup starts at a learning rate of 0: no step; then both move.
    assert sizes["f32"][0] == 0.0 and min(sizes["f32"][1:]) > 0.0
    # The first steps of 8-bit moments are far larger (the tiny second moment of the
    # first gradients reads as 0 in many places): only finite, positive ratios here.
    ratios = result["update_rms_ratio_by_tenth"]["8bit"]
    assert len(ratios) == 4 and all(0.0 < r < 100.0 for r in ratios[1:])
    assert (tmp_path / "update_sizes.json").exists()
    assert "8bit / f32" in capsys.readouterr().out


@pytest.mark.slow
def test_compressed_state_configurations_run(tmp_path):
    # bf16 parameters with an int8 residual (with error-corrected moments) and
    # companded 8-bit moments, a few steps.
    args = ["--quick", "--steps", "3", "--seeds", "0", "--out", str(tmp_path)]
    result = lowbit.main([*args, "--configs", "f32", "bf16-ecc-moments", "companded"])
    for name in ("bf16-ecc-moments", "companded"):
        row = result["summary"][name]
        assert np.isfinite(row["mean"]) and row["mean"] < 5.5, name
        assert abs(row["ratio_to_f32"] - 1) < 0.05, name
