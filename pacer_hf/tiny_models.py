"""Tiny random draft/target pairs built from configs with fixed seeds: no Hub, seconds on a CPU.

Used by the tests, the demo and the benchmarks' smoke settings, with [`tiny_tokenizer`], a character-level tokenizer
with a chat template. A pair shares one vocabulary; the draft is the
target itself (`"same"`: every draft token is accepted), a noisy copy of it (`"noisy"`: some are), or an
independently initialised model (`"independent"`: almost none are).
"""

import copy

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

TINY_ARCHS = ("llama", "qwen2", "gpt2")
DRAFT_KINDS = ("same", "noisy", "independent")
TINY_VOCAB_SIZE = 96
# A wide initialisation makes random models' logits peaked, so argmax decisions are stable (as in trained models)
# instead of near-ties that any noise flips.
_INIT_RANGE = 0.2
# Relative noise of the "noisy" draft: tuned so that roughly half of its greedy tokens agree with the target's.
_NOISE_SCALE = 0.05
# The tiny tokenizer: special tokens, then one token per character (others read as <unk>); fits TINY_VOCAB_SIZE.
_SPECIAL_TOKENS = ("<s>", "<unk>", "<|im_start|>", "<|im_end|>")
_CHARACTERS = " \nabcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,:;!?'\"()[]{}=+-*/_#<>"
# ChatML, as Qwen2.5's template writes one user turn
_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_model(arch: str, seed: int = 0, vocab_size: int = TINY_VOCAB_SIZE, hidden_size: int = 32) -> PreTrainedModel:
    """A 2-layer causal LM of architecture `arch` (one of `TINY_ARCHS`), float32, eval mode, seeded."""
    common = dict(vocab_size=vocab_size, bos_token_id=0, eos_token_id=None, pad_token_id=None)
    if arch == "llama":
        config = LlamaConfig(
            hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, initializer_range=_INIT_RANGE, **common,
        )
        cls = LlamaForCausalLM
    elif arch == "qwen2":
        config = Qwen2Config(
            hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, initializer_range=_INIT_RANGE,
            tie_word_embeddings=False, **common,
        )
        cls = Qwen2ForCausalLM
    elif arch == "gpt2":
        config = GPT2Config(
            n_embd=hidden_size, n_layer=2, n_head=4, n_positions=256, initializer_range=_INIT_RANGE, **common
        )
        cls = GPT2LMHeadModel
    else:
        raise ValueError(f"`arch` must be one of {TINY_ARCHS}, got {arch!r}.")
    torch.manual_seed(seed)
    model = cls(config).eval()
    model.config._name_or_path = f"tiny-{arch}-seed{seed}"
    model.generation_config.pad_token_id = None
    model.generation_config.eos_token_id = None
    return model


def tiny_pair(
    arch: str, draft_kind: str = "noisy", seed: int = 0, vocab_size: int = TINY_VOCAB_SIZE,
    draft_vocab_size: int | None = None,
) -> tuple[PreTrainedModel, PreTrainedModel]:
    """Returns `(target, draft)` of architecture `arch`; `draft_kind` is one of `DRAFT_KINDS`. With
    `draft_vocab_size`, the draft's embedding rows are padded or cut to it (one tokenizer, other padding, as
    Qwen2.5-0.5B's 151,936 rows against Qwen2.5-7B's 152,064)."""
    target = tiny_model(arch, seed=seed, vocab_size=vocab_size)
    if draft_kind == "same":
        draft = copy.deepcopy(target)
    elif draft_kind == "noisy":
        draft = copy.deepcopy(target)
        generator = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for param in draft.parameters():
                param.add_(torch.randn(param.shape, generator=generator) * param.std() * _NOISE_SCALE)
    elif draft_kind == "independent":
        draft = tiny_model(arch, seed=seed + 1000, vocab_size=vocab_size)
    else:
        raise ValueError(f"`draft_kind` must be one of {DRAFT_KINDS}, got {draft_kind!r}.")
    draft.config._name_or_path = f"tiny-{arch}-seed{seed}-draft-{draft_kind}"
    if draft_vocab_size is not None and draft_vocab_size != vocab_size:
        torch.manual_seed(seed + 2)  # the new rows' initialisation
        draft.resize_token_embeddings(draft_vocab_size, mean_resizing=False)
        draft.config._name_or_path += f"-rows{draft_vocab_size}"
    return target, draft


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level `PreTrainedTokenizerFast` of `TINY_VOCAB_SIZE` tokens or fewer with a ChatML chat template,
    built in memory (no Hub): real `apply_chat_template` and `decode` calls for tiny models."""
    vocab = {token: i for i, token in enumerate(_SPECIAL_TOKENS + tuple(dict.fromkeys(_CHARACTERS)))}
    assert len(vocab) <= TINY_VOCAB_SIZE
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", unk_token="<unk>",
                                        eos_token="<|im_end|>", additional_special_tokens=["<|im_start|>"])
    tokenizer.chat_template = _CHAT_TEMPLATE
    return tokenizer
