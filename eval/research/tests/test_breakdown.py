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


def test_time_breakdown_fits_the_drafts_prefill_and_splits_the_gap_to_the_best_stock_method(tmp_path):
    environment = {"mode": "greedy", "methods": ["autoregressive", "prompt-lookup-k10", "fixed-k4", "entropy+phrases"],
                   "pair": "p", "dtype": "float32", "max_new_tokens": 12, "threads": 2}
    round_s, draft_s, draft_prefill_s = 0.2, 0.1, 0.001
    prompts = {"a": (1.0, 100), "b": (3.0, 300)}  # prefill, prompt tokens
    planned = {"offered": 0, "confirmed": 0, "copied": 10, "copied_accepted": 4,
               "round_kinds": {"copy": 2, "draft": 2, "step": 1}}
    shapes = {"prompt-lookup-k10": (6, 0, None), "fixed-k4": (4, 12, None), "entropy+phrases": (5, 4, planned)}
    records = []
    for prompt_id, (prefill_s, prompt_tokens) in prompts.items():
        common = {"set": "s", "prompt_id": prompt_id, "prompt_tokens": prompt_tokens, "tokens": [0] * 12}
        records.append({**common, "method": "autoregressive", "wall_s": 3.0, "target_calls": 12, "draft_forwards": 0,
                        "draft_lengths": []})
        for method, (calls, drafts, phrases) in shapes.items():
            wall = prefill_s + round_s * calls + draft_s * drafts + draft_prefill_s * prompt_tokens * (drafts > 0)
            records.append({**common, "method": method, "wall_s": wall, "target_calls": calls,
                            "draft_forwards": drafts, "draft_lengths": [drafts], "phrases": phrases})
    result = breakdown(environment, records)
    entry = result["sets"]["s"]
    assert entry["model"]["draft_prefill_per_token_s"] == pytest.approx(draft_prefill_s)
    assert entry["model"]["round_s"] == pytest.approx(round_s) and entry["model"]["draft_s"] == pytest.approx(draft_s)
    assert entry["best_stock"] == "prompt-lookup-k10"  # the fastest of transformers' methods here
    methods = entry["methods"]
    assert "vs_best_stock_s" not in methods["fixed-k4"]  # only pacer-hf's methods are set against it
    gap = methods["entropy+phrases"]["vs_best_stock_s"]
    # One call fewer (-0.2 s), four draft forwards (+0.4 s) and the draft's prefill of 100 or 300 tokens (+0.2 s).
    assert gap == pytest.approx({"wall_s": 0.4, "calls_s": -0.2, "drafts_s": 0.4, "draft_prefill_s": 0.2,
                                 "rest_s": 0.0}, abs=1e-9)
    assert methods["entropy+phrases"]["copy_rounds"] == 2 and methods["entropy+phrases"]["copied_accepted"] == 4
    table = markdown_table(result)
    assert "the draft's prefill 1.00 ms per prompt token" in table
    assert "| entropy+phrases | +0.40 | -0.20 | +0.40 | +0.20 | " in table  # then the rest, +0.00 or -0.00
    assert "| 2.0 | 1.0 | 2.0 | 4.0 / 10.0 |" in table
    assert plot(result, tmp_path / "breakdown").stat().st_size > 0


def test_time_breakdown_drops_a_draft_prefill_that_fits_as_a_saving():
    """Short prompts of similar length let the prefill column fit noise; a negative cost is not reported."""
    environment = {"mode": "greedy", "methods": ["autoregressive", "prompt-lookup-k10", "fixed-k4", "entropy"],
                   "pair": "p", "dtype": "float32", "max_new_tokens": 12, "threads": 2}
    shapes = {"prompt-lookup-k10": (6, 0), "fixed-k4": (4, 12), "entropy": (5, 8)}  # target calls, draft forwards
    records = []
    for prompt_id, (prefill_s, prompt_tokens) in {"a": (1.0, 20), "b": (1.2, 24), "c": (0.9, 30)}.items():
        common = {"set": "s", "prompt_id": prompt_id, "prompt_tokens": prompt_tokens, "tokens": [0] * 12}
        records.append({**common, "method": "autoregressive", "wall_s": 3.0, "target_calls": 12, "draft_forwards": 0,
                        "draft_lengths": []})
        for method, (calls, drafts) in shapes.items():
            # The drafting methods are faster than their calls and forwards explain, by 0.01 s per prompt token.
            wall = prefill_s + 0.2 * calls + 0.1 * drafts - 0.01 * prompt_tokens * (drafts > 0)
            records.append({**common, "method": method, "wall_s": wall, "target_calls": calls,
                            "draft_forwards": drafts, "draft_lengths": [drafts] if drafts else []})
    result = breakdown(environment, records)
    entry = result["sets"]["s"]
    assert entry["model"]["draft_prefill_per_token_s"] is None
    assert all(m["draft_prefill_s"] == 0.0 for m in entry["methods"].values())
    assert "the draft's prefill not told apart from the rest" in markdown_table(result)
