"""`PacerDraftModelProposer`: vLLM's draft-model proposer, with a PACER head that stops each request's draft.

vLLM drafts for the whole batch in lockstep, one draft forward per step (`SpecDecodeBaseProposer.propose`). After
every full block this proposer scores each request with the stop rule pacer-hf uses ([`StopRule`]) and records the
length at which it stopped; a request's draft is cut there, so the target verifies only what the head let through.
The loop itself ends once every request has stopped: draft compute is saved only then, verification per request.

Shapes: B = requests in the batch, k = tokens drafted so far, H = draft hidden size, V = vocabulary, F = features.
"""

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
from typing_extensions import override
from vllm.config import VllmConfig
from vllm.v1.spec_decode.draft_model import DraftModelProposer

from pacer_core import PacerHead, PacerHeadConfig, StopRule, check_head_sizes, check_max_draft, draft_distribution_features
from pacer_core.head import ENTROPY_RULE_SETTINGS

# The keys of vLLM's `additional_config` this package reads. Only `pacer_head` is required.
HEAD_KEY = "pacer_head"
OVERRIDE_KEYS = {"pacer_threshold": "threshold", "pacer_block_size": "block_size", "pacer_score_mode": "score_mode"}
REVISION_KEY = "pacer_head_revision"
KNOWN_KEYS = frozenset({HEAD_KEY, REVISION_KEY, *OVERRIDE_KEYS})
ENTROPY_RULE = "entropy"  # `pacer_head="entropy"`: the training-free rule, sized for the draft
RECENT_STEPS = 1024  # draft lengths kept for `recent_draft_lengths`


class _AllStopped(Exception):
    """Every request of the batch has stopped: raised from inside vLLM's draft loop to end it early."""


@dataclass
class _Round:
    """What one `propose` call has drafted so far, per request."""

    hidden: list[torch.Tensor] = field(default_factory=list)  # per step: [B, H]
    features: list[torch.Tensor] = field(default_factory=list)  # per step: [B, F]
    tokens: list[torch.Tensor] = field(default_factory=list)  # per step: [B]
    probs: list[torch.Tensor] = field(default_factory=list)  # per step: [B, V] (probabilistic drafts only)
    lengths: torch.Tensor | None = None  # [B] draft length of each request that has stopped, else the step limit


def load_pacer_head(additional_config: dict[str, Any], vocab_size: int, hidden_size: int, draft_name: str,
                    num_speculative_tokens: int) -> tuple[PacerHead, PacerHeadConfig]:
    """The head named in vLLM's `additional_config` and the settings in force, checked against the draft.

    `max_draft` is vLLM's `num_speculative_tokens`: the engine sizes its buffers for it.
    """
    unknown = sorted(k for k in additional_config if k.startswith("pacer_") and k not in KNOWN_KEYS)
    if unknown:
        raise ValueError(f"Unknown pacer-vllm settings in `additional_config`: {unknown}. Known: {sorted(KNOWN_KEYS)}.")
    name = additional_config[HEAD_KEY]
    if not isinstance(name, str):
        raise TypeError(f"`additional_config['{HEAD_KEY}']` must be a Hub id, a folder or {ENTROPY_RULE!r}, "
                        f"got {type(name).__name__}.")
    if name == ENTROPY_RULE:
        head = PacerHead(PacerHeadConfig(vocab_size=vocab_size, draft_hidden_size=hidden_size,
                                         draft_name_or_path=draft_name, **ENTROPY_RULE_SETTINGS))
    else:
        head = PacerHead.from_pretrained(name, revision=additional_config.get(REVISION_KEY))
    check_head_sizes(head.config, vocab_size, hidden_size, f"the draft model {draft_name}",
                     fix="Name the head trained for this pair in `additional_config`, or train one with "
                         "`pacer-hf train`.")
    overrides = {field_name: additional_config[key] for key, field_name in OVERRIDE_KEYS.items()
                 if key in additional_config}
    config = PacerHeadConfig.from_dict({**head.config.to_dict(), **overrides, "max_draft": num_speculative_tokens})
    check_max_draft(head, config.max_draft, "vLLM's `num_speculative_tokens`")
    return head.eval(), config


def _check_one_vocabulary(speculative_config: Any) -> None:
    """A draft whose embedding rows differ from the target's (vLLM's `use_heterogeneous_vocab`) is run only when both
    share one tokenizer, padded differently (Qwen2.5-0.5B's 151,936 rows against Qwen2.5-7B's 152,064): the head reads
    the draft's own distribution, which for two tokenizers would be over other tokens than the target's."""
    from vllm.tokenizers.registry import get_tokenizer

    target, draft = speculative_config.target_model_config, speculative_config.draft_model_config
    target_vocab = get_tokenizer(target.tokenizer, trust_remote_code=target.trust_remote_code).get_vocab()
    draft_vocab = get_tokenizer(draft.model, trust_remote_code=draft.trust_remote_code).get_vocab()
    if target_vocab != draft_vocab:
        raise ValueError(
            "pacer-vllm runs a PACER head on a draft with other embedding rows than the target only when both share "
            "one tokenizer (a padded pair); these two tokenizers differ. Use vLLM's own proposer for this pair (drop "
            "`pacer_head` from `additional_config`)."
        )


