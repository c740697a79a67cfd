"""Pairs that share one tokenizer but pad their embeddings differently (Qwen2.5-0.5B's 151,936 rows against
Qwen2.5-7B's 152,064): token-level PACER, exact in greedy decoding and sampling, with and without planned rounds, even
when the target emits a padded id the draft has no embedding for; pairs with different tokenizers stay refused."""

import copy
import functools

import numpy as np
import pytest
import torch

from pacer_hf import PacerCandidateGenerator, PacerStats, PhrasePool
from pacer_hf.tiny_models import TINY_ARCHS, TINY_VOCAB_SIZE, tiny_pair, tiny_tokenizer

from conftest import PROMPT, make_head, scripted_rounds

MAX_NEW_TOKENS = 24
# The tiny tokenizer has 91 tokens; the target has 96 rows. The draft has fewer rows (92: the target can emit ids
# 92-95 that the draft cannot read) or more (100: rows the target lacks, never proposed).
DRAFT_ROWS = (92, 100)


@functools.lru_cache(maxsize=None)
def _pair(arch: str, draft_rows: int, draft_kind: str = "noisy"):
    return tiny_pair(arch, draft_kind, seed=0, draft_vocab_size=draft_rows)


@functools.lru_cache(maxsize=1)
def _tokenizers():
    return {"tokenizer": tiny_tokenizer(), "assistant_tokenizer": tiny_tokenizer()}


@functools.lru_cache(maxsize=None)
def _plain(arch: str, draft_rows: int, draft_kind: str = "noisy") -> torch.Tensor:
    return _pair(arch, draft_rows, draft_kind)[0].generate(PROMPT, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)


@pytest.mark.parametrize("rounds", ["draft", "scripted"])
@pytest.mark.parametrize("head_kind", ["always", "random", "entropy"])
@pytest.mark.parametrize("draft_kind", ["same", "noisy"])
@pytest.mark.parametrize("draft_rows", DRAFT_ROWS)
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_padded_pair_greedy_equals_target_greedy(arch, draft_rows, draft_kind, head_kind, rounds):
    target, draft = _pair(arch, draft_rows, draft_kind)
    head = make_head(draft, head_kind, block_size=2, max_draft=8)
    assert head.config.vocab_size == draft_rows
    stats = PacerStats()
    generator = scripted_rounds(seed=draft_rows) if rounds == "scripted" else PacerCandidateGenerator
    out = target.generate(PROMPT, assistant_model=draft, pacer_head=head, pacer_stats=stats,
                          pacer_phrases=PhrasePool() if rounds == "scripted" else None,
                          pacer_candidate_generator=generator, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                          **_tokenizers())
    assert torch.equal(out, _plain(arch, draft_rows, draft_kind))
    emits_padded_id = bool((out[0, PROMPT.shape[1] :] >= draft_rows).any())  # an id the draft cannot propose
    if draft_kind == "same" and rounds == "draft" and not emits_padded_id:  # the target with other padding
        assert stats.accepted_tokens == stats.drafted_tokens > 0


def test_a_padded_id_the_target_emits_does_not_break_the_draft():
    target, draft = _pair("llama", 92)
    plain = _plain("llama", 92)[0, PROMPT.shape[1] :].tolist()
    assert any(token >= 92 for token in plain)  # the target emits ids the draft has no embedding for
    head = make_head(draft, "always", block_size=2, max_draft=8)
    stats = PacerStats()
    out = target.generate(PROMPT, assistant_model=draft, pacer_phrases=False, pacer_head=head, pacer_stats=stats,
                          max_new_tokens=MAX_NEW_TOKENS, do_sample=False, **_tokenizers())
    assert out[0, PROMPT.shape[1] :].tolist() == plain and stats.drafted_tokens > 0


def test_draft_rows_are_the_targets_width_and_never_propose_a_row_the_target_lacks():
    rounds = []

    class Recording(PacerCandidateGenerator):
        def get_candidates(self, input_ids, *args, **kwargs):
            ids, scores = super().get_candidates(input_ids, *args, **kwargs)
            rounds.append((ids[0, input_ids.shape[1] :], scores))
            return ids, scores

    for draft_rows in DRAFT_ROWS:
        target, draft = _pair("qwen2", draft_rows)
        head = make_head(draft, "always", decoding="sampling")
        target.generate(PROMPT, assistant_model=draft, pacer_head=head, max_new_tokens=12,
                        pacer_candidate_generator=Recording, do_sample=True, **_tokenizers())
        for tokens, scores in rounds:
            if scores is None:
                continue
            assert scores.shape[-1] == TINY_VOCAB_SIZE  # the target's width
            assert (tokens < min(draft_rows, TINY_VOCAB_SIZE)).all()
            if draft_rows < TINY_VOCAB_SIZE:  # rows the draft lacks are impossible tokens
                assert torch.isinf(scores[..., draft_rows:]).all()
        rounds.clear()


