"""`eval.research.fit_clock`: records written by a known cost model give that model back, and price its calls."""

import json

import pytest

from eval.research.fit_clock import fit, main, price
from eval.research.virtual_clock import ForwardCosts

OVERHEAD_S = 0.002
TRUE = ForwardCosts(
    step_s=0.12, step_per_cached_s=2e-5, short_tokens=9, short_ratio=1.15, per_token_past_short=0.03,
    prefill_from=64, prefill_s=0.1, prefill_per_token_s=2e-3, prefill_quadratic_s=3e-7,
    draft_ratio=0.4, draft_prefill_s=0.0, draft_prefill_per_token_s=1e-3, draft_per_token_past_short=0.0,
)


def _records(costs: ForwardCosts) -> list[dict]:
    """Plain decoding and planned rounds (a step, copies of 1 to 30 tokens, draft rounds) on four prompts, each
    forward priced by `costs` plus the overhead, as the harness would record them on that machine."""
    rows = []
    for prompt in (100, 250, 500, 900):
        tokens = 40
        prefill = costs.target(prompt, 0) + OVERHEAD_S
        decode = sum(costs.target(1, prompt + i) + OVERHEAD_S for i in range(1, tokens))
        rows.append({"method": "autoregressive", "prompt_tokens": prompt, "tokens": [0] * tokens,
                     "wall_s": prefill + decode, "prefill_s": prefill, "draft_lengths": [], "target_calls": tokens})
        rounds, cache = [["step", 0, 0, 0, prefill]], prompt + 1
        for sent in range(1, 31):  # copies, nothing accepted
            rounds.append(["copy", sent, 0, 0, costs.target(sent + 1, cache) + OVERHEAD_S])
            cache += 1
        for i, drafted in enumerate((3, 1, 2, 4, 1)):  # the first draft round feeds the whole sequence
            first = costs.draft(cache, 0) if i == 0 else costs.draft(1, cache)
            seconds = first + (drafted - 1) * costs.draft(1, cache) + costs.target(drafted + 1, cache) \
                + (drafted + 1) * OVERHEAD_S
            rounds.append(["draft", drafted, drafted, 1, seconds])
            cache += 2
        rows.append({"method": "entropy+phrases", "prompt_tokens": prompt, "tokens": [0] * (cache - prompt),
                     "phrases": {"rounds": rounds}})
    return rows


def test_records_of_a_known_model_give_it_back():
    fitted = fit(_records(TRUE), OVERHEAD_S, short_tokens=9)
    for name in ("step_s", "step_per_cached_s", "short_ratio", "per_token_past_short", "prefill_s",
                 "prefill_per_token_s", "draft_ratio"):
        assert getattr(fitted, name) == pytest.approx(getattr(TRUE, name), rel=0.02), name
    assert fitted.prefill_quadratic_s == pytest.approx(TRUE.prefill_quadratic_s, rel=0.1)
    # the first draft forward is fitted through the origin, where the model has no intercept either
    assert fitted.draft_prefill_per_token_s == pytest.approx(TRUE.draft_prefill_per_token_s, rel=0.05)


def test_plain_decoding_is_priced_as_recorded(tmp_path, capsys):
    rows = _records(TRUE)
    plain = [row for row in rows if row["method"] == "autoregressive"]
    assert all(price(TRUE, row, OVERHEAD_S) == pytest.approx(row["wall_s"]) for row in plain)
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in [{"environment": {"mode": "greedy"}}, *rows]))
    main([str(path)])
    assert "| autoregressive | 4 | 1.000 |" in capsys.readouterr().out
