"""Phrase drafting: the pool, and that phrases change only how many draft tokens one draft forward yields, never the
output (greedy equality grid, padded prompts, EOS and the length limit inside a phrase)."""

import functools
import random

import pytest
import torch

from pacer_hf import PhrasePool, phrases
from pacer_hf.tiny_models import DRAFT_KINDS, TINY_ARCHS, tiny_pair

from conftest import PROMPT, make_head

MAX_NEW_TOKENS = 21
POOL_KINDS = ("always", "never", "random")


class ScriptedPool(PhrasePool):
    """Proposes phrases that the draft's greedy choice always, never or randomly confirms: "always" is the draft's
    own greedy continuation, "never" that continuation with every token shifted by one, "random" each token of it
    kept or replaced by a random token with probability 1/2. It says its key had `key_length` tokens: 1 feeds the
    phrases to the draft, 2 or more also sends them to the target without drafting (lookup rounds)."""

    def __init__(self, draft, kind: str, seed: int = 0, key_length: int = 1):
        super().__init__()
        self.draft, self.kind, self.rng, self.key_length = draft, kind, random.Random(seed), key_length
        self.vocab_size = draft.config.get_text_config().vocab_size

    @torch.no_grad()
    def lookup(self, context, max_length):
        if max_length <= 0:
            return [], 0
        ids, phrase = torch.tensor([context]), []
        for _ in range(max_length):
            token = int(self.draft(ids).logits[0, -1].argmax())
            ids = torch.cat([ids, torch.tensor([[token]])], dim=-1)
            if self.kind == "never" or (self.kind == "random" and self.rng.random() < 0.5):
                token = (token + 1 + self.rng.randrange(self.vocab_size - 1) * (self.kind == "random")) % self.vocab_size
            phrase.append(token)
        return phrase, self.key_length


@functools.lru_cache(maxsize=None)
def _pair(arch: str, draft_kind: str):
    return tiny_pair(arch, draft_kind, seed=0)


@functools.lru_cache(maxsize=None)
def _plain_greedy(arch: str, draft_kind: str) -> torch.Tensor:
    return _pair(arch, draft_kind)[0].generate(PROMPT, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)


# ---- the pool ---------------------------------------------------------------------------------------------------


def test_pool_indexes_incrementally_and_the_longest_key_wins():
    pool = PhrasePool(phrase_length=4)
    pool.start_sequence([1, 2, 3, 9, 9, 5, 2, 3])
    # (2, 3) was last followed by 9: the 2-token key matches, the 3-token key (5, 2, 3) does not
    assert pool.lookup([7, 5, 2, 3], 4) == ([9, 9, 5, 2], 2)
    assert pool.lookup([1, 2, 3], 2) == ([9, 9], 3)  # 3-token key, cut to max_length
    pool.extend([4, 4])  # now (2, 3) was last followed by 4: the latest occurrence wins
    assert pool.lookup([8, 2, 3], 8) == ([4, 4], 2)
    assert pool.lookup([6, 6, 4], 3) == ([4], 1)  # the n-gram ending at the last token has no continuation of its own
    assert pool.lookup([77], 3) == ([], 0)
    assert pool.lookup([1, 2, 3], 0) == ([], 0)


def test_pool_follows_the_occurrence_that_matches_furthest_back():
    pool = PhrasePool(phrase_length=3)
    pool.start_sequence([5, 1, 2, 3, 7, 8, 1, 2, 3, 9, 4, 1, 2, 3, 6])
    # (1, 2, 3) occurred three times; only the first was preceded by 5, as the context is: its phrase, matched on 4
    assert pool.lookup([0, 5, 1, 2, 3], 3) == ([7, 8, 1], 4)
    assert pool.lookup([4, 1, 2, 3], 3) == ([6], 4)  # preceded by 4: the latest occurrence, matched on 4
    assert pool.lookup([0, 1, 2, 3], 3) == ([6], 3)  # no occurrence matches further back: the latest wins
    # The match is followed back at most MAX_MATCH_LENGTH tokens: beyond that, the earlier occurrence's longer
    # match no longer counts, and the latest occurrence wins the tie.
    cap = phrases.MAX_MATCH_LENGTH
    long = list(range(100, 100 + cap + 8))
    pool.start_sequence(long + [1] + long[-cap:] + [2])
    assert pool.lookup(long, 1) == ([2], cap)


