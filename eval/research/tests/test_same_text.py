"""`eval.research.same_text`: prompt lookup is replayed on each method's own text, and the ratios are the measured
speeds over the modelled ones as the bench report averages them."""

import pytest

from eval.research.phrase_bound import PromptLookup, StepCosts, predict, replay_rounds
from eval.research.same_text import compare, lookup_seconds

PROMPT = [0, 11, 42, 7, 23, 5, 11, 42, 9, 7, 23, 5, 30] * 3
COSTS = StepCosts(round_s=0.1, candidate_s=0.002, draft_s=0.04, draft_prefill_s=0.001)
PREFILL = 1.0


def _record(tokens: list[int], seconds: float) -> dict:
    return {"tokens": tokens, "wall_s": seconds}


def _row(prompt_id: str, output: list[int], method_tokens: list[int], method_s: float, lookup_s: float) -> dict:
    """A prompt whose plain decoding and prompt lookup wrote `output`, and method `planned` `method_tokens`."""
    rules = {"prompt-lookup-k10": replay_rounds(PROMPT, output, PromptLookup(10, [], len(PROMPT) + len(output)))}
    return {"set": "s", "prompt_id": prompt_id, "prompt": PROMPT, "output": output, "eos": [], "rules": rules,
            "records": {"autoregressive": _record(output, 9.0), "prompt-lookup-k10": _record(output, lookup_s),
                        "planned": _record(method_tokens, method_s)}}


def test_lookup_is_replayed_on_the_given_text():
    copying, other = PROMPT[:20], [1, 2, 3, 4] * 5  # the prompt's own tokens copy; new ones do not
    row = _row("a", copying, other, 1.0, 1.0)
    for tokens in (copying, other):
        rounds = replay_rounds(PROMPT, tokens, PromptLookup(10, [], len(PROMPT) + len(tokens)))
        assert lookup_seconds(row, tokens, 10, COSTS, PREFILL) == pytest.approx(predict(COSTS, PREFILL, rounds))
    assert lookup_seconds(row, copying, 10, COSTS, PREFILL) < lookup_seconds(row, other, 10, COSTS, PREFILL)


def test_same_text_ratio_compares_with_lookup_on_the_methods_text():
    output, method_text = PROMPT[:20], PROMPT[:12] + [1, 2, 3, 4, 5, 6, 7, 8]  # the method's text copies worse
    fresh = {"output": None, "rules": {}, "prompt": PROMPT, "eos": []}  # replays every text
    on_output, on_method = (lookup_seconds(fresh, text, 10, COSTS, PREFILL) for text in (output, method_text))
    # prompt lookup measured 10% slower than the model says; the method 20% faster than lookup on its own text
    row = _row("a", output, method_text, 0.8 * on_method, 1.1 * on_output)
    result = compare([row], {"s": COSTS}, {("s", "a"): PREFILL}, [10])["s"]
    entry = result["methods"]["planned"]["prompt-lookup-k10"]
    assert entry["same_text"] == pytest.approx(1.25)
    assert result["check"]["prompt-lookup-k10"] == pytest.approx(1.1)
    assert entry["same_text_corrected"] == pytest.approx(1.25 * 1.1)
    assert entry["measured"] == pytest.approx((20 / (0.8 * on_method)) / (20 / (1.1 * on_output)))
    assert entry["equal_texts"] == 0 and result["methods"]["planned"]["equal_to_autoregressive"] == 0
    assert list(result["methods"]) == ["planned"]  # neither plain decoding nor prompt lookup is compared with itself
