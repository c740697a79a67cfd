"""The prepared GPU check (`eval/gpu_check.py`) runs end to end on the CPU with tiny configs, so that it is ready to
run unchanged the day a GPU is lent: its steps, its records and its table."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "eval" / "gpu_check.py"


@pytest.mark.skipif(not SCRIPT.is_file(), reason="needs the repository's eval/ folder")
def test_the_gpu_check_runs_on_tiny_models_on_the_cpu(tmp_path):
    out = tmp_path / "gpu-check"
    subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--device", "cpu", "--skip-tests", "--out", str(out)],
                   check=True, capture_output=True, text=True, cwd=SCRIPT.parent.parent)
    result = json.loads(out.with_suffix(".json").read_text())
    assert set(result["rounds"]) == {"transformers, same rows", "pacer-hf, same rows", "pacer-hf, padded pair"}
    assert all(row["seconds_per_round"] > 0 and row["syncs_per_drafted_token"] is None  # counted on CUDA only
               for row in result["rounds"].values())
    assert set(result["calls"]) == {"plain greedy", "pacer-hf, the README's call"}
    assert all(row["seconds_per_token"] > 0 for row in result["calls"].values())
    assert sum(result["calls"]["pacer-hf, the README's call"]["round_kinds"].values()) > 0
    assert all(set(costs) == {"1", "2", "4", "8", "16", "32"} and min(costs.values()) > 0
               for costs in result["forward_ms_by_tokens_fed"].values())  # JSON keys are strings
    table = out.with_suffix(".md").read_text()
    assert "| pacer-hf, padded pair |" in table and "| pacer-hf, the README's call |" in table