def test_incremental_index_equals_one_scan():
    tokens = [random.Random(0).randrange(5) for _ in range(60)]
    one, many = PhrasePool(), PhrasePool()
    one.start_sequence(tokens)
    many.start_sequence(tokens[:7])
    for i in range(7, 60, 5):
        many.extend(tokens[i : i + 5])
    for end in range(1, 61):
        assert one.lookup(tokens[:end], 8) == many.lookup(tokens[:end], 8)


def test_pool_is_bounded_lru_and_warm_starts_the_next_call():
    pool = PhrasePool(max_phrases=3, phrase_length=2)
    pool.add([1], [10, 11, 12])
    pool.add([2], [20])
    pool.add([3], [30])
    assert pool.lookup([1], 5) == ([10, 11], 1)  # stored phrases keep `phrase_length` tokens; the look-up refreshes 1
    pool.add([4], [40])  # evicts the least recently used: 2
    assert len(pool) == 3 and pool.lookup([2], 5) == ([], 0) and pool.lookup([1], 5) == ([10, 11], 1)
    warm = PhrasePool()
    warm.start_sequence([5, 6, 7, 8])
    warm.start_sequence([1])  # the next call: the previous sequence moves into the stored phrases
    assert warm.lookup([5, 6, 7], 8) == ([8], 3) and warm.lookup([5], 8) == ([6, 7, 8], 1)
    warm.clear()
    assert len(warm) == 0 and warm.lookup([5, 6, 7], 8) == ([], 0)


