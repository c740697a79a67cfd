"""PACER on a CUDA device: the greedy equality grid, planned rounds, a padded pair and sampling (the chi-square test
with a negative control), on tiny models.

Skipped where torch sees no CUDA device (CI has none); `eval/gpu_check.py` runs these and the real-size overhead
measurement on a GPU machine.
"""

import functools

import pytest
import torch

from pacer_hf import PacerCandidateGenerator, PacerStats, PhrasePool
from pacer_hf.tiny_models import DRAFT_KINDS, TINY_ARCHS, tiny_pair, tiny_tokenizer

from conftest import HEAD_KINDS, PROMPT, make_head, scripted_rounds
from test_sampling_exactness import _chi_square_pvalue, _ReturnsUnprocessedLogits, exact_pair_and_joint

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here (CI has none)")
MAX_NEW_TOKENS = 21
DEVICE = "cuda"


@functools.lru_cache(maxsize=None)
def _pair(arch: str, draft_kind: str, draft_vocab_size: int | None = None):
    target, draft = tiny_pair(arch, draft_kind, seed=0, draft_vocab_size=draft_vocab_size)
    return target.to(DEVICE), draft.to(DEVICE)


def _plain(target) -> torch.Tensor:
    return target.generate(PROMPT.to(DEVICE), max_new_tokens=MAX_NEW_TOKENS, do_sample=False)


@pytest.mark.parametrize("rounds", ["draft", "scripted"])
@pytest.mark.parametrize("head_kind", HEAD_KINDS)
@pytest.mark.parametrize("draft_kind", DRAFT_KINDS)
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_greedy_equals_target_greedy_on_cuda(arch, draft_kind, head_kind, rounds):
    target, draft = _pair(arch, draft_kind)
    head = make_head(draft, head_kind, block_size=2, max_draft=8).to(DEVICE)
    generator = scripted_rounds(seed=3) if rounds == "scripted" else PacerCandidateGenerator
    stats = PacerStats()
    out = target.generate(PROMPT.to(DEVICE), assistant_model=draft, pacer_head=head, pacer_stats=stats,
                          pacer_phrases=PhrasePool() if rounds == "scripted" else None,
                          pacer_candidate_generator=generator, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    assert out.device.type == "cuda" and torch.equal(out, _plain(target))
    assert stats.new_tokens == MAX_NEW_TOKENS


def test_the_real_planner_and_a_padded_pair_on_cuda():
    target, draft = _pair("qwen2", "noisy", draft_vocab_size=92)
    head = make_head(draft, "entropy", block_size=1).to(DEVICE)
    out = target.generate(PROMPT.to(DEVICE), assistant_model=draft, pacer_head=head, pacer_phrases=True,
                          tokenizer=tiny_tokenizer(), assistant_tokenizer=tiny_tokenizer(),
                          max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    assert torch.equal(out, _plain(target))


@functools.lru_cache(maxsize=None)
def _exact_pair():
    return exact_pair_and_joint(DEVICE)


def test_sampling_keeps_the_target_distribution_on_cuda():
    # CUDA's sampler and kernels, the CPU test's chi-square: planned rounds of every kind, phrases confirmed by the draft
    assert _chi_square_pvalue(*_exact_pair(), scripted_rounds(seed=2), max_draft=2, phrases=True) > 1e-3


def test_the_chi_square_test_catches_a_broken_generator_on_cuda():
    assert _chi_square_pvalue(*_exact_pair(), _ReturnsUnprocessedLogits) < 1e-5


def test_a_head_on_another_device_than_the_draft_is_refused_with_the_fix():
    target, draft = _pair("llama", "noisy")
    with pytest.raises(ValueError, match="`pacer_head` is on cpu.*draft.*cuda.*head.to"):
        target.generate(PROMPT.to(DEVICE), assistant_model=draft, pacer_phrases=False, pacer_head=make_head(draft), max_new_tokens=4)


def test_the_entropy_rule_of_a_cuda_draft_runs_on_cuda():
    from pacer_hf import PacerHead

    target, draft = _pair("qwen2", "noisy")
    head = PacerHead.entropy_stop(draft)
    assert head.device.type == "cuda"
    out = target.generate(PROMPT.to(DEVICE), assistant_model=draft, pacer_head=head, max_new_tokens=MAX_NEW_TOKENS,
                          do_sample=False)
    assert torch.equal(out, _plain(target))
