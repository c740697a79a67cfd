"""eval.research.planner_ab: an earlier commit's planner as one more harness method."""

import json
import subprocess
from pathlib import Path

import pytest

from eval.research.planner_ab import main, planner_at

REPO = Path(__file__).resolve().parents[3]


def _in_git() -> bool:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True).returncode == 0
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _in_git(), reason="reads the planner of a commit with git")


def test_the_earlier_planner_runs_beside_todays_and_both_equal_plain_greedy(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\nclass Stack:\n", encoding="utf-8")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.strip()
    main(["--rev", "HEAD", commit, "--pair", "tiny", "--max-new-tokens", "12", "--prompts", f"{prompts}:0:2",
          "--methods", "entropy+phrases", "planner@HEAD", f"planner@{commit}", "--out", str(tmp_path / "ab")])
    records = [json.loads(line) for line in (tmp_path / "ab.jsonl").read_text().splitlines()][1:]
    by_method = {}
    for record in records:
        by_method.setdefault(record["method"], {})[record["prompt_id"]] = record
    assert set(by_method) == {"autoregressive", "entropy+phrases", "planner@HEAD", f"planner@{commit}"}
    for method in ("entropy+phrases", "planner@HEAD", f"planner@{commit}"):  # float32: each equals plain greedy
        for prompt_id, record in by_method[method].items():
            assert record["tokens"] == by_method["autoregressive"][prompt_id]["tokens"]
            assert len(record["phrases"]["rounds"]) == sum(record["phrases"]["round_kinds"].values())


def test_a_commit_without_the_planner_is_a_clear_error():
    with pytest.raises(ValueError, match="Cannot read pacer_hf/planner.py at 'no-such-rev'"):
        planner_at("no-such-rev")
