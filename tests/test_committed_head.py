"""The heads committed in `hub_cards/` for Qwen2.5-Coder 0.5B -> 1.5B (greedy and sampling): they load,
they are for the draft they claim, they keep generation lossless, they refuse another draft, their cards render."""

import copy
import json
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from pacer_hf import PacerHead, PacerStats
from pacer_hf.pair import check_pair_compatible
from pacer_hf.demo import TRAINED_HEAD
from pacer_hf.hub import CARD_NAME, UPLOADED_FILES, prepare_upload
from pacer_hf.models import PAIRS, PINNED_MODELS
from pacer_hf.tiny_models import tiny_pair

# Qwen2.5-Coder-0.5B-Instruct's config.json: hidden_size and vocab_size (the embedding rows, padded past the
# tokenizer's 151,665 tokens).
QWEN_DRAFT_HIDDEN, QWEN_VOCAB = 896, 151936
# The folder of each committed head, by the decoding mode it was trained for.
COMMITTED = {"greedy": TRAINED_HEAD, "sampling": TRAINED_HEAD.with_name(TRAINED_HEAD.name + "-sampling")}


@pytest.fixture(scope="module")
def head() -> PacerHead:
    return PacerHead.from_pretrained(TRAINED_HEAD).eval()


@pytest.mark.parametrize("decoding", COMMITTED)
def test_committed_folder_is_exactly_what_push_uploads(decoding, tmp_path):
    """Staging the committed folder for upload copies every file unchanged and adds nothing but the card."""
    folder = COMMITTED[decoding]
    card = prepare_upload(folder, tmp_path, f"pacer-hf/{folder.name}", card_path=folder / CARD_NAME)
    staged = {p.name for p in tmp_path.iterdir()}
    assert staged == {p.name for p in folder.iterdir()} and {CARD_NAME, *UPLOADED_FILES[:2]} <= staged
    for name in staged - {CARD_NAME}:
        assert (tmp_path / name).read_bytes() == (folder / name).read_bytes(), name
    assert card.data == ModelCard.load(folder / CARD_NAME).data  # its metadata is up to date
    assert (folder / "model.safetensors").stat().st_size < 5 * 2**20  # small enough to commit


@pytest.mark.parametrize("decoding", COMMITTED)
def test_head_is_for_the_pinned_pair(decoding):
    draft_name, target_name = PAIRS["qwen2.5-coder"]
    config = PacerHead.from_pretrained(COMMITTED[decoding]).config
    assert config.draft_name_or_path == PINNED_MODELS[draft_name].hub_id
    assert config.target_name_or_path == PINNED_MODELS[target_name].hub_id
    assert (config.draft_hidden_size, config.vocab_size) == (QWEN_DRAFT_HIDDEN, QWEN_VOCAB)
    assert config.decoding == decoding
    assert 0.0 < config.threshold < 1.0  # a chosen threshold, neither "never ask" nor "always stop"


def _shared_vocab_pair(arch: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A 1-layer target of the Qwen draft's width and vocabulary and a noisy copy as its draft. Both use one tied
    embedding matrix (152k x 896, 0.5 GB), and only the layers are perturbed, so the pair costs one matrix."""
    common = dict(
        vocab_size=QWEN_VOCAB, hidden_size=QWEN_DRAFT_HIDDEN, intermediate_size=256, num_hidden_layers=1,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2,
        tie_word_embeddings=True, bos_token_id=0, eos_token_id=None, pad_token_id=None,
    )
    config, cls = (LlamaConfig(**common), LlamaForCausalLM) if arch == "llama" else (Qwen2Config(**common),
                                                                                       Qwen2ForCausalLM)
    torch.manual_seed(0)
    target = cls(config).eval()
    embedding = target.get_input_embeddings().weight
    target.model.embed_tokens = None  # not deep-copied
    draft = copy.deepcopy(target)
    for model in (target, draft):
        model.model.embed_tokens = torch.nn.Embedding(QWEN_VOCAB, QWEN_DRAFT_HIDDEN, _weight=embedding)
        model.tie_weights()
        model.generation_config.pad_token_id = model.generation_config.eos_token_id = None
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in draft.model.layers.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * param.std() * 0.03)  # ~60% of greedy tokens agree
    draft.config._name_or_path = "Qwen/Qwen2.5-Coder-0.5B-Instruct"  # the name the head checks, on a stand-in
    return target, draft


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_committed_head_keeps_greedy_output(head, arch):
    target, draft = _shared_vocab_pair(arch)
    assert draft.get_output_embeddings().weight.data_ptr() == target.get_input_embeddings().weight.data_ptr()
    check_pair_compatible(head.config, draft, target)
    stops = passes = 0
    for seed in range(3):
        prompt = torch.randint(1, 5000, (1, 6), generator=torch.Generator().manual_seed(seed))
        plain = target.generate(prompt, max_new_tokens=21, do_sample=False)
        # The head's own threshold, then stricter ones, so that its stop/continue decisions both occur.
        for threshold in (head.config.threshold, 0.9, 0.999):
            for block_size in (head.config.block_size, 1, 3):
                stats = PacerStats()
                out = target.generate(
                    prompt, assistant_model=draft, pacer_phrases=False, pacer_head=head, pacer_stats=stats, max_new_tokens=21,
                    do_sample=False, pacer_threshold=threshold, pacer_block_size=block_size,
                )
                assert torch.equal(out, plain), (seed, threshold, block_size)
                stops += stats.head_stops
                passes += stats.head_calls - stats.head_stops
    assert stops > 0 and passes > 0


def test_committed_head_refuses_another_hidden_size(head):
    target, draft = tiny_pair("qwen2", "noisy", vocab_size=QWEN_VOCAB)  # the right vocabulary, hidden size 32
    with pytest.raises(ValueError, match="hidden size 896"):
        target.generate(torch.tensor([[0, 3, 5]]), assistant_model=draft, pacer_phrases=False, pacer_head=head, max_new_tokens=4)


@pytest.mark.parametrize("decoding", COMMITTED)
def test_committed_card_renders(decoding):
    head = PacerHead.from_pretrained(COMMITTED[decoding])
    card = ModelCard.load(COMMITTED[decoding] / "README.md")
    assert card.data.library_name == "pacer-hf"
    assert card.data.base_model == head.config.draft_name_or_path
    assert card.data.base_model_relation == "adapter"
    assert {"speculative-decoding", decoding} <= set(card.data.tags)
    metrics = json.loads((COMMITTED[decoding] / "training_metrics.json").read_text())
    fresh = head.generate_model_card(metrics=metrics)
    assert fresh.data.base_model == card.data.base_model
    assert "PACER head" in fresh.text and f"{head.config.threshold}" in fresh.text
    # The committed card reports speed-ups measured by the harness, not only the training-time estimate.
    assert "Measured speed-ups" in card.text


def test_demo_without_head_folder_fails_clearly(tmp_path):
    from pacer_hf.demo import run_demo

    with pytest.raises(ValueError, match="does not exist"):
        run_demo(head=Path(tmp_path / "missing"))


def test_tiny_demo_runs_from_the_cli(capsys):
    from pacer_hf.cli import main

    assert main(["demo", "--tiny", "--max-new-tokens", "12"]) == 0
    assert "equals plain greedy output: True" in capsys.readouterr().out
