"""eval.research.breakdown: where a run's time goes, fitted from records with known costs."""

import pytest

from eval.research.breakdown import breakdown, markdown_table, plot


def test_time_breakdown_recovers_known_costs_and_splits_the_gap_to_the_oracle(tmp_path):

    environment = {"mode": "greedy", "methods": ["autoregressive", "short", "long", "oracle"], "pair": "p",
                   "dtype": "float32", "max_new_tokens": 12, "threads": 2}
    round_s, draft_s, prefill = 0.2, 0.1, {"a": 1.0, "b": 3.0}
    shapes = {"short": [1] * 8, "long": [5, 5, 5], "oracle": [3, 3, 2, 2], "autoregressive": []}
    records = []
    for prompt_id, prefill_s in prefill.items():
        for method, lengths in shapes.items():
            calls = len(lengths) + 1 if lengths else 12
            drafts = sum(lengths)
            wall = prefill_s + round_s * calls + draft_s * drafts if lengths else 0.25 * calls
            records.append({"set": "s", "prompt_id": prompt_id, "method": method, "tokens": [0] * 12,
                            "wall_s": wall, "target_calls": calls, "draft_forwards": drafts, "draft_lengths": lengths,
                            **({"head_s": 0.01 * drafts} if method == "short" else {})})
    result = breakdown(environment, records + [{**records[1], "prompt_id": "cut"}])  # an unfinished prompt: left out
    entry = result["sets"]["s"]
    assert entry["model"]["round_s"] == pytest.approx(round_s)
    assert entry["model"]["draft_s"] == pytest.approx(draft_s)
    assert entry["model"]["prefill_s"] == pytest.approx(prefill)
    assert entry["model"]["autoregressive_step_s"] == pytest.approx(0.25)
    short, long = entry["methods"]["short"], entry["methods"]["long"]
    assert list(entry["methods"]) == ["short", "long", "oracle"]
    # `short` stops too early: 9 calls against the oracle's 5, 8 drafts against 10.
    assert short["vs_oracle_s"]["calls_s"] == pytest.approx(4 * round_s)
    assert short["vs_oracle_s"]["drafts_s"] == pytest.approx(-2 * draft_s)
    assert long["vs_oracle_s"]["drafts_s"] == pytest.approx(5 * draft_s)
    assert long["vs_oracle_s"]["rest_s"] == pytest.approx(0.0, abs=1e-9)
    assert long["mean_draft_length"] == pytest.approx(5.0)
    assert short["head_s"] == pytest.approx(0.08) and long["head_s"] is None  # measured, or unknown: never 0
    table = markdown_table(result)
    assert "| long | " in table and "| 0.08 |" in table
    assert plot(result, tmp_path / "breakdown").stat().st_size > 0
