"""eval.research.planner_ab: an earlier commit's planner as one more harness method."""

import json
import subprocess
from pathlib import Path

import pytest

from eval.research import planner_ab
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


@pytest.mark.parametrize("cls, method", [("CallCosts", "observe_prefill"), ("RoundPlanner", "observe_first_round")])
def test_a_planner_from_before_todays_generator_calls_still_runs(tmp_path, monkeypatch, cls, method):
    """Today's generator tells the costs the target's prefill (`CallCosts.observe_prefill`) and the planner that the
    call's first round ran (`RoundPlanner.observe_first_round`), both since 2026-12-05; an earlier planner lacks them
    and gets stand-ins that learn nothing."""
    module = planner_at("HEAD")  # a fresh copy of the module: deleting from its classes leaves pacer_hf's alone
    delattr(getattr(module, cls), method)
    monkeypatch.setattr(planner_ab, "planner_at", lambda rev: module)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\n", encoding="utf-8")
    main(["--rev", "earlier", "--pair", "tiny", "--max-new-tokens", "12", "--prompts", f"{prompts}:0:1",
          "--methods", "planner@earlier", "--out", str(tmp_path / "ab")])
    records = [json.loads(line) for line in (tmp_path / "ab.jsonl").read_text().splitlines()][1:]
    assert {record["method"] for record in records} == {"autoregressive", "planner@earlier"}
    assert records[0]["tokens"] == records[1]["tokens"]


def test_a_commit_without_the_planner_is_a_clear_error():
    with pytest.raises(ValueError, match="Cannot read pacer_hf/planner.py at 'no-such-rev'"):
        planner_at("no-such-rev")