@pytest.mark.parametrize("kwargs", [{"max_phrases": 0}, {"phrase_length": 0}, {"phrase_length": 2.5}])
def test_pool_refuses_bad_settings(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        PhrasePool(**kwargs)


# ---- greedy equality ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key_length", [1, 3])
@pytest.mark.parametrize("block_size", [1, 4])
@pytest.mark.parametrize("pool_kind", POOL_KINDS)
@pytest.mark.parametrize("draft_kind", DRAFT_KINDS)
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_greedy_with_phrases_equals_target_greedy_grid(arch, draft_kind, pool_kind, block_size, key_length):
    target, draft = _pair(arch, draft_kind)
    head = make_head(draft, "random", block_size=block_size, max_draft=2 * block_size)
    pool = ScriptedPool(draft, pool_kind, key_length=key_length)
    out = target.generate(
        PROMPT, assistant_model=draft, pacer_head=head, pacer_phrases=pool, pacer_phrase_length=3,
        pacer_phrase_tail=3, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
    )
    assert torch.equal(out, _plain_greedy(arch, draft_kind))
    stats = head.last_stats
    assert stats.new_tokens == MAX_NEW_TOKENS
    # every confirmed phrase token saved one draft forward
    assert sum(stats.draft_lengths) == sum(stats.draft_forwards) + stats.phrase_tokens_confirmed
    assert all(a <= d + t for a, d, t in zip(stats.accepted_lengths, stats.draft_lengths, stats.tail_lengths))
    if key_length > 1:  # every round found a phrase keyed on 3 tokens: lookup rounds only, the draft never ran
        assert sum(stats.draft_lengths) == 0 and sum(stats.tail_lengths) > 0
    elif pool_kind == "always" and max(stats.draft_lengths) > 1:  # every phrase token is the draft's own choice
        assert stats.tokens_per_draft_forward > 1
    elif pool_kind == "never":
        assert stats.phrase_tokens_confirmed == 0 and stats.tokens_per_draft_forward == 1


def test_tail_follows_full_length_rounds_only_and_stays_exact():
    target, draft = _pair("qwen2", "noisy")
    head = make_head(draft, "random", block_size=2, max_draft=4)
    out = target.generate(
        PROMPT, assistant_model=draft, pacer_head=head, pacer_phrases=ScriptedPool(draft, "random"),
        pacer_phrase_tail=3, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
    )
    assert torch.equal(out, _plain_greedy("qwen2", "noisy"))
    stats = head.last_stats
    assert sum(stats.tail_lengths) > 0
    assert all(t == 0 for d, t in zip(stats.draft_lengths, stats.tail_lengths) if d < 4)
    off = make_head(draft, "random", block_size=2, max_draft=4)
    target.generate(PROMPT, assistant_model=draft, pacer_head=off, pacer_phrases=ScriptedPool(draft, "random"),
                    pacer_phrase_tail=0, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    assert sum(off.last_stats.tail_lengths) == 0


def test_greedy_with_phrases_when_eos_or_the_length_limit_falls_inside_a_phrase():
    target, draft = _pair("llama", "same")
    plain = _plain_greedy("llama", "same")
    new = plain[0, PROMPT.shape[1] :].tolist()
    position = next(i for i in range(5, len(new)) if new[i] not in new[:i])
    eos = new[position]
    for max_new_tokens in (position + 1, 9, 13):
        kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos)
        head = make_head(draft, "always", block_size=1, max_draft=8)
        out = target.generate(PROMPT, assistant_model=draft, pacer_head=head, pacer_phrases=ScriptedPool(draft, "always"),
                              pacer_phrase_length=8, **kwargs)
        assert torch.equal(out, target.generate(PROMPT, **kwargs))
        assert head.last_stats.phrase_tokens_confirmed > 0


def test_greedy_with_phrases_and_min_new_tokens():
    target, draft = _pair("gpt2", "noisy")
    eos = _plain_greedy("gpt2", "noisy")[0, PROMPT.shape[1] + 2].item()
    kwargs = dict(max_new_tokens=MAX_NEW_TOKENS, do_sample=False, eos_token_id=eos, min_new_tokens=12)
    head = make_head(draft, "random", block_size=2, max_draft=8)
    out = target.generate(PROMPT, assistant_model=draft, pacer_head=head, pacer_phrases=ScriptedPool(draft, "random"),
                          **kwargs)
    assert torch.equal(out, target.generate(PROMPT, **kwargs))


def test_greedy_with_phrases_on_a_padded_prompt():
    target, draft = _pair("llama", "noisy")
    ids = torch.cat([torch.zeros(1, 3, dtype=torch.long), PROMPT], dim=-1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(PROMPT)], dim=-1)
    kwargs = dict(attention_mask=mask, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, pad_token_id=0)
    head = make_head(draft, "random", block_size=2, max_draft=8)
    out = target.generate(ids, assistant_model=draft, pacer_head=head, pacer_phrases=ScriptedPool(draft, "random"),
                          **kwargs)
    assert torch.equal(out, target.generate(ids, **kwargs))


def test_real_pool_learns_within_a_call_and_across_calls():
    """The shipped pool on a repetitive prompt: phrases confirm tokens, output stays exact, and a pool passed to the
    next call starts warm."""
    target, draft = _pair("qwen2", "same")
    prompt = torch.tensor([[0] + [11, 42, 7, 23, 5, 19] * 4])
    plain = target.generate(prompt, max_new_tokens=30, do_sample=False)
    pool = PhrasePool()
    head = make_head(draft, "always", block_size=1, max_draft=8)
    for _ in range(2):
        out = target.generate(prompt, assistant_model=draft, pacer_head=head, pacer_phrases=pool, max_new_tokens=30,
                              do_sample=False)
        assert torch.equal(out, plain)
        assert sum(head.last_stats.tail_lengths) > 0  # the repeated prompt is copied in lookup rounds
        assert head.last_stats.tail_tokens_accepted > 0
    assert len(pool) > 0  # the first call's sequence was stored when the second started


