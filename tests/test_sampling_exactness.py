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

from pacer_core import NeuralHead
from pacer_hf import PacerCandidateGenerator, PacerHead, PacerHeadConfig, PacerStats, PhrasePool
from pacer_hf.phrase_drafting import PhraseCandidateGenerator
from pacer_hf.phrases import Phrase
from pacer_hf.tiny_models import tiny_pair

from conftest import scripted_rounds

VOCAB = 8
TEMPERATURE = 0.7
NUM_SAMPLES = 1200
PROMPT = torch.tensor([[0, 3, 5, 1]])
DRAFT_VOCAB = 4  # `pacer_draft_vocab`: the draft may propose 0-3 and 5 (the prompt's), not 4, 6 or 7 until they occur


class _TokenProbabilityHead(NeuralHead):
    """Predicts acceptance iff the drafted token had draft probability > 0.3: stops depend on the drafted token."""

    def forward(self, hidden_states, features):
        return 20.0 * (features[..., 0] - math.log(0.3))


class _DropsFailedBlock(PacerCandidateGenerator):
    """Broken on purpose: withholds the block the head rejected, so the draft length depends on that block."""

    def _draft_blocks(self, input_ids, room):
        run = super()._draft_blocks(input_ids, room)
        if run.end != "head":
            return run
        keep = run.tokens.shape[1] - self.config.block_size
        return dataclasses.replace(run, tokens=run.tokens[:, :keep], scores=run.scores[:, :keep] if keep else None)


class _ReturnsUnprocessedLogits(PacerCandidateGenerator):
    """Broken on purpose: returns the logits before temperature, not the distribution the tokens came from."""

    def get_candidates(self, input_ids, *args, **kwargs):
        ids, scores = super().get_candidates(input_ids)
        return ids, (None if scores is None else scores * TEMPERATURE)


@pytest.fixture(scope="module")
def pair_and_exact_joint():
    return exact_pair_and_joint()


def exact_pair_and_joint(device: str = "cpu") -> tuple:
    """The tiny pair on `device`, and the exact p(x1, x2) of its target (enumerated on the CPU) as `[V * V]`."""
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
    return target.to(device), draft.to(device), joint.flatten().numpy()


class _GreedyDraftPhrases(PhrasePool):
    """Phrases of up to 4 tokens that are the draft's greedy continuation of the context (cached per context): the
    draft's samples confirm them often (about half the time on this pair, against an eighth for uniform tokens), and
    the planner copies them (one-hot rows). Any phrase keeps the output exact; these give the test power, and since
    they are argmax tokens, not samples of q, a generator that takes them as drafted tokens is visibly biased."""

    def __init__(self, draft):
        super().__init__(phrase_length=2)
        self.draft = draft
        self._cache: dict[tuple[int, ...], list[int]] = {}

    @torch.no_grad()
    def _continuation(self, context: tuple[int, ...]) -> list[int]:
        if context not in self._cache:
            ids = list(context)
            for _ in range(4):
                ids.append(int(self.draft(torch.tensor([ids], device=self.draft.device)).logits[0, -1].argmax()))
            self._cache[context] = ids[len(context) :]
        return self._cache[context]

    def lookup(self, context, max_length):
        return Phrase(self._continuation(tuple(context))[: max(0, max_length)], "sequence", 1)

    lookup_earliest = lookup


class _DraftRowOnCopies(PhraseCandidateGenerator):
    """Broken on purpose: reports the draft's last q row for the copied tokens after a draft, not their one-hot rows."""

    def get_candidates(self, input_ids, *args, **kwargs):
        ids, scores = super().get_candidates(input_ids)
        drafted = self.stats.draft_lengths[-1]
        if scores is not None and drafted and scores.shape[1] > drafted:
            scores = scores.clone()
            scores[:, drafted:] = scores[:, drafted - 1 : drafted]
        return ids, scores


class _TakesPhraseTokens(PhraseCandidateGenerator):
    """Broken on purpose: takes each phrase token fed to the draft as drafted, without the draft's own choice,
    reporting the draft's q for it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._pending, forward = [], self.draft.forward

        def recording_forward(ids, guess):
            self._pending = list(guess)
            return forward(ids, guess)

        self.draft.forward = recording_forward

    def _select(self, ids, logits, hidden):
        step = super()._select(ids, logits, hidden)
        if self._pending:
            step.token = torch.tensor([[self._pending.pop(0)]])
        return step


class _KeepsConfirmedDraftsOnly(PhraseCandidateGenerator):
    """Broken on purpose, the bug a planner that filters drafts could have: a round keeps its drafted tokens only as
    far as they agree with the phrase looked up at its start, so whether a drafted token is sent depends on itself."""

    def _draft_blocks(self, input_ids, room):
        phrase = self.phrases.lookup(input_ids[0].tolist(), room).tokens
        run = super()._draft_blocks(input_ids, room)
        keep = 0
        while keep < run.tokens.shape[1] and keep < len(phrase) and int(run.tokens[0, keep]) == phrase[keep]:
            keep += 1
        return dataclasses.replace(run, tokens=run.tokens[:, :keep], scores=run.scores[:, :keep] if keep else None)


class _DrawsRestrictedReportsWhole(PacerCandidateGenerator):
    """Broken on purpose, the bug a restricted draft vocabulary could have: the draft draws only ids below
    `DRAFT_VOCAB` and the sequence's, but reports its whole-vocabulary row as the distribution it drew from."""

    def _select(self, ids, logits, hidden):
        step = super()._select(ids, logits, hidden)
        allowed = torch.zeros(VOCAB, dtype=torch.bool, device=ids.device)
        allowed[:DRAFT_VOCAB] = True
        allowed[ids[0]] = True
        drawn = torch.multinomial(step.scores.masked_fill(~allowed, -math.inf).softmax(dim=-1), num_samples=1)
        return dataclasses.replace(step, token=drawn)