def test_a_padded_pair_without_tokenizers_or_with_different_ones_is_refused_with_the_fix():
    target, draft = _pair("llama", 100)
    head = make_head(draft)
    with pytest.raises(ValueError, match="100 embedding rows and the target 96.*`tokenizer=.*`assistant_tokenizer="):
        target.generate(PROMPT, assistant_model=draft, pacer_phrases=False, pacer_head=head, max_new_tokens=4)
    other = copy.deepcopy(tiny_tokenizer())
    other.add_tokens(["<extra>"])
    with pytest.raises(ValueError, match="tokenizer` and `assistant_tokenizer` differ.*universal assisted generation"):
        target.generate(PROMPT, assistant_model=draft, pacer_phrases=False, pacer_head=head, max_new_tokens=4, tokenizer=tiny_tokenizer(),
                        assistant_tokenizer=other)


def test_collect_and_a_head_record_both_vocabulary_sizes(tmp_path):
    from pacer_hf.collection import CollectionConfig, collect, load_collection
    from pacer_hf.threshold import CostModel
    from pacer_hf.training import TrainingConfig, train

    target, draft = _pair("llama", 100)
    prompts = [[0, 11, 42, 7, 23, 5], [0, 9, 8, 7, 6, 5], [0, 1, 2, 3, 4, 5], [0, 5, 4, 3, 2, 1]]
    with pytest.raises(ValueError, match="embedding rows"):
        collect(target, draft, prompts, tmp_path / "refused")
    tokenizers = _tokenizers()
    manifest = collect(target, draft, prompts, tmp_path / "data", tokenizer=tokenizers["tokenizer"],
                       draft_tokenizer=tokenizers["assistant_tokenizer"], config=CollectionConfig(max_new_tokens=12))
    assert (manifest["draft"]["vocab_size"], manifest["target"]["vocab_size"]) == (100, 96)
    collection = load_collection(tmp_path / "data")
    assert 0 < collection.soft_label.min() and collection.soft_label.max() <= 1 + 1e-6
    result = train(tmp_path / "data", tmp_path / "head", cost=CostModel(draft=0.3),
                   config=TrainingConfig(epochs=1, val_fraction=0.25))
    assert (result.head.config.vocab_size, result.head.config.target_vocab_size) == (100, 96)


# ---- sampling ---------------------------------------------------------------------------------------------------


VOCAB, DRAFT_VOCAB = 12, 8  # the target can sample ids 8-11, which the draft has no rows for
TEMPERATURE = 0.7
SAMPLES = 1200
SAMPLING_PROMPT = torch.tensor([[0, 3, 5, 1]])


def test_padded_pair_sampling_matches_the_target_distribution():
    from scipy.stats import chisquare

    from pacer_hf.phrases import Phrase

    class Tokenizer:  # what the pair check reads of two equal tokenizers of VOCAB - 4 tokens
        def get_vocab(self):
            return {str(i): i for i in range(DRAFT_VOCAB)}

        def __len__(self):
            return DRAFT_VOCAB

    class RandomPhrases(PhrasePool):
        def __init__(self):
            super().__init__(phrase_length=2)
            self.rng = np.random.default_rng(7)

        def lookup(self, context, max_length):
            return Phrase(self.rng.integers(0, VOCAB, size=max(0, min(max_length, 3))).tolist(), "sequence", 1)

        lookup_earliest = lookup

    target, draft = tiny_pair("llama", "independent", seed=3, vocab_size=VOCAB, draft_vocab_size=DRAFT_VOCAB)
    with torch.no_grad():
        first = (target(SAMPLING_PROMPT).logits[0, -1] / TEMPERATURE).double().softmax(-1)
        joint = torch.stack([first[a] * (target(torch.cat([SAMPLING_PROMPT, torch.tensor([[a]])], 1)).logits[0, -1]
                                          / TEMPERATURE).double().softmax(-1) for a in range(VOCAB)]).flatten().numpy()
    head = make_head(draft, "entropy", block_size=1, max_draft=3, decoding="sampling", entropy_threshold=1.3)
    torch.manual_seed(1234)
    counts, padded = np.zeros(VOCAB * VOCAB), 0
    for _ in range(SAMPLES):
        out = target.generate(SAMPLING_PROMPT, assistant_model=draft, pacer_head=head, do_sample=True,
                              temperature=TEMPERATURE, top_k=0, max_new_tokens=4, pacer_phrases=RandomPhrases(),
                              pacer_candidate_generator=scripted_rounds(seed=11), tokenizer=Tokenizer(),
                              assistant_tokenizer=Tokenizer())
        first_token, second_token = out[0, SAMPLING_PROMPT.shape[1] : SAMPLING_PROMPT.shape[1] + 2].tolist()
        counts[first_token * VOCAB + second_token] += 1
        padded += int(max(out[0, SAMPLING_PROMPT.shape[1] :].tolist()) >= DRAFT_VOCAB)
    assert padded > SAMPLES // 20  # the target samples ids the draft cannot read, often
    expected = joint / joint.sum() * SAMPLES
    dense = expected >= 5
    observed = np.append(counts[dense], counts[~dense].sum())
    expected = np.append(expected[dense], expected[~dense].sum())
    assert chisquare(observed, expected).pvalue > 1e-3
