"""`eval.research.phrase_bound`: the replay of prompt lookup is what `generate()` does, pacer-hf's copy rounds are
replayed with the library's own pool and planner, the draft's agreement is what greedy drafting meets, and the schedule
search finds the fastest schedule (against brute force)."""

import itertools
import random

import pytest
import torch

from eval.research.phrase_bound import (
    LookupRule, PlannedCopies, PromptLookup, StepCosts, best_schedule, copy_available, copy_runs, draft_agrees,
    look_up_rules, replay_rounds,
)
from pacer_hf import PhrasePool
from pacer_hf.planner import MAX_COPY_TOKENS
from pacer_hf.tiny_models import tiny_pair

PROMPT = [0, 11, 42, 7, 23, 5, 11, 42, 9, 7, 23, 5, 30]


def test_copy_available_marks_pairs_seen_before():
    # (5, 11) is in the prompt; (11, 42) too; (42, 8) is new; (8, 11) new; (11, 42) seen.
    assert copy_available([1, 5, 11, 42], [5, 11, 42, 8, 11, 42]) == [False, True, True, False, False, True]


@pytest.mark.parametrize("num_tokens", [2, 5])
def test_prompt_lookup_replay_matches_generate(num_tokens):
    target, _ = tiny_pair("llama", seed=3)
    prompt = torch.tensor([PROMPT * 3])
    output = target.generate(prompt, max_new_tokens=24, do_sample=False)[0, prompt.shape[1] :].tolist()
    fed = []
    hook = target.register_forward_pre_hook(lambda _, args, kwargs: fed.append(kwargs["input_ids"].shape[1]),
                                            with_kwargs=True)
    try:
        assisted = target.generate(prompt, max_new_tokens=24, do_sample=False, prompt_lookup_num_tokens=num_tokens)
    finally:
        hook.remove()
    assert assisted[0, prompt.shape[1] :].tolist() == output
    fed[0] -= prompt.shape[1] - 1  # the first verify also prefills the prompt
    replay = replay_rounds(prompt[0].tolist(), output, PromptLookup(num_tokens, [], prompt.shape[1] + len(output)))
    assert [c + 1 for c in replay] == fed  # each verify feeds the last token and the candidates
    assert any(replay)  # the prompt's repeats give prompt lookup something to propose


def test_copy_replay_sends_prefixes_of_the_pools_copy_options_and_learns():
    prompt, output = PROMPT * 3, (PROMPT * 2)[:30]  # the output repeats the prompt: copies pay
    costs = StepCosts(round_s=0.1, candidate_s=0.002, draft_s=0.04, draft_prefill_s=0.001)
    rule, pool, sent = PlannedCopies(prompt, costs, len(output)), PhrasePool(), []

    class Checking(LookupRule):
        def propose(self, sequence):
            pool.extend(sequence[pool.sequence_length :]) if pool.sequence_length else pool.start_sequence(sequence)
            candidates = rule.propose(sequence)
            options = [o.tokens for o in pool.copy_options(sequence, MAX_COPY_TOKENS)]
            assert not candidates or any(o[: len(candidates)] == candidates for o in options)
            sent.append(len(candidates))
            return candidates

        def observe(self, sent_tokens, accepted):
            rule.observe(sent_tokens, accepted)

    rounds = replay_rounds(prompt, output, Checking())
    assert rounds == sent and sum(rounds) > 0 and len(rounds) < len(output) / 2  # copying cut the rounds
    assert sent[0] == 0  # as in generate(), the first round copies nothing from the prompt's end


def test_look_up_rules_are_prompt_lookups_lengths():
    assert set(look_up_rules(len(PROMPT) + 8, eos=[], lookup_lengths=(5,))) == {
        "prompt-lookup-k5", "prompt-lookup-k10", "prompt-lookup-k20"}


def test_draft_agrees_with_its_own_greedy_output_and_not_with_another():
    target, draft = tiny_pair("qwen2", "independent", seed=1)
    prompt = torch.tensor([PROMPT])
    own = draft.generate(prompt, max_new_tokens=12, do_sample=False)[0, prompt.shape[1] :].tolist()
    assert draft_agrees(draft, PROMPT, own) == [True] * 12
    other = target.generate(prompt, max_new_tokens=12, do_sample=False)[0, prompt.shape[1] :].tolist()
    expected, ids = [], prompt
    for token in other:  # the draft's greedy token after each prefix of the target's output
        expected.append(int(draft(ids).logits[0, -1].argmax()) == token)
        ids = torch.cat([ids, torch.tensor([[token]])], dim=-1)
    assert draft_agrees(draft, PROMPT, other) == expected
    assert not all(expected)


def test_copy_runs_follow_one_occurrence_of_known_tokens():
    # y = 7 8 9 7 8 5: at t = 0 the last token 3 was followed by 7 8 9 in the prompt; at t = 3 (after 9) nothing
    # follows a 9; at t = 4 (after 7) the prompt's 7 8 9 and y's own 7 8 both match 8, then 5 matches neither.
    assert copy_runs([3, 7, 8, 9, 1, 3], [7, 8, 9, 7, 8, 5]) == [3, 2, 1, 0, 1, 0]


def _brute_force(agrees, copies, costs, prompt_tokens, draft, free_draft, runs=None):
    """Every way to cut the output into rounds whose candidates are all accepted: the fastest one's seconds."""
    n, best = len(agrees), float("inf")
    draft_s = 0.0 if free_draft else costs.draft_s
    prefill = 0.0 if free_draft else costs.draft_prefill_s * prompt_tokens
    for cuts in itertools.product([False, True], repeat=n - 1):
        ends = [t for t in range(n - 1) if cuts[t]] + [n - 1]  # the target's own tokens; the last token is one
        total, drafted_ever, start = 0.0, False, 0
        for end in ends:
            candidates = range(start, end)
            copied = [i - start < runs[start] if runs else copies[i] for i in candidates]
            if any(not c and not (draft and agrees[i]) for c, i in zip(copied, candidates)):
                break
            drafted = copied.count(False)
            total += costs.round_s + costs.candidate_s * len(candidates) + draft_s * drafted
            if drafted and not drafted_ever:
                total, drafted_ever = total + prefill, True
            start = end + 1
        else:
            best = min(best, total)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_best_schedule_is_the_fastest(seed):
    rng = random.Random(seed)
    n = 9
    agrees = [rng.random() < 0.6 for _ in range(n)]
    copies = [rng.random() < 0.4 for _ in range(n)]
    for draft_s, prefill_s in ((0.05, 0.001), (0.2, 0.0), (0.01, 0.01)):
        costs = StepCosts(round_s=0.1, candidate_s=0.003, draft_s=draft_s, draft_prefill_s=prefill_s)
        for draft, free in ((True, False), (True, True), (False, False)):
            seconds, rounds, forwards = best_schedule(agrees, copies, costs, 100, draft=draft, free_draft=free)
            assert seconds == pytest.approx(_brute_force(agrees, copies, costs, 100, draft, free))
            assert sum(rounds) + len(rounds) == n  # each round yields its candidates and the target's token
            assert forwards <= sum(rounds)
        runs = [rng.randrange(4) for _ in range(n)]
        seconds, rounds, _ = best_schedule(agrees, copies, costs, 100, draft=False, runs=runs)
        assert seconds == pytest.approx(_brute_force(agrees, copies, costs, 100, False, False, runs))
