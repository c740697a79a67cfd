"""`eval.research.copy_rules`: each variant sends what it says (prefixes of its offer, its fixed length, no plain step
while a copy is on offer), the shipped variant is pacer-hf's copy rounds exactly, and the comparison prices them."""

import pytest

from eval.research.copy_rules import VARIANTS, CopyVariant, VariantPlanner, compare, markdown_table
from eval.research.phrase_bound import PlannedCopies, StepCosts, look_up_rules, replay_rounds
from pacer_hf import PhrasePool
from pacer_hf.phrases import Phrase
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


def _rounds(rule) -> list[tuple[int, int]]:
    """(sent, accepted) of each round of `rule` replayed on the output."""
    seen = []
    observe = rule.observe
    rule.observe = lambda sent, accepted: (seen.append((sent, accepted)), observe(sent, accepted))
    replay_rounds(PROMPT, OUTPUT, rule)
    return seen


@pytest.mark.parametrize("oracle", ["length", "both"])
def test_a_length_oracle_sends_exactly_what_the_target_accepts(oracle):
    rounds = _rounds(CopyVariant(PROMPT, COSTS, len(OUTPUT), oracle=oracle, output=OUTPUT))
    assert all(sent == accepted for sent, accepted in rounds) and sum(sent for sent, _ in rounds) > 0
    shipped = _rounds(CopyVariant(PROMPT, COSTS, len(OUTPUT)))
    assert len(rounds) <= len(shipped) and any(sent > accepted for sent, accepted in shipped)


def test_the_occurrence_oracle_copies_the_offer_with_the_most_accepted_tokens():
    rule = CopyVariant(PROMPT, COSTS, len(OUTPUT), oracle="occurrence", output=OUTPUT)
    chosen = []
    choose = rule.choose
    rule.choose = lambda options: (plan := choose(options), chosen.append((plan, options)))[0]
    replay_rounds(PROMPT, OUTPUT, rule)
    copies = [(plan, options) for plan, options in chosen if plan.kind == "copy"]
    assert copies
    for plan, options in copies:
        assert rule._accepted(plan.copy) == max(map(rule._accepted, options)) or len(options) == 1
    assert all(plan.kind == "step" for plan, options in chosen if not options)


def test_the_survival_estimate_learns_each_position_apart():
    """Four copies stopped after their first token and one accepted for 40: the shipped estimate pools the 39 next
    tokens of the long one and expects the second token of a copy at about 0.9; by position, 1 in 5 reached it."""
    shipped = PlannedCopies(PROMPT, COSTS, 40).planner
    planner = VariantPlanner(shipped.costs, 40, survival=True)
    for copies in (shipped.copies, planner.copies):
        for _ in range(4):
            copies.observe("sequence", 5, sent=10, accepted=1)
        copies.observe("sequence", 5, sent=40, accepted=40)
    _, pooled_next = planner.copies.probabilities("sequence", 5)
    hazards = planner.copies.survival("sequence", 5, 40)
    assert hazards[0] == planner.copies.probabilities("sequence", 5)[0]
    assert pooled_next > 0.85 and hazards[1] < 0.6  # the second token: 1 of 5 (with the prior's weight)
    assert min(hazards[2:]) > 0.85  # later tokens: only the long copy reached them, and it went on
    copy = Phrase(list(range(40)), "sequence", 5)
    assert planner.copy_length(copy)[1] < 0.8 * shipped.copy_length(copy)[1]  # expected accepted tokens


def test_copies_after_an_ambiguous_key_learn_apart():
    from eval.research.copy_rules import _ambiguous

    pool = PhrasePool()
    pool.start_sequence([1, 2, 3, 9, 1, 2, 3, 8, 4, 5, 6, 4, 5])
    assert _ambiguous(pool, [7, 1, 2, 3])  # "1 2 3" went on with 9 and with 8
    assert not _ambiguous(pool, [7, 4, 5])  # "4 5" only with 6
    planner = VariantPlanner(PlannedCopies(PROMPT, COSTS, 40).planner.costs, 40, ambiguity=True)
    ambiguous, clear = Phrase([1] * 10, "sequence", 3), Phrase([2] * 10, "sequence", 3)
    planner.ambiguous = {id(ambiguous)}
    before = planner.copy_length(clear)
    for _ in range(6):
        planner.acceptance_of(ambiguous).observe("sequence", 3, sent=10, accepted=0)
    assert planner.copy_length(clear) == before
    assert planner.copy_length(ambiguous)[1] < before[1] / 2
