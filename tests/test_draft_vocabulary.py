"""`pacer_draft_vocab`: the draft scoring ids below a limit and the sequence's ids. It changes what the draft proposes,
never the output: greedy output equals plain greedy for every architecture, drafting mode and a padded pair; the
logits are the whole layer's on the allowed ids and -inf elsewhere; a model whose logits are not its output layer's
keeps its whole vocabulary. Sampling is checked in test_sampling_exactness.py."""

import functools
import types

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM

from pacer_hf import PacerHead, PacerStats
from pacer_hf.cpu_linear import prepack_linear_weights
from pacer_hf.draft_model import DraftModel
from pacer_hf.draft_vocabulary import AUTO_LIMIT, draft_vocabulary, resolve_draft_vocab
from pacer_hf.tiny_models import TINY_ARCHS, tiny_model, tiny_pair, tiny_tokenizer

from conftest import PROMPT, TINY_ENTROPY_THRESHOLD, make_head, scripted_rounds

LIMIT = 24  # of the tiny vocabulary's 96 ids: the target's greedy tokens often lie past it
MAX_NEW_TOKENS = 24


@functools.lru_cache(maxsize=None)
def _pair(arch: str, draft_kind: str = "noisy", draft_vocab_size: int | None = None):
    return tiny_pair(arch, draft_kind, seed=0, draft_vocab_size=draft_vocab_size)


def _allowed(vocab: int, limit: int, ids: list[int]) -> torch.Tensor:
    allowed = torch.zeros(vocab, dtype=torch.bool)
    allowed[:limit] = True
    allowed[ids] = True
    return allowed


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_logits_are_the_whole_layers_on_the_allowed_ids_and_minus_inf_elsewhere(arch):
    target, draft = _pair(arch)
    vocab = target.config.vocab_size
    ids = torch.tensor([[3, 70, 5, 90, 7]])  # 70 and 90 lie past the limit
    full, full_hidden = DraftModel(draft, None, vocab).forward(ids, [60])
    restricted, hidden = DraftModel(draft, None, vocab, LIMIT).forward(ids, [60])
    allowed = _allowed(vocab, LIMIT, [60, 70, 90])
    assert restricted.shape == full.shape == (1, 2, vocab)
    torch.testing.assert_close(restricted[..., allowed], full[..., allowed])
    assert torch.isneginf(restricted[..., ~allowed]).all()
    torch.testing.assert_close(hidden, full_hidden)


def test_after_the_first_forward_the_model_skips_its_own_output_layer():
    draft = tiny_model("qwen2")  # a fresh model: the check is once per model
    rows = []
    hook = draft.get_output_embeddings().register_forward_hook(lambda _, args, out: rows.append(args[0].shape[1]))
    try:
        model = DraftModel(draft, None, draft.config.vocab_size, LIMIT)
        ids = PROMPT
        for _ in range(3):
            logits, _ = model.forward(ids, [])
            ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=-1)
    finally:
        hook.remove()
    assert rows == [1, 0, 0]  # the first forward checks against the model's own logits, then none are computed
    assert model.vocab_limit == LIMIT


def test_a_prepacked_tied_layer_keeps_the_same_logits():
    draft = tiny_model("gpt2")  # ties its output layer to its input embeddings
    reference = DraftModel(draft, None, draft.config.vocab_size).forward(PROMPT, [50])[0]
    prepack_linear_weights(draft)
    model = DraftModel(draft, None, draft.config.vocab_size, LIMIT)
    for _ in range(2):  # the checking forward, then one that skips the model's own layer
        restricted, _ = model.forward(PROMPT, [50])
        allowed = _allowed(draft.config.vocab_size, LIMIT, [*PROMPT[0].tolist(), 50])
        torch.testing.assert_close(restricted[..., allowed], reference[..., allowed], rtol=1e-4, atol=1e-4)
        assert torch.isneginf(restricted[..., ~allowed]).all()
    assert model.vocabulary.verified


