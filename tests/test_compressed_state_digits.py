"""examples/compressed_state_digits.py: every configuration trains the demo's CNN
(a few steps) and the summary is written."""

import json

import numpy as np
import pytest

from helpers import load_script

digits = load_script("examples/compressed_state_digits.py")


@pytest.mark.slow
def test_every_configuration_trains_and_is_summarised(tmp_path):
    out = tmp_path / "digits.json"
    summary = digits.main(["--seeds", "0", "--steps", "30", "--out", str(out)])
    assert set(summary) == set(digits.NAMES)
    saved = json.loads(out.read_text())
    assert set(saved["runs"]) == set(digits.NAMES)
    for name, row in summary.items():
        # 30 steps move the loss below a uniform guess's log(10) = 2.30.
        assert np.isfinite(row["loss_mean"]) and row["loss_mean"] < 2.3, name
        assert 0.0 <= row["accuracy_mean"] <= 1.0, name
