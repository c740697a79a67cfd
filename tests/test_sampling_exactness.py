"""Sampling with PACER must keep the target's distribution exactly.

On an 8-token vocabulary the exact joint distribution of the first two sampled tokens is enumerated from the
target; the empirical distribution of PACER's samples must pass a chi-square test against it, while two broken
generators (one that drops the block the head rejected, one that returns other logits than the ones it sampled
from) must fail it. The head used stops based on the drafted token's own probability, the hardest case for
exactness: a rule that looked at the rejected block's content to drop it would bias the output.
"""

import dataclasses
import math
import random

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from pacer_hf import PacerCandidateGenerator, PacerHead, PacerHeadConfig, PhrasePool
from pacer_hf.tiny_models import tiny_pair

VOCAB = 8
TEMPERATURE = 0.7
NUM_SAMPLES = 1200
PROMPT = torch.tensor([[0, 3, 5, 1]])


class _TokenProbabilityHead(PacerHead):
    """Predicts acceptance iff the drafted token had draft probability > 0.3: stops depend on the drafted token."""

    def forward(self, hidden_states, features):
        return 20.0 * (features[..., 0] - math.log(0.3))


class _DropsFailedBlock(PacerCandidateGenerator):
    """Broken on purpose: withholds the block the head rejected, so the draft length depends on that block."""

    def _draft_blocks(self, input_ids, max_new_tokens):
        tokens, scores, stopped = super()._draft_blocks(input_ids, max_new_tokens)
        if not stopped:
            return tokens, scores, stopped
        keep = tokens.shape[1] - self.config.block_size
        return tokens[:, :keep], (scores[:, :keep] if keep else None), stopped


class _ReturnsUnprocessedLogits(PacerCandidateGenerator):
    """Broken on purpose: returns the logits before temperature, not the distribution the tokens came from."""

    def get_candidates(self, input_ids, *args, **kwargs):
        ids, scores = super().get_candidates(input_ids)
        return ids, (None if scores is None else scores * TEMPERATURE)


@pytest.fixture(scope="module")
def pair_and_exact_joint():
    target, draft = tiny_pair("llama", "independent", seed=3, vocab_size=VOCAB)
    with torch.no_grad():
        first = (target(PROMPT).logits[0, -1] / TEMPERATURE).double().softmax(-1)  # p(x1)
        joint = torch.stack(
            [
                first[a] * (target(torch.cat([PROMPT, torch.tensor([[a]])], 1)).logits[0, -1] / TEMPERATURE)
                .double()
                .softmax(-1)
                for a in range(VOCAB)
            ]
        )  # [V, V]: p(x1, x2)
    return target, draft, joint.flatten().numpy()


class _RandomPhrases(PhrasePool):
    """Random phrases (its own generator, never the target's): some confirmed by the draft's samples, some not.
    With `key_length` 2 every round is a lookup round (phrase sent without drafting)."""

    def __init__(self, key_length: int = 1):
        super().__init__()
        self.rng, self.key_length = random.Random(7), key_length

    def lookup(self, context, max_length):
        return [self.rng.randrange(VOCAB) for _ in range(max(0, max_length))], self.key_length


class _DraftRowOnTail(PacerCandidateGenerator):
    """Broken on purpose: reports the draft's last q row for the tail tokens instead of their one-hot rows."""

    def get_candidates(self, input_ids, *args, **kwargs):
        ids, scores = super().get_candidates(input_ids)
        drafted = self.stats.draft_lengths[-1]
        if scores is not None and scores.shape[1] > drafted:
            scores = scores.clone()
            scores[:, drafted:] = scores[:, drafted - 1 : drafted]
        return ids, scores


class _TakesPhraseTokens(PacerCandidateGenerator):
    """Broken on purpose: takes each phrase token as drafted without the draft's own choice, reporting q for it."""

    def _forward(self, ids, phrase):
        self._pending = list(phrase)
        return super()._forward(ids, phrase)

    def _select(self, scores):
        if self._pending:
            return torch.tensor([[self._pending.pop(0)]])
        return super()._select(scores)


