"""`DraftVocabulary`: the draft's output layer over part of its vocabulary, for a faster draft forward.

Why: a small draft with a large vocabulary spends much of each forward in its output layer. Qwen2.5-Coder-0.5B's
151,936 x 896 `lm_head` is about a quarter of its weights; on the Intel Xeon of `eval/` (bf16, prepacked) its
one-token forward took 67 ms with the whole layer and 59 ms with 32,768 rows (`docs/planner.md`, "The draft's output
layer"), and the planned rounds ran 2-7% faster where they draft.

Which ids: every id below `limit` (a byte-level BPE vocabulary lists its earliest merges, the commonest tokens, first)
and every id already in the call's sequence (names, numbers and words of other scripts that the text reuses). The
draft's logits are -inf at every other id, so it never proposes one.

Why the output stays exact: this changes only what the draft proposes. Greedy verification keeps the target's
tokens; in sampling each drafted token is drawn from the restricted distribution, and that distribution is the
candidate row handed to transformers' speculative sampling, which is exact for any draft distribution.

Checked once per model: the first forward computes the model's own logits too; a model whose logits are not its output
layer applied to its last hidden state (a final soft cap, a logit scale) keeps its whole vocabulary, with a warning.

Shapes: L = tokens fed so far, n = positions scored, H = draft hidden size, R = the draft's output rows.
"""

import warnings
import weakref
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from .cpu_linear import PrepackedLinear

# `pacer_draft_vocab="auto"`: on a CPU, a draft with more output rows than AUTO_MIN_ROWS scores AUTO_LIMIT of them
# (measured on Qwen2.5-Coder-0.5B: 32,768 and 65,536 ran alike; ids below 32,768 held 84-96% of the target's greedy
# tokens on summaries, rag, code and chat, 97-99.7% with the sequence's ids). A GPU keeps the whole layer until it is
# measured there.
AUTO_LIMIT = 32768
AUTO_MIN_ROWS = 65536
# The check against the model's own logits: the largest difference allowed, relative to the largest logit. Loose
# enough for another summation order in bf16, far below what a soft cap or a logit scale changes.
_CHECK_TOLERANCE = 0.02


class DraftVocabulary:
    """The output layer of `model` restricted to ids below `limit` and the ids of the sequence it scores.

    Built once per (model, limit) by [`draft_vocabulary`]: rows below `limit` in the layer's own kernel (prepacked if
    it was; otherwise a view, no copy), the rest gathered per forward for the ids the sequence holds.
    """

    def __init__(self, model: PreTrainedModel, limit: int):
        layer = model.get_output_embeddings()
        self._source = (weakref.ref(layer), _weight_key(layer.weight))  # what it was built from
        self.limit = limit
        self.rows = layer.weight.shape[0]
        self.weight = _dense_weight(model, layer)  # [R, H]
        self.bias = None if layer.bias is None else layer.bias.detach()  # [R]
        self.first = self._first_rows(layer)
        self.verified: bool | None = None  # set by the first forward's check

    def _first_rows(self, layer: nn.Module) -> nn.Module:
        first = nn.utils.skip_init(nn.Linear, self.weight.shape[1], self.limit, bias=self.bias is not None,
                                   dtype=self.weight.dtype, device=self.weight.device)  # its weights are replaced
        first.weight.data = self.weight[: self.limit]  # a view
        if self.bias is not None:
            first.bias.data = self.bias[: self.limit]
        return PrepackedLinear(first) if isinstance(layer, PrepackedLinear) else first

    def fits(self, model: PreTrainedModel) -> bool:
        """Whether `model`'s output layer is still the one this was built from (not replaced, moved or cast since)."""
        layer, key = self._source
        current = model.get_output_embeddings()
        return current is layer() and _weight_key(current.weight) == key

    def allowed_extra(self, seen: torch.LongTensor) -> torch.LongTensor:
        """The ids of `seen` `[1, L]` at or past `limit` that the layer has rows for, once each: `[E]`."""
        ids = torch.unique(seen[0])
        return ids[(ids >= self.limit) & (ids < self.rows)]

    def logits(self, hidden: torch.Tensor, seen: torch.LongTensor) -> torch.Tensor:
        """Float32 logits `[1, n, R]` of `hidden` `[1, n, H]`: the layer's at ids below `limit` and at the ids of
        `seen` `[1, L]`, -inf at every other."""
        extra = self.allowed_extra(seen)  # [E]
        full = hidden.new_full((*hidden.shape[:-1], self.rows), float("-inf"), dtype=torch.float32)
        full[..., : self.limit] = self.first(hidden).float()
        if extra.numel():
            bias = None if self.bias is None else self.bias[extra]
            full[..., extra] = nn.functional.linear(hidden, self.weight[extra], bias).float()  # [1, n, E]
        return full

    def check(self, model: PreTrainedModel, hidden: torch.Tensor, seen: torch.LongTensor,
              own: torch.Tensor) -> bool:
        """Whether the model's own logits `own` `[1, n, R]` are this layer's on the allowed ids (once per model)."""
        if self.verified is None:
            ours = self.logits(hidden, seen)
            allowed = torch.isfinite(ours)
            scale = float(own.float().abs().max()) or 1.0
            difference = float((ours[allowed] - own.float()[allowed]).abs().max())
            self.verified = difference <= _CHECK_TOLERANCE * scale
            if not self.verified:
                warnings.warn(
                    f"pacer-hf: the logits of the draft {type(model).__name__} are not its output layer applied to its "
                    f"last hidden state (a soft cap or logit scale between them?; largest difference {difference:.3g}), "
                    "so it drafts over its whole vocabulary. Pass `pacer_draft_vocab=None` to skip this check.",
                    UserWarning,
                    stacklevel=2,
                )
        return self.verified


