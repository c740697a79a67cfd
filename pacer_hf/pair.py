"""Whether a head, a draft and a target belong together: the one pair check of pacer-hf, and the draft's fingerprint.

Two models share a vocabulary when they share a tokenizer, whatever their embedding padding: Qwen2.5-0.5B has 151,936
rows and Qwen2.5-7B 152,064 for one tokenizer of 151,665 tokens. transformers decides "same tokenizer" by row count
alone and asks for `tokenizer=` and `assistant_tokenizer=` when the counts differ; pacer-hf then compares the two
vocabularies and drafts token by token (the draft's rows padded to the target's width), where transformers would
re-tokenise text every round (universal assisted generation). Without the tokenizers such a pair is refused, with the
fix: row counts alone cannot tell a padded copy of a tokenizer from another tokenizer.
"""

import hashlib
import json
import warnings
from typing import Any

import torch
from torch import nn

from pacer_core.config import PacerHeadConfig, model_sizes
from pacer_core.pair import check_head_sizes

# Bytes of the fingerprint's hex digest kept: a label to compare, not a security measure.
FINGERPRINT_HEX_CHARS = 16


class DraftMismatchWarning(UserWarning):
    """A head meets a draft of the right sizes whose fingerprint differs from the one it was trained on. The output
    stays exact; only the head's stops are tuned for another model. Silence it on purpose with
    `warnings.simplefilter("ignore", pacer_hf.DraftMismatchWarning)`."""


def draft_fingerprint(draft: nn.Module) -> str:
    """A short hash of what makes a draft this draft, cheap to compute (milliseconds).

    It covers the architecture and sizes from the draft's config and the values of its one-dimensional parameters
    (norm weights, biases), rounded to bfloat16. Those are what another fine-tune of the same base changes but what
    dtype casts and weight quantization (GGUF keeps norms and biases in full precision) and prepacked linear weights
    leave alone, so one draft gives one fingerprint however it was loaded.
    """
    config = draft.config.get_text_config()
    vocab_size, hidden_size = model_sizes(draft)
    identity = {"model_type": config.model_type, "vocab_size": vocab_size, "hidden_size": hidden_size,
                "layers": getattr(config, "num_hidden_layers", None)}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode())
    for name, param in draft.named_parameters():
        if param.dim() == 1 and param.layout == torch.strided:
            digest.update(name.encode())
            digest.update(param.detach().to("cpu", torch.bfloat16).view(torch.int16).numpy().tobytes())
    return digest.hexdigest()[:FINGERPRINT_HEX_CHARS]


def _name(model: nn.Module) -> str:
    return model.config._name_or_path or type(model).__name__


def check_pair_compatible(
    config: PacerHeadConfig, draft: nn.Module, target: nn.Module, tokenizer: Any = None,
    assistant_tokenizer: Any = None,
) -> None:
    """Raises unless a head with `config` can run on `draft` drafting for `target`; warns
    ([`DraftMismatchWarning`]) when the draft is of the right sizes but not the one the head was trained on.

    Args:
        config ([`PacerHeadConfig`]): the head's config.
        draft, target (`PreTrainedModel`): decoder-only models.
        tokenizer, assistant_tokenizer (*optional*): the target's and the draft's tokenizers, needed when the two
            models' embedding rows differ (a padded pair): their vocabularies must be equal.

    Raises:
        `TypeError`: a model is not a transformers model. `ValueError`: an encoder-decoder model, different
        tokenizers, a padded pair without tokenizers, or a head for a draft of other sizes.
    """
    for role, model in (("assistant_model", draft), ("target model", target)):
        if getattr(model, "config", None) is None or not hasattr(model, "get_output_embeddings"):
            raise TypeError(f"The {role} must be a transformers `PreTrainedModel`, got {type(model).__name__}.")
        if model.config.is_encoder_decoder:
            raise ValueError(
                f"pacer-hf supports decoder-only models; the {role} `{_name(model)}` is an encoder-decoder model."
            )
    draft_vocab, draft_hidden = model_sizes(draft)
    target_vocab = model_sizes(target)[0]
    if draft_vocab != target_vocab:
        _check_one_tokenizer(draft_vocab, target_vocab, tokenizer, assistant_tokenizer)
    check_head_sizes(config, draft_vocab, draft_hidden, f"`assistant_model` {_name(draft)}")
    if config.draft_fingerprint is not None and config.draft_fingerprint != draft_fingerprint(draft):
        warnings.warn(
            f"`pacer_head` was trained for the draft {config.draft_name_or_path or '(unnamed)'} (fingerprint "
            f"{config.draft_fingerprint}), but the `assistant_model` {_name(draft)} has the same sizes and another "
            f"fingerprint ({draft_fingerprint(draft)}): another model or fine-tune. The output stays exact; the head's "
            "stops are tuned for the other draft. Load the head trained for this draft, or silence this with "
            "`warnings.simplefilter('ignore', pacer_hf.DraftMismatchWarning)`.",
            DraftMismatchWarning,
            stacklevel=4,
        )


def _check_one_tokenizer(draft_vocab: int, target_vocab: int, tokenizer: Any, assistant_tokenizer: Any) -> None:
    """A pair whose embedding rows differ is one vocabulary only if its two tokenizers are the same."""
    if tokenizer is None or assistant_tokenizer is None:
        raise ValueError(
            f"The draft has {draft_vocab} embedding rows and the target {target_vocab}. Pairs that share one tokenizer "
            "but pad their embeddings differently (Qwen2.5-0.5B for Qwen2.5-7B, say) are supported once pacer-hf can "
            "check that the tokenizers are the same: pass both, `tokenizer=<target's>` and `assistant_tokenizer="
            "<draft's>` to `generate()` (transformers asks for them too; `draft_tokenizer=` for `collect`)."
        )
    if tokenizer.get_vocab() != assistant_tokenizer.get_vocab():
        raise ValueError(
            "The `tokenizer` and `assistant_tokenizer` differ: pacer-hf drafts token by token, which needs one "
            "vocabulary. For a draft with another tokenizer, use transformers' universal assisted generation "
            "(`generate(assistant_model=..., tokenizer=..., assistant_tokenizer=...)` without `pacer_head`)."
        )
    if len(tokenizer) > min(draft_vocab, target_vocab):
        raise ValueError(
            f"The tokenizer has {len(tokenizer)} tokens, more than the {min(draft_vocab, target_vocab)} embedding rows "
            "of one of the models: they cannot both read every token. Check that these are the models of this "
            "tokenizer."
        )