def _chi_square_pvalue(
    target, draft, joint: np.ndarray, generator_cls, block_size: int = 1, score_mode: str = "round", max_draft: int = 3,
    phrases: bool = False, key_length: int = 1, entropy_threshold: float | None = None,
) -> float:
    config = PacerHeadConfig(
        vocab_size=VOCAB, draft_hidden_size=32, block_size=block_size, max_draft=max_draft, threshold=0.5,
        score_mode=score_mode, decoding="sampling", phrase_length=2, phrase_tail=2,
    )
    if entropy_threshold is None:
        head = _TokenProbabilityHead(config)
    else:  # the library's weightless rule: stops that depend on the drafted prefix through q's entropy
        head = PacerHead(dataclasses.replace(config, architecture="entropy", entropy_threshold=entropy_threshold))
    pool = _RandomPhrases(key_length) if phrases else None
    torch.manual_seed(1234)
    counts = np.zeros(VOCAB * VOCAB)
    stops = confirmed = tails = 0
    for _ in range(NUM_SAMPLES):
        out = target.generate(
            PROMPT, assistant_model=draft, pacer_head=head, do_sample=True, temperature=TEMPERATURE, top_k=0,
            max_new_tokens=4, pacer_phrases=pool, pacer_candidate_generator=generator_cls,
        )
        first, second = out[0, PROMPT.shape[1] : PROMPT.shape[1] + 2].tolist()
        counts[first * VOCAB + second] += 1
        stops += head.last_stats.head_stops
        confirmed += head.last_stats.phrase_tokens_confirmed
        tails += sum(head.last_stats.tail_lengths)
    if max_draft > block_size and key_length == 1:
        assert stops > NUM_SAMPLES // 10, "the head must stop rounds often for this test to have power"
    if phrases and key_length == 1:  # mixed candidates, often: one-hot tail tokens, and phrase-confirmed draft tokens where there is room
        assert tails > NUM_SAMPLES // 10
        assert confirmed > NUM_SAMPLES // 10 or max_draft == 1
    expected = joint / joint.sum() * NUM_SAMPLES
    dense = expected >= 5  # chi-square needs expected counts >= 5: pool the rare cells into one
    observed = np.append(counts[dense], counts[~dense].sum())
    expected = np.append(expected[dense], expected[~dense].sum())
    return chisquare(observed, expected).pvalue


def test_sampling_matches_target_distribution(pair_and_exact_joint):
    assert _chi_square_pvalue(*pair_and_exact_joint, PacerCandidateGenerator) > 1e-3


@pytest.mark.parametrize("broken_cls", [_DropsFailedBlock, _ReturnsUnprocessedLogits])
def test_sampling_test_catches_broken_generator(pair_and_exact_joint, broken_cls):
    assert _chi_square_pvalue(*pair_and_exact_joint, broken_cls) < 1e-5


def test_sampling_with_the_entropy_rule_matches_target_distribution(pair_and_exact_joint):
    # 1.3 nats: about the median entropy of this draft's q at temperature 0.7 over the 8 tokens
    assert _chi_square_pvalue(*pair_and_exact_joint, PacerCandidateGenerator, entropy_threshold=1.3) > 1e-3


@pytest.mark.parametrize("block_size, score_mode", [(2, "block"), (2, "round")])
def test_sampling_with_larger_blocks_matches_target_distribution(pair_and_exact_joint, block_size, score_mode):
    pvalue = _chi_square_pvalue(
        *pair_and_exact_joint, PacerCandidateGenerator, block_size=block_size, score_mode=score_mode, max_draft=4
    )
    assert pvalue > 1e-3


# The chi-square test reads the first two sampled tokens: with max_draft 1 a round is one drafted token and a tail
# (one-hot rows at the second position); with max_draft 2 the second drafted token often comes from a confirmed phrase.
@pytest.mark.parametrize("max_draft", [1, 2])
def test_sampling_with_phrases_and_tail_matches_target_distribution(pair_and_exact_joint, max_draft):
    """Mixed candidates: drafted and phrase-confirmed tokens (rows: the draft's q) and a phrase tail (rows: one-hot)."""
    pvalue = _chi_square_pvalue(*pair_and_exact_joint, PacerCandidateGenerator, max_draft=max_draft, phrases=True)
    assert pvalue > 1e-3


def test_sampling_with_lookup_rounds_matches_target_distribution(pair_and_exact_joint):
    """Phrases keyed on 2+ tokens go to the target without drafting: candidates of one-hot rows only."""
    pvalue = _chi_square_pvalue(*pair_and_exact_joint, PacerCandidateGenerator, phrases=True, key_length=2)
    assert pvalue > 1e-3


@pytest.mark.parametrize("broken_cls, max_draft", [(_DraftRowOnTail, 1), (_TakesPhraseTokens, 2)])
def test_sampling_test_catches_broken_phrase_generator(pair_and_exact_joint, broken_cls, max_draft):
    assert _chi_square_pvalue(*pair_and_exact_joint, broken_cls, max_draft=max_draft, phrases=True) < 1e-5
