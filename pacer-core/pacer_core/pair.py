"""Whether a head can read a draft: the sizes its inputs must have, and the length of the rounds it can score."""

from typing import Any

_FIX = "Load the head trained for this pair, or train one with `pacer-hf train`."


def check_head_sizes(
    config: Any, vocab_size: int, hidden_size: int, draft_name: str, fix: str = _FIX
) -> None:
    """Raises `ValueError` unless a head with `config` ([`PacerHeadConfig`]) reads a draft of `vocab_size` and
    `hidden_size`."""
    trained_for = f" ({config.draft_name_or_path})" if config.draft_name_or_path else ""
    for what, expected, got in (("vocabulary size", config.vocab_size, vocab_size),
                                ("hidden size", config.draft_hidden_size, hidden_size)):
        if expected != got:
            raise ValueError(
                f"`pacer_head` was trained for a draft with {what} {expected}{trained_for}, got a draft with {what} "
                f"{got} ({draft_name}). {fix}"
            )


def check_max_draft(head: Any, max_draft: int, setting: str = "`pacer_max_draft`") -> None:
    """Raises `ValueError` if rounds of `max_draft` tokens are longer than a trained head's position table: it has
    never scored such positions (a rule has no table)."""
    positions = getattr(head, "max_positions", None)
    if positions is not None and max_draft > positions:
        raise ValueError(
            f"{setting} is {max_draft}, but the head was trained for rounds of at most {positions} draft tokens (its "
            f"position table): it has never scored later positions. Use at most {positions}, or train a head with "
            f"`pacer-hf train --max-draft {max_draft}`."
        )
