"""`eval.research.copy_rules`: each variant sends what it says (prefixes of its offer, its fixed length, no plain step
while a copy is on offer), the shipped variant is pacer-hf's copy rounds exactly, and the comparison prices them."""

import pytest

from eval.research.copy_rules import VARIANTS, CopyVariant, compare, markdown_table
from eval.research.phrase_bound import PlannedCopies, StepCosts, look_up_rules, replay_rounds
from pacer_hf import PhrasePool
from pacer_hf.planner import MAX_COPY_TOKENS

PROMPT = [0, 11, 42, 7, 23, 5, 11, 42, 9, 7, 23, 5, 30] * 3
OUTPUT = ([0, 11, 42, 7, 23, 5, 11, 42, 9, 7, 23, 5, 30] * 2)[:30] + [99, 98, 97, 11, 42, 9]
COSTS = StepCosts(round_s=0.1, candidate_s=0.002, draft_s=0.04, draft_prefill_s=0.001)


def _sent(rule) -> list[tuple[list[int], list[list[int]]]]:
    """Each round's candidates beside what the pool offered then (the earliest occurrence's, the furthest match's)."""
    pool, seen = PhrasePool(), []

    class Watching(CopyVariant):
        def propose(self, sequence):
            pool.extend(sequence[pool.sequence_length :]) if pool.sequence_length else pool.start_sequence(sequence)
            candidates = rule.propose(sequence)
            offers = [pool.lookup_earliest(sequence, MAX_COPY_TOKENS).tokens,
                      pool.lookup(sequence, MAX_COPY_TOKENS).tokens]
            seen.append((candidates, offers))
            return candidates

        def observe(self, sent, accepted):
            rule.observe(sent, accepted)

    replay_rounds(PROMPT, OUTPUT, Watching(PROMPT, COSTS, len(OUTPUT)))
    return seen


def test_the_shipped_variant_is_pacer_hfs_copy_rounds():
    shipped = replay_rounds(PROMPT, OUTPUT, CopyVariant(PROMPT, COSTS, len(OUTPUT)))
    assert shipped == replay_rounds(PROMPT, OUTPUT, PlannedCopies(PROMPT, COSTS, len(OUTPUT)))
    assert sum(shipped) > 0


@pytest.mark.parametrize("fixed", [2, 5])
def test_a_fixed_length_sends_that_many_of_the_earliest_occurrences_continuation(fixed):
    for candidates, (earliest, _) in _sent(CopyVariant(PROMPT, COSTS, len(OUTPUT), offer="earliest", fixed=fixed)):
        assert candidates == earliest[:fixed]


def test_without_plain_steps_a_round_copies_whenever_something_is_on_offer():
    rounds = _sent(CopyVariant(PROMPT, COSTS, len(OUTPUT), steps=False))
    assert all(candidates for candidates, offers in rounds if any(offers))
    assert all(any(o[: len(c)] == c for o in offers) for c, offers in rounds if c)


def test_compare_prices_every_variant_against_the_best_prompt_lookup():
    rules = {name: replay_rounds(PROMPT, OUTPUT, rule)
             for name, rule in look_up_rules(len(PROMPT) + len(OUTPUT), []).items()}
    rows = [{"set": "s", "prompt_id": "a", "prompt": PROMPT, "output": OUTPUT, "rules": rules}]
    result = compare(rows, {"s": COSTS}, {("s", "a"): 1.0})["s"]
    assert set(VARIANTS) <= set(result["speedup"])
    assert result["over_best_prompt_lookup"][result["best_prompt_lookup"]] == 1
    assert all(v > 1 for m, v in result["speedup"].items() if m != "autoregressive")  # the output repeats the prompt
    assert "| shipped | " in markdown_table({"s": result}, "cmd")