def test_a_model_moved_or_cast_after_a_call_gets_a_rebuilt_layer():
    draft = tiny_model("llama")
    DraftModel(draft, None, draft.config.vocab_size, LIMIT).forward(PROMPT, [])
    draft.to(torch.float64)  # new weight storage: a layer built on the old one would read stale weights
    restricted, _ = DraftModel(draft, None, draft.config.vocab_size, LIMIT).forward(PROMPT, [50])
    full, _ = DraftModel(draft, None, draft.config.vocab_size).forward(PROMPT, [50])
    allowed = _allowed(draft.config.vocab_size, LIMIT, [*PROMPT[0].tolist(), 50])
    torch.testing.assert_close(restricted[..., allowed], full[..., allowed])


# "planned": generate()'s own planner; "scripted": rounds that copy, draft and step at random; "paper": every round drafts
@pytest.mark.parametrize("rounds", ["planned", "scripted", "paper"])
@pytest.mark.parametrize("head_kind", ["always", "entropy"])
@pytest.mark.parametrize("draft_kind", ["same", "noisy"])
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_greedy_output_equals_plain_greedy(arch, draft_kind, head_kind, rounds):
    target, draft = _pair(arch, draft_kind)
    head = make_head(draft, head_kind, block_size=2, max_draft=8)
    stats = PacerStats()
    how = {"planned": {}, "scripted": {"pacer_candidate_generator": scripted_rounds(seed=3)},
           "paper": {"pacer_phrases": False}}[rounds]
    out = target.generate(PROMPT, assistant_model=draft, pacer_head=head, pacer_stats=stats, pacer_draft_vocab=LIMIT,
                          max_new_tokens=MAX_NEW_TOKENS, do_sample=False, **how)
    assert torch.equal(out, target.generate(PROMPT, max_new_tokens=MAX_NEW_TOKENS, do_sample=False))
    assert stats.draft_vocab == LIMIT
    assert stats.drafted_tokens > 0 or rounds == "planned"  # the planner may find plain steps faster


def test_the_draft_never_proposes_an_id_it_was_not_allowed():
    target, draft = _pair("llama", "same")  # the target itself: it would propose the target's own tokens
    head = make_head(draft, "always", block_size=2, max_draft=8)
    stats = PacerStats()
    out = target.generate(PROMPT, assistant_model=draft, pacer_head=head, pacer_phrases=False, pacer_stats=stats,
                          pacer_draft_vocab=LIMIT, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    new = out[0, PROMPT.shape[1]:].tolist()
    # Each new id at or past the limit and not in the text before it is one the draft could not propose: the target
    # adds it as its own token, so a round ends there.
    unseen = [i for i, token in enumerate(new) if token >= LIMIT and token not in PROMPT[0].tolist() + new[:i]]
    assert unseen, "the output must hold ids the draft was not allowed, for this test to have power"
    assert stats.rounds >= len(unseen)
    assert stats.accepted_tokens < stats.drafted_tokens  # the same model, restricted: not everything is accepted


@pytest.mark.parametrize("draft_vocab_size", [92, 100])  # fewer rows than the target (96), and more
def test_a_padded_pair_with_a_limit_equals_plain_greedy(draft_vocab_size):
    target, draft = _pair("qwen2", "noisy", draft_vocab_size)
    head = PacerHead.entropy_stop(draft, TINY_ENTROPY_THRESHOLD)
    tokenizers = {"tokenizer": tiny_tokenizer(), "assistant_tokenizer": tiny_tokenizer()}
    out = target.generate(PROMPT, assistant_model=draft, pacer_head=head, pacer_draft_vocab=LIMIT,
                          max_new_tokens=MAX_NEW_TOKENS, do_sample=False, **tokenizers)
    assert torch.equal(out, target.generate(PROMPT, max_new_tokens=MAX_NEW_TOKENS, do_sample=False))


def _softcapped_model() -> Gemma2ForCausalLM:
    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                          final_logit_softcapping=0.5, initializer_range=0.2, bos_token_id=0, eos_token_id=None,
                          pad_token_id=None)
    return Gemma2ForCausalLM(config).eval()


