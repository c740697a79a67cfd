"""Greedy PACER output must equal the target's own greedy output token for token, whatever the draft and head do."""

import functools

import pytest
import torch
from transformers.generation.streamers import BaseStreamer

from pacer_hf import PacerStats
from pacer_hf.tiny_models import DRAFT_KINDS, TINY_ARCHS, tiny_pair

from conftest import HEAD_KINDS, PROMPT, make_head

MAX_NEW_TOKENS = 21  # not a multiple of any block size: the length limit ends inside a block


@functools.lru_cache(maxsize=None)
def _pair(arch: str, draft_kind: str):
    return tiny_pair(arch, draft_kind, seed=0)


@functools.lru_cache(maxsize=None)
def _plain_greedy(arch: str, draft_kind: str, max_new_tokens: int = MAX_NEW_TOKENS) -> torch.Tensor:
    target, _ = _pair(arch, draft_kind)
    return target.generate(PROMPT, max_new_tokens=max_new_tokens, do_sample=False)


@pytest.mark.parametrize("block_size", [1, 2, 4, 8])
@pytest.mark.parametrize("head_kind", HEAD_KINDS)
@pytest.mark.parametrize("draft_kind", DRAFT_KINDS)
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_greedy_equals_target_greedy_grid(arch, draft_kind, head_kind, block_size):
    target, draft = _pair(arch, draft_kind)
    head = make_head(draft, head_kind, block_size=block_size, max_draft=2 * block_size)
    stats = PacerStats()
    out = target.generate(PROMPT, assistant_model=draft, pacer_phrases=False, pacer_head=head, pacer_stats=stats,
                          max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    assert torch.equal(out, _plain_greedy(arch, draft_kind))
    assert stats.new_tokens == MAX_NEW_TOKENS
    assert len(stats.draft_lengths) == stats.rounds
    assert all(a <= d for a, d in zip(stats.accepted_lengths, stats.draft_lengths))
    assert max(stats.draft_lengths) <= 2 * block_size
    if draft_kind == "same":  # a draft identical to the target: everything drafted is accepted
        assert stats.accepted_tokens == stats.drafted_tokens


def test_head_kinds_behave_as_named():
    target, draft = _pair("llama", "noisy")
    lengths = {}
    for kind in HEAD_KINDS:
        head, stats = make_head(draft, kind, block_size=2, max_draft=8), PacerStats()
        target.generate(PROMPT, assistant_model=draft, pacer_phrases=False, pacer_head=head, pacer_stats=stats, max_new_tokens=40,
                        do_sample=False)
        lengths[kind] = stats.draft_lengths[:-3]  # the last rounds are cut by the length limit
    assert set(lengths["always"]) == {8}
    assert set(lengths["never"]) == {2}
    assert len(set(lengths["random"])) > 1  # the mixed case: stops at different blocks
    assert len(set(lengths["entropy"])) > 1


def test_greedy_equality_when_eos_inside_block():
    target, draft = _pair("qwen2", "same")
    plain = _plain_greedy("qwen2", "same")
    new = plain[0, PROMPT.shape[1]:].tolist()
    position = next(i for i in range(5, len(new)) if new[i] not in new[:i])
    eos = new[position]  # first occurrence at `position`: inside a block of 4
    head, stats = make_head(draft, "always", block_size=4, max_draft=8), PacerStats()
    expected = target.generate(PROMPT, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, eos_token_id=eos)
    out = target.generate(
        PROMPT, assistant_model=draft, pacer_phrases=False, pacer_head=head, pacer_stats=stats, max_new_tokens=MAX_NEW_TOKENS,
        do_sample=False, eos_token_id=eos,
    )
    assert torch.equal(out, expected)
    assert out[0, -1].item() == eos and out.shape[1] == PROMPT.shape[1] + position + 1
    # drafting stopped at EOS: the draft never proposed tokens after it
    assert stats.drafted_tokens == position + 1


def test_greedy_equality_with_min_new_tokens_masking_eos():
    target, draft = _pair("llama", "noisy")
    new = _plain_greedy("llama", "noisy")[0, PROMPT.shape[1]:].tolist()
    eos = new[2]
    head = make_head(draft, "random", block_size=2, max_draft=8)
    kwargs = dict(max_new_tokens=MAX_NEW_TOKENS, do_sample=False, eos_token_id=eos, min_new_tokens=12)
    expected = target.generate(PROMPT, **kwargs)
    out = target.generate(PROMPT, assistant_model=draft, pacer_phrases=False, pacer_head=head, **kwargs)
    assert torch.equal(out, expected)
    assert eos not in out[0, PROMPT.shape[1]: PROMPT.shape[1] + 12].tolist()


def test_return_dict_in_generate_scores_match_plain():
    target, draft = _pair("gpt2", "noisy")
    head = make_head(draft, "random", block_size=2, max_draft=6)
    kwargs = dict(max_new_tokens=MAX_NEW_TOKENS, do_sample=False, return_dict_in_generate=True, output_scores=True)
    expected = target.generate(PROMPT, **kwargs)
    out = target.generate(PROMPT, assistant_model=draft, pacer_phrases=False, pacer_head=head, **kwargs)
    assert torch.equal(out.sequences, expected.sequences)
    assert len(out.scores) == len(expected.scores) == MAX_NEW_TOKENS
    for got, want in zip(out.scores, expected.scores):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


class _CollectingStreamer(BaseStreamer):
    def __init__(self):
        self.chunks = []

    def put(self, value):
        self.chunks.append(value.reshape(-1))

    def end(self):
        self.chunks.append(None)


def test_streamer_receives_exactly_the_returned_tokens():
    target, draft = _pair("qwen2", "noisy")
    head = make_head(draft, "random", block_size=2, max_draft=8)
    streamer = _CollectingStreamer()
    out = target.generate(
        PROMPT, assistant_model=draft, pacer_phrases=False, pacer_head=head, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
        streamer=streamer,
    )
    assert streamer.chunks[-1] is None
    streamed = torch.cat(streamer.chunks[:-1])
    assert torch.equal(streamed, out[0])


def test_transformers_confidence_stop_does_not_interfere():
    target, draft = _pair("llama", "independent")
    draft.generation_config.assistant_confidence_threshold = 0.99  # would stop every stock round after 1 token
    try:
        head, stats = make_head(draft, "always", block_size=2, max_draft=8), PacerStats()
        out = target.generate(PROMPT, assistant_model=draft, pacer_phrases=False, pacer_head=head, pacer_stats=stats, max_new_tokens=30,
                              do_sample=False)
    finally:
        draft.generation_config.assistant_confidence_threshold = 0.4
    assert torch.equal(out, target.generate(PROMPT, max_new_tokens=30, do_sample=False))
    assert max(stats.draft_lengths) == 8


def test_padded_prompt_greedy_equality():
    target, draft = _pair("llama", "noisy")
    ids = torch.cat([torch.zeros(1, 3, dtype=torch.long), PROMPT], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(PROMPT)], dim=1)
    head = make_head(draft, "random", block_size=2, max_draft=8)
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    out = target.generate(
        ids, attention_mask=mask, assistant_model=draft, pacer_phrases=False, pacer_head=head, max_new_tokens=MAX_NEW_TOKENS,
        do_sample=False,
    )
    assert torch.equal(out, expected)


def test_block_score_mode_and_per_call_overrides():
    target, draft = _pair("qwen2", "noisy")
    head, stats = make_head(draft, "random", block_size=2, max_draft=8), PacerStats()
    out = target.generate(
        PROMPT, assistant_model=draft, pacer_phrases=False, pacer_head=head, pacer_stats=stats, max_new_tokens=MAX_NEW_TOKENS,
        do_sample=False, pacer_score_mode="block", pacer_block_size=3, pacer_max_draft=6, pacer_threshold=0.0,
    )
    assert torch.equal(out, _plain_greedy("qwen2", "noisy"))
    assert max(stats.draft_lengths) == 6
    assert head.config.block_size == 2  # per-call overrides do not touch the head
