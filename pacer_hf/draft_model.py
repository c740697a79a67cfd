"""`DraftModel`: the draft model's side of one `generate()` call: its KV cache, its forwards, and their cost.

The cache is kept across rounds and rolled back only as far as the sequence disagrees with what it holds, so a
forward feeds just the tokens the draft has not seen: one token in a round that follows a drafted one, the whole
accepted run after rounds that copied without the draft, the whole prompt the first time (the draft is lazy: it runs
only once a round needs it, and then catches up in one forward).

Vocabularies: the draft may have more or fewer embedding rows than the target for one tokenizer (Qwen2.5-0.5B 151,936,
Qwen2.5-7B 152,064). Its logits come out at the target's width: rows the target lacks are dropped, rows the draft
lacks are -inf (impossible tokens, never proposed). A token the draft has no embedding for (a padding id the target
emitted) is fed as the draft's last row: the output stays the target's, only drafting after it suffers.

Output layer: with a [`DraftVocabulary`] the model's forward skips its own output layer (an empty `logits_to_keep`)
and the draft scores only part of its vocabulary; the first forward of each model checks that against the model's own
logits (`pacer_hf.draft_vocabulary`).

Shapes: L = tokens so far, m = guessed tokens fed beside them, V = the target's vocabulary, H = draft hidden size.
"""

import time

import torch
from transformers import DynamicCache, PreTrainedModel

from .draft_vocabulary import DraftVocabulary, draft_vocabulary

_NO_LOGITS = torch.zeros(0, dtype=torch.long)  # `logits_to_keep` that keeps no position: the output layer is skipped


class DraftModel:
    """The draft model of one call.

    Args:
        model (`PreTrainedModel`): the draft.
        prompt_mask (`torch.LongTensor` of shape `(1, P)`, *optional*): the prompt's attention mask, for a padded
            prompt only (positions then follow the mask, as for the target).
        vocab_size (`int`): the target's vocabulary size, the width of the logits returned.
        vocab_limit (`int`, *optional*): score only ids below it and the sequence's ids ([`DraftVocabulary`]); None:
            the whole output layer.
    """

    def __init__(self, model: PreTrainedModel, prompt_mask: torch.Tensor | None, vocab_size: int,
                 vocab_limit: int | None = None):
        self.model = model
        self.vocabulary: DraftVocabulary | None = draft_vocabulary(model, vocab_limit)
        self.vocab_size = vocab_size
        self._rows = model.get_input_embeddings().weight.shape[0]  # tokens the draft can read
        self._cache = DynamicCache(config=model.config)
        self._cache.activate_past_recording()  # lets sliding-window draft layers roll back past their window
        self._cached_ids = torch.zeros(1, 0, dtype=torch.long, device=model.device)  # tokens with keys/values cached
        self._keeps_logits = model._supports_logits_to_keep()
        self._prompt_mask = prompt_mask
        self.forwards = 0
        self._timings: list[tuple[int, float]] = []  # (tokens fed, seconds) of each forward not yet taken

    def take_timings(self) -> list[tuple[int, float]]:
        """`(tokens fed, seconds)` of each forward since the last call: what a forward costs grows with what it feeds."""
        timings, self._timings = self._timings, []
        return timings

    def missing(self, ids: torch.LongTensor) -> int:
        """Tokens of `ids` `[1, L]` a forward after `ids` would feed: those past the cached prefix that agrees."""
        return ids.shape[1] - self._common_prefix(ids)

    @torch.no_grad()
    def forward(self, ids: torch.LongTensor, guess: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Feeds the tokens of `ids` the cache lacks, then the m tokens of `guess`.

        Returns the logits (float32, at the target's width) and post-norm hidden states of the last token of `ids`
        and of each guessed token: `[1, m + 1, V]`, `[1, m + 1, H]`. The guess's keys and values stay cached; the next
        forward drops those the sequence did not confirm.
        """
        start = time.perf_counter()
        self._sync_cache(ids)
        fed = torch.cat([ids, ids.new_tensor([guess])], dim=-1) if guess else ids  # [1, L + m]
        num_cached = self._cached_ids.shape[1]
        keep = len(guess) + 1
        kwargs = {"logits_to_keep": keep} if self._keeps_logits else {}
        if self.vocabulary is not None and self.vocabulary.verified:
            kwargs["logits_to_keep"] = _NO_LOGITS.to(ids.device)
        if self._prompt_mask is not None:
            pad = fed.shape[1] - self._prompt_mask.shape[1]
            mask = torch.cat([self._prompt_mask, self._prompt_mask.new_ones(1, pad)], dim=-1)  # [1, L + m]
            kwargs["attention_mask"] = mask
            kwargs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)[:, num_cached:]
        new = fed[:, num_cached:].clamp(max=self._rows - 1)  # an id the draft has no row for reads as its last
        out = self.model(input_ids=new, past_key_values=self._cache, use_cache=True, output_hidden_states=True,
                         **kwargs)
        self._cached_ids = fed
        # hidden_states[-1] is the post-norm state that feeds the lm_head (transformers ties it to last_hidden_state)
        hidden = out.hidden_states[-1][:, -keep:, :]  # [1, m + 1, H]
        logits = self._to_target_width(self._logits(out.logits[:, -keep:, :], hidden, fed))  # [1, m + 1, V]
        self.forwards += 1
        self._timings.append((new.shape[1], time.perf_counter() - start))
        return logits, hidden

    def _logits(self, own: torch.Tensor, hidden: torch.Tensor, fed: torch.LongTensor) -> torch.Tensor:
        """Float32 logits `[1, m + 1, R]` of the scored positions: the model's own (`own`, empty where the forward
        skipped its output layer) or the restricted layer's, once the first forward checked it against the own."""
        vocabulary = self.vocabulary
        if vocabulary is not None and not vocabulary.check(self.model, hidden, fed, own):
            self.vocabulary = vocabulary = None  # not a plain output layer: the whole vocabulary from now on
        return own.float() if vocabulary is None else vocabulary.logits(hidden, fed)

    @property
    def vocab_limit(self) -> int | None:
        """The id limit the draft scores below (besides the sequence's ids); None: its whole vocabulary."""
        return None if self.vocabulary is None else self.vocabulary.limit

    def _to_target_width(self, logits: torch.Tensor) -> torch.Tensor:
        width = logits.shape[-1]
        if width > self.vocab_size:
            return logits[..., : self.vocab_size]  # rows the target lacks: never proposed
        if width < self.vocab_size:  # rows the draft lacks: impossible tokens
            pad = logits.new_full((*logits.shape[:-1], self.vocab_size - width), float("-inf"))
            return torch.cat([logits, pad], dim=-1)
        return logits

    def _common_prefix(self, ids: torch.LongTensor) -> int:
        """Length of the longest cached prefix that agrees with `ids`, leaving at least its last token to feed."""
        limit = min(self._cached_ids.shape[1], ids.shape[1] - 1)
        agree = self._cached_ids[0, :limit] == ids[0, :limit]
        return limit if bool(agree.all()) else int(agree.long().argmin())

    def _sync_cache(self, ids: torch.LongTensor) -> None:
        """Rolls the cache back to the longest cached prefix that agrees with `ids` (its last token always fed)."""
        common = self._common_prefix(ids)
        excess = self._cache.get_seq_length() - common
        if excess > 0:  # only crop(-n) with n > 0: crop(0) empties the cache in older transformers
            self._cache.crop(-excess)
        self._cached_ids = ids[:, :common]