def test_a_model_whose_logits_are_not_its_output_layers_keeps_its_whole_vocabulary():
    model = _softcapped_model()  # a final soft cap sits between the output layer and the logits
    with pytest.warns(UserWarning, match="not its output layer applied to its last hidden state"):
        draft = DraftModel(model, None, 96, LIMIT)
        logits, _ = draft.forward(PROMPT, [])
    torch.testing.assert_close(logits, model(PROMPT).logits[:, -1:].float())
    assert draft.vocab_limit is None
    assert draft_vocabulary(model, LIMIT) is None  # remembered for the model: later calls skip the check
    head = PacerHead.entropy_stop(model, 1.0)
    stats = PacerStats()
    out = model.generate(PROMPT, assistant_model=model, pacer_head=head, pacer_draft_vocab=LIMIT, pacer_stats=stats,
                         max_new_tokens=12, do_sample=False)
    assert torch.equal(out, model.generate(PROMPT, max_new_tokens=12, do_sample=False))
    assert stats.draft_vocab is None


def test_auto_restricts_a_large_vocabulary_on_cpu_only():
    small = tiny_model("llama")
    large = tiny_model("llama", vocab_size=AUTO_LIMIT * 2 + 1, hidden_size=8)
    assert resolve_draft_vocab("auto", small) is None
    assert resolve_draft_vocab("auto", large) == AUTO_LIMIT
    assert resolve_draft_vocab(None, large) is None
    assert resolve_draft_vocab(1000, small) == 1000
    on_gpu = types.SimpleNamespace(device=torch.device("cuda"), get_output_embeddings=large.get_output_embeddings)
    assert resolve_draft_vocab("auto", on_gpu) is None  # a GPU keeps the whole layer until measured there


def test_auto_on_a_large_vocabulary_equals_plain_greedy():
    target = tiny_model("llama", seed=0, vocab_size=AUTO_LIMIT * 2 + 1, hidden_size=8)
    draft = tiny_model("llama", seed=1, vocab_size=AUTO_LIMIT * 2 + 1, hidden_size=8)
    head = PacerHead.entropy_stop(draft, 100.0)  # never stops: every round drafts max_draft
    stats = PacerStats()
    prompt = torch.tensor([[0, 5, 40000, 7, 65000]])
    out = target.generate(prompt, assistant_model=draft, pacer_head=head, pacer_phrases=False, pacer_stats=stats,
                          max_new_tokens=16, do_sample=False)
    assert torch.equal(out, target.generate(prompt, max_new_tokens=16, do_sample=False))
    assert stats.draft_vocab == AUTO_LIMIT


@pytest.mark.parametrize("value", [0, -5, True, 2.5, "all", "32k"])
def test_a_wrong_value_is_refused_with_the_choices(value):
    target, draft = _pair("llama")
    head = make_head(draft)
    with pytest.raises(ValueError, match="`pacer_draft_vocab` must be \"auto\", None"):
        target.generate(PROMPT, assistant_model=draft, pacer_head=head, pacer_draft_vocab=value, max_new_tokens=4)


def test_pacer_draft_vocab_without_a_head_is_refused():
    target, draft = _pair("llama")
    with pytest.raises(ValueError, match="pacer_draft_vocab"):
        target.generate(PROMPT, assistant_model=draft, pacer_draft_vocab=LIMIT, max_new_tokens=4)


def test_a_limit_at_or_past_the_layers_rows_is_the_whole_vocabulary():
    _, draft = _pair("llama")
    assert draft_vocabulary(draft, draft.config.vocab_size) is None
    assert DraftModel(draft, None, draft.config.vocab_size, 10_000).vocab_limit is None