class PacerDraftModelProposer(DraftModelProposer):
    """vLLM's `DraftModelProposer`; with `additional_config={"pacer_head": ...}`, a PACER head stops each
    request's draft after the block it predicts to fail. Without it, vLLM's own proposer, unchanged."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, runner: Any = None):
        super().__init__(vllm_config=vllm_config, device=device, runner=runner)
        additional = vllm_config.additional_config or {}
        self.pacer_head: PacerHead | None = None
        if HEAD_KEY not in additional:
            return
        draft = self.speculative_config.draft_model_config
        if self.use_heterogeneous_vocab:  # vLLM's switch for a draft with other embedding rows
            _check_one_vocabulary(self.speculative_config)
        self.pacer_head, self.pacer_config = load_pacer_head(
            additional, draft.get_vocab_size(), draft.get_hidden_size(), draft.model,
            self.speculative_config.num_speculative_tokens)
        self.stop_rule = StopRule(self.pacer_head, self.pacer_config)
        self._round = _Round()
        self.recent_lengths: deque[list[int]] = deque(maxlen=RECENT_STEPS)  # per step: each request's draft length

    @override
    def propose(self, num_speculative_tokens: int, *args: Any, **kwargs: Any) -> torch.Tensor | list[list[int]]:
        if self.pacer_head is None:
            return super().propose(num_speculative_tokens, *args, **kwargs)
        self._round = _Round()
        try:
            drafts = super().propose(num_speculative_tokens, *args, **kwargs)  # [B, K]
        except _AllStopped:
            drafts = torch.stack(self._round.tokens, dim=1)  # [B, k]
            if self._round.probs:
                self._last_draft_probs = torch.stack(self._round.probs, dim=1).contiguous()  # [B, k, V]
        if drafts.shape[1] == 0 or self._round.lengths is None:
            return drafts
        lengths = self._round.lengths.tolist()
        self.recent_lengths.append(lengths)
        if min(lengths) == drafts.shape[1]:
            return drafts  # nothing cut: vLLM's usual tensor
        # Each request's draft is a prefix of its row, so its probability rows (if any) stay aligned: the runner
        # reads the first len(draft) rows of a request.
        return [row[:n] for row, n in zip(drafts.tolist(), lengths)]

    @override
    def _sample_draft_tokens(self, hidden_states: torch.Tensor, sampling_metadata: Any
                             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.pacer_head is None:
            return super()._sample_draft_tokens(hidden_states, sampling_metadata)
        # hidden_states: [B, H], the draft's post-norm state; one lm_head call serves the token and the features.
        logits = self.model.compute_logits(hidden_states)  # [B, V_draft]
        if self.use_heterogeneous_vocab:  # a padded pair: rows the target lacks are never proposed (greedy only)
            logits = self.vocab_mapping.constrain_draft_logits(logits)
        if self._enable_probabilistic_draft_probs and not sampling_metadata.all_greedy:
            tokens, probs = self._sample_from_logits(logits, sampling_metadata)
            scores = probs.clamp_min(torch.finfo(probs.dtype).tiny).log()  # the distribution q the token came from
        else:
            tokens, probs, scores = logits.argmax(dim=-1), None, logits
        features = draft_distribution_features(scores, tokens)
        if self.use_heterogeneous_vocab:
            tokens = self.vocab_mapping.map_draft_to_target_ids(tokens)  # as vLLM's own proposer returns them
        self._record(hidden_states, features, tokens, probs)
        return tokens, probs

    def _record(self, hidden: torch.Tensor, features: torch.Tensor, tokens: torch.Tensor,
                probs: torch.Tensor | None) -> None:
        """Keeps one step of the batch's draft and, after a full block, asks the head which requests stop."""
        step = self._round
        step.hidden.append(hidden)
        step.features.append(features)
        step.tokens.append(tokens)
        if probs is not None:
            step.probs.append(probs)
        drafted = len(step.tokens)
        if step.lengths is None:
            step.lengths = torch.full((tokens.shape[0],), self.num_speculative_tokens, dtype=torch.long)
        if not self.stop_rule.asks_head(drafted):
            return
        stop = self.stop_rule.says_stop(torch.stack(step.hidden, dim=1), torch.stack(step.features, dim=1)).cpu()  # [B]
        running = step.lengths == self.num_speculative_tokens
        step.lengths[stop & running] = drafted
        if drafted < self.num_speculative_tokens and bool((step.lengths < self.num_speculative_tokens).all()):
            raise _AllStopped


def recent_draft_lengths(worker: Any) -> list[list[int]]:
    """Each request's draft length in the engine's latest steps (at most `RECENT_STEPS`), read from a worker:
    `llm.collective_rpc(recent_draft_lengths)` (vLLM sends callables only with `VLLM_ALLOW_INSECURE_SERIALIZATION=1`).
    Acceptance counts are in vLLM's own spec-decode metrics (`llm.get_metrics()`)."""
    drafter = worker.model_runner.drafter
    return list(getattr(drafter, "recent_lengths", ()))