def _chi_square_pvalue(
    target, draft, joint: np.ndarray, generator_cls, block_size: int = 1, score_mode: str = "round", max_draft: int = 3,
    phrases: bool = False, entropy_threshold: float | None = None, check_power: bool = True,
    draft_vocab: int | None = None,
) -> float:
    config = PacerHeadConfig(
        vocab_size=VOCAB, draft_hidden_size=32, block_size=block_size, max_draft=max_draft, threshold=0.5,
        score_mode=score_mode, decoding="sampling",
    )
    if entropy_threshold is None:
        head = _TokenProbabilityHead(config)
    else:  # the library's weightless rule: stops that depend on the drafted prefix through q's entropy
        head = PacerHead(dataclasses.replace(config, architecture="entropy", entropy_threshold=entropy_threshold))
    head = head.to(target.device)
    pool = _GreedyDraftPhrases(draft) if phrases else None
    torch.manual_seed(1234)
    counts = np.zeros(VOCAB * VOCAB)
    stops = confirmed = copied = 0
    kinds = set()
    for _ in range(NUM_SAMPLES):
        stats = PacerStats()
        out = target.generate(
            PROMPT.to(target.device), assistant_model=draft, pacer_head=head, do_sample=True, temperature=TEMPERATURE,
            top_k=0, max_new_tokens=4, pacer_phrases=pool, pacer_candidate_generator=generator_cls, pacer_stats=stats,
            pacer_draft_vocab=draft_vocab,
        )
        first, second = out[0, PROMPT.shape[1] : PROMPT.shape[1] + 2].tolist()
        counts[first * VOCAB + second] += 1
        stops += stats.head_stops
        confirmed += stats.phrase_tokens_confirmed
        copied += sum(stats.copied_lengths)
        kinds |= set(stats.round_kinds)
    if check_power and max_draft > block_size:
        assert stops > NUM_SAMPLES // 10, "the head must stop rounds often for this test to have power"
    if check_power and phrases:  # mixed candidates, often: copied tokens (one-hot rows) and phrase-confirmed draft tokens
        assert copied > NUM_SAMPLES // 10 and {"copy", "draft", "step"} <= kinds
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


# The chi-square test reads the first two sampled tokens. Every planner choice occurs, at random: copy rounds (one-hot
# rows only), drafted rounds with copied tails (mixed rows), plain steps; with max_draft 2 the second drafted token
# often comes from a confirmed phrase.
@pytest.mark.parametrize("max_draft", [1, 2])
def test_sampling_with_planned_rounds_matches_target_distribution(pair_and_exact_joint, max_draft):
    pvalue = _chi_square_pvalue(*pair_and_exact_joint, scripted_rounds(seed=max_draft), max_draft=max_draft,
                                phrases=True)
    assert pvalue > 1e-3


@pytest.mark.parametrize("broken_cls, max_draft", [(_DraftRowOnCopies, 1), (_TakesPhraseTokens, 2),
                                                   (_KeepsConfirmedDraftsOnly, 3)])
def test_sampling_test_catches_broken_phrase_generator(pair_and_exact_joint, broken_cls, max_draft):
    # Every round drafts (then copies a tail half the time), so that each bug meets every sample; a broken generator
    # must fail on its p-value, whatever else its rounds do.
    generator = scripted_rounds(seed=5, base=broken_cls, kinds=("draft",))
    pvalue = _chi_square_pvalue(*pair_and_exact_joint, generator, max_draft=max_draft, phrases=True, check_power=False)
    assert pvalue < 1e-5


# The draft scoring part of its vocabulary (`pacer_draft_vocab`): it draws from q restricted to the allowed ids and
# reports that q, in the paper's loop and in planned rounds.
@pytest.mark.parametrize("phrases", [False, True])
def test_sampling_with_a_restricted_draft_vocabulary_matches_target_distribution(pair_and_exact_joint, phrases):
    target, draft, _ = pair_and_exact_joint
    with torch.no_grad():
        q = (draft(PROMPT).logits[0, -1] / TEMPERATURE).softmax(-1)
    assert float(q[[4, 6, 7]].sum()) > 0.2, "the restriction must change the draft's q for this test to have power"
    generator = scripted_rounds(seed=7) if phrases else PacerCandidateGenerator
    pvalue = _chi_square_pvalue(*pair_and_exact_joint, generator, phrases=phrases, max_draft=2 if phrases else 3,
                                draft_vocab=DRAFT_VOCAB)
    assert pvalue > 1e-3


def test_sampling_test_catches_a_draft_that_reports_another_vocabulary_than_it_drew_from(pair_and_exact_joint):
    assert _chi_square_pvalue(*pair_and_exact_joint, _DrawsRestrictedReportsWhole) < 1e-5