def _weight_key(weight: torch.Tensor) -> tuple:
    """Where a weight lives: moving or casting it (`model.to(...)`) changes this (a prepacked one cannot move)."""
    dense = weight.layout != torch._mkldnn
    return weight.device, weight.dtype, tuple(weight.shape), weight.data_ptr() if dense else id(weight)


def _dense_weight(model: PreTrainedModel, layer: nn.Module) -> torch.Tensor:
    """The output layer's weight `[R, H]` in the dense layout: prepacking keeps a tied weight's dense original in the
    input embeddings; an untied prepacked weight is copied back out of oneDNN's layout."""
    weight = layer.weight.detach()
    if weight.layout != torch._mkldnn:
        return weight
    embeddings = model.get_input_embeddings().weight.detach()
    tied = getattr(model.config.get_text_config(), "tie_word_embeddings", False)
    return embeddings if tied and embeddings.shape == weight.shape else weight.to_dense()


# (model -> limit -> its DraftVocabulary, or None where the model cannot skip its own output layer)
_BY_MODEL: "weakref.WeakKeyDictionary[nn.Module, dict[int, DraftVocabulary | None]]" = weakref.WeakKeyDictionary()


def draft_vocabulary(model: PreTrainedModel, limit: int | None) -> DraftVocabulary | None:
    """The restricted output layer of `model` for `limit`, built on first use and kept while the model and its output
    layer stay as they were (rebuilt after `model.to(...)` or a new layer). None for the whole vocabulary: no limit,
    a limit at or past the layer's rows, a model whose forward cannot skip its own output layer (no
    `logits_to_keep`), a layer that is not a plain linear one, or a model whose check failed."""
    if limit is None:
        return None
    by_limit = _BY_MODEL.setdefault(model, {})
    built = by_limit.get(limit)
    if limit not in by_limit or (built is not None and not built.fits(model)):
        layer = model.get_output_embeddings()
        plain = isinstance(layer, (nn.Linear, PrepackedLinear)) and layer.weight.dim() == 2
        usable = plain and limit < layer.weight.shape[0] and model._supports_logits_to_keep()
        by_limit[limit] = DraftVocabulary(model, limit) if usable else None
    vocabulary = by_limit[limit]
    return None if vocabulary is None or vocabulary.verified is False else vocabulary


def resolve_draft_vocab(value: Any, draft: PreTrainedModel) -> int | None:
    """`pacer_draft_vocab` as a limit for this draft: `"auto"` (the default) is `AUTO_LIMIT` on a CPU for a draft with
    more than `AUTO_MIN_ROWS` output rows and the whole vocabulary (None) otherwise; an int is that limit; None is the
    whole vocabulary."""
    if value is None:
        return None
    if value == "auto":
        layer = draft.get_output_embeddings()
        rows = layer.weight.shape[0] if layer is not None else 0
        return AUTO_LIMIT if draft.device.type == "cpu" and rows > AUTO_MIN_ROWS else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"`pacer_draft_vocab` must be \"auto\", None (the draft's whole vocabulary) or a positive number of ids "
            f"(the draft scores the ids below it and those of the sequence), got {value!r}."
        )
    return value
