"""`eval.research.copy_rules`: each variant sends what it says (prefixes of its offer, its fixed length, no plain step
while a copy is on offer), the shipped variant is pacer-hf's copy rounds exactly, and the comparison prices them."""

import dataclasses

import pytest

from eval.research.copy_rules import ESTIMATES, VARIANTS, CopyVariant, calibration, compare, markdown_table
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
    assert rounds[0][0] == []  # right after the prompt the pool offers no copy of it (`PhrasePool.copy_options`)
    assert all(candidates for candidates, offers in rounds[1:] if any(offers))
    assert all(any(o[: len(c)] == c for o in offers) for c, offers in rounds if c)


def test_compare_prices_every_variant_against_the_best_prompt_lookup():
    rules = {name: replay_rounds(PROMPT, OUTPUT, rule)
             for name, rule in look_up_rules(len(PROMPT) + len(OUTPUT), []).items()}
    rows = [{"set": "s", "prompt_id": "a", "prompt": PROMPT, "output": OUTPUT, "rules": rules}]
    result = compare(rows, {"s": COSTS}, {("s", "a"): 1.0})["s"]
    assert set(VARIANTS) <= set(result["speedup"])
    assert result["over_best_prompt_lookup"][result["best_prompt_lookup"]] == 1
    assert all(v > 1 for m, v in result["speedup"].items() if m != "autoregressive")  # the output repeats the prompt
    calibrated = calibration(rows, {"s": COSTS})["s"]
    copies = sum(1 for sent, _ in _rounds(CopyVariant(PROMPT, COSTS, len(OUTPUT))) if sent)
    assert calibrated[1]["reached"] == copies  # every copy reaches its first token
    assert all(0 <= c["predicted"] <= 1 and 0 <= c["accepted"] <= 1 for c in calibrated.values())
    table = markdown_table({"s": result}, {"s": calibrated}, "cmd")
    assert "| shipped | " in table and "| s | 1 | " in table


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


def test_the_one_rate_estimate_takes_every_next_token_at_the_rate_of_all():
    copies = CopyVariant(PROMPT, COSTS, 40, estimate="one next-token rate").planner.copies
    copy = Phrase(list(range(40)), "sequence", 5)
    for _ in range(4):
        copies.observe(copy, sent=10, accepted=1)
    copies.observe(copy, sent=40, accepted=40)
    hazards = copies.hazards(copy, 40)
    assert len(set(hazards[1:])) == 1 and hazards[1] > 0.85  # the long copy's 39 next tokens set the rate for all


def test_a_verify_curve_prices_candidates_past_its_knee_apart():
    convex = dataclasses.replace(COSTS, verify_curve=(10, 0.01, 0.05))
    assert convex.round_seconds(0) == COSTS.round_s
    assert convex.round_seconds(10) == pytest.approx(0.1 * 1.1)
    assert convex.round_seconds(30) - convex.round_seconds(10) == pytest.approx(0.1 * 0.05 * 20)
    assert COSTS.round_seconds(30) == pytest.approx(0.1 + 0.002 * 30)
    replayed = CopyVariant(PROMPT, convex, 40).planner.costs  # the replayed planner learns the curve
    assert replayed.target(10) == pytest.approx(0.11, rel=0.02) and replayed.target(64) > replayed.target(10) * 2


def test_the_estimate_variants_differ_from_shipped_where_they_say():
    """One copy accepted for 7 tokens: the shipped estimate carries it to later positions, the own-prior variant does
    not, the capped one stays under its cap from its position on."""
    option, long_option = Phrase([1] * 7, "sequence", 17), Phrase([1] * 40, "sequence", 17)
    estimates = {name: ESTIMATES[name]() for name in ("shipped", "own prior", "capped 0.96 from 17")}
    for estimate in estimates.values():
        estimate.observe(option, 7, 7)
    shipped, own, capped = (estimates[name].hazards(long_option, 40) for name in estimates)
    assert own[0] == shipped[0] and own[20] < shipped[20]
    assert capped[:16] == shipped[:16] and max(capped[16:]) <= 0.96 < max(shipped[16:])
