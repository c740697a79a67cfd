"""Whether a head, a draft and a target belong together: the one pair check of pacer-hf."""

from torch import nn

from .config import PacerHeadConfig, model_sizes

_FIX = "Load the head trained for this pair, or train one with `pacer-hf train`."


def check_head_sizes(
    config: PacerHeadConfig, vocab_size: int, hidden_size: int, draft_name: str, fix: str = _FIX
) -> None:
    """Raises `ValueError` unless a head with `config` reads a draft of `vocab_size` and `hidden_size`."""
    trained_for = f" ({config.draft_name_or_path})" if config.draft_name_or_path else ""
    for what, expected, got in (("vocabulary size", config.vocab_size, vocab_size),
                                ("hidden size", config.draft_hidden_size, hidden_size)):
        if expected != got:
            raise ValueError(
                f"`pacer_head` was trained for a draft with {what} {expected}{trained_for}, got a draft with {what} "
                f"{got} ({draft_name}). {fix}"
            )


def check_pair_compatible(config: PacerHeadConfig, draft_model: nn.Module, target_model: nn.Module) -> None:
    """Raises `ValueError` unless a head with `config` can run on `draft_model` drafting for `target_model`."""
    for role, model in (("assistant_model", draft_model), ("target model", target_model)):
        if getattr(model, "config", None) is None or not hasattr(model, "get_output_embeddings"):
            raise TypeError(f"The {role} must be a transformers `PreTrainedModel`, got {type(model).__name__}.")
        if model.config.is_encoder_decoder:
            raise ValueError(
                f"pacer-hf supports decoder-only models; the {role} `{model.config._name_or_path}` is an "
                "encoder-decoder model."
            )
    draft_vocab, draft_hidden = model_sizes(draft_model)
    target_vocab = model_sizes(target_model)[0]
    if draft_vocab != target_vocab:
        raise ValueError(
            f"`assistant_model` has vocabulary size {draft_vocab} but the target has {target_vocab}: pacer-hf needs "
            "a draft and a target that share one tokenizer (padded vocabularies are not supported yet)."
        )
    draft_name = draft_model.config._name_or_path or type(draft_model).__name__
    check_head_sizes(config, draft_vocab, draft_hidden, f"`assistant_model` {draft_name}")