# ---- the API --------------------------------------------------------------------------------------------------


def test_phrase_settings_are_checked():
    target, draft = _pair("llama", "noisy")
    head = make_head(draft)
    with pytest.raises(TypeError, match="pacer_phrases"):
        target.generate(PROMPT, assistant_model=draft, pacer_head=head, pacer_phrases="yes", max_new_tokens=4)
    with pytest.raises(ValueError, match="pacer_phrases=True"):
        target.generate(PROMPT, assistant_model=draft, pacer_head=head, pacer_phrase_length=4, max_new_tokens=4)
    with pytest.raises(ValueError, match="without `pacer_head`"):
        target.generate(PROMPT, assistant_model=draft, pacer_phrases=True, max_new_tokens=4)
    with pytest.raises(ValueError, match="phrase_length"):
        target.generate(PROMPT, assistant_model=draft, pacer_head=head, pacer_phrases=True, pacer_phrase_length=0,
                        max_new_tokens=4)
    with pytest.raises(ValueError, match="phrase_tail"):
        target.generate(PROMPT, assistant_model=draft, pacer_head=head, pacer_phrases=True, pacer_phrase_tail=-1,
                        max_new_tokens=4)


def test_candidate_rows_are_the_distributions_the_tokens_were_drawn_from():
    TEMPERATURE = 0.3
    """Drafted tokens (phrase-confirmed or not) carry the draft's processed q; tail tokens a one-hot row; never None."""
    from pacer_hf import PacerCandidateGenerator

    rounds = []

    class Recording(PacerCandidateGenerator):
        def get_candidates(self, input_ids, *args, **kwargs):
            ids, scores = super().get_candidates(input_ids, *args, **kwargs)
            rounds.append((input_ids.shape[1], ids, scores, self.stats.draft_lengths[-1]))
            return ids, scores

    target, draft = _pair("qwen2", "noisy")
    head = make_head(draft, "random", block_size=2, max_draft=4, decoding="sampling")
    # a low temperature, so that the draft's samples often equal its argmax, which the "always" pool proposes
    target.generate(PROMPT, assistant_model=draft, pacer_head=head, pacer_phrases=ScriptedPool(draft, "always"),
                    pacer_candidate_generator=Recording, pacer_phrase_tail=3, max_new_tokens=MAX_NEW_TOKENS, do_sample=True, temperature=TEMPERATURE,
                    top_k=0)
    assert sum(head.last_stats.tail_lengths) > 0 and head.last_stats.phrase_tokens_confirmed > 0
    for length, ids, scores, drafted in rounds:
        if ids.shape[1] == length:
            continue
        assert scores is not None and scores.shape[1] == ids.shape[1] - length
        tokens = ids[0, length:]
        rows = scores[0]  # [k + e, V]
        with torch.no_grad():  # the draft's q on each drafted token's own prefix, recomputed without a cache
            q = draft(ids[:, : length + drafted - 1]).logits[0, length - 1 :] / TEMPERATURE  # [drafted, V]
        torch.testing.assert_close(rows[:drafted], q.float(), atol=1e-4, rtol=1e-4)
        tail = rows[drafted:]
        assert (tail.argmax(-1) == tokens[drafted:]).all()
        assert torch.equal(tail.softmax(-1), torch.nn.functional.one_hot(tokens[drafted:], rows.shape[-1]).float())


def test_none_means_not_set_for_every_pacer_keyword():
    target, draft = _pair("llama", "noisy")
    head = make_head(draft)
    out = target.generate(PROMPT, assistant_model=draft, pacer_head=head, pacer_phrases=None, pacer_threshold=None,
                          pacer_phrase_length=None, max_new_tokens=6, do_sample=False)
    assert torch.equal(out, target.generate(PROMPT, max_new_tokens=6, do_sample=False))
    assert head.last_stats.phrase_tokens_offered == 0 and head.last_stats.tail_lengths == []
