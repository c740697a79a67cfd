"""`PacerCandidateGenerator`: blockwise drafting that a PACER head stops at the right block.

Notation: p = target distribution, q = draft distribution, both after the target's logits processors.
Shapes: L = tokens so far, k = drafted tokens of the round, H = draft hidden size, V = vocabulary, F = features.
"""

import math
import time

import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList, PreTrainedModel
from transformers.generation.candidate_generator import AssistedCandidateGenerator
from transformers.generation.logits_process import MinLengthLogitsProcessor

from pacer_core.config import PacerHeadConfig, log_threshold
from pacer_core.features import draft_distribution_features
from pacer_core.head import PacerHead
from pacer_core.stop_rule import says_stop

from .phrases import PhrasePool
from .stats import PacerStats

# A round whose context matches a phrase's source on at least this many tokens sends the phrase without drafting.
# Sized on training prompts (docs/phrase-drafting.md): 2-3-token keys are confirmed 40-83% of the time, 1-token keys
# 19-25%.
LOOKUP_ROUND_KEY_LENGTH = 2
# A phrase sent without the draft gets this many tokens per context token its source matched (up to
# `phrase_tail`): the further back the context agrees with where the phrase came from, the longer the text is likely
# to keep copying it. Chosen on tuning prompts by replaying look-up rules (docs/phrase-drafting.md).
TAIL_TOKENS_PER_MATCHED_TOKEN = 6


def tail_length(match_length: int, phrase_tail: int) -> int:
    """How many phrase tokens to send without the draft after a look-up that matched `match_length` tokens."""
    return min(phrase_tail, TAIL_TOKENS_PER_MATCHED_TOKEN * match_length)


class PacerCandidateGenerator(AssistedCandidateGenerator):
    """Candidate generator for transformers' assisted generation that drafts in blocks of `config.block_size` tokens
    and asks a [`PacerHead`] after each full block whether to draft another one (PACER, arXiv 2602.01274).

    It keeps the parent's set-up (assistant kwargs, logits processors, length limits) but runs its own draft loop:
    one draft forward per token (or, with a [`PhrasePool`], per run of phrase tokens the draft confirms), with the
    draft's `DynamicCache` kept across rounds and rolled back only as far as the target rejected. Losslessness: the
    block the head rejects is still sent to the target (stopping only ends drafting), and whether a block is drafted
    depends only on tokens already drafted, so the draft length is a stopping time and speculative sampling stays
    exact. `get_candidates` returns the processed draft logits each
    token was drawn from.

    Built by `target.generate(..., assistant_model=draft, pacer_head=head)`; see
    https://huggingface.co/docs/transformers/generation_strategies#speculative-decoding.

    Args:
        input_ids (`torch.LongTensor` of shape `(1, sequence_length)`): the prompt.
        assistant_model (`PreTrainedModel`): the draft model.
        generation_config (`GenerationConfig`): the target's per-call generation config.
        model_kwargs (`dict`): the target's model kwargs (attention mask, ...).
        inputs_tensor (`torch.Tensor`, *optional*): the model input tensor.
        logits_processor (`LogitsProcessorList`, *optional*): the target's prepared logits processors.
        pacer_head (`PacerHead`): the head that decides when to stop drafting.
        config (`PacerHeadConfig`, *optional*): drafting settings; defaults to `pacer_head.config`.
        stats (`PacerStats`, *optional*): filled with per-round statistics.
        phrases (`PhrasePool`, *optional*): turns on phrase drafting with this pool (see [`PhrasePool`]).
    """

    # The parent's online ROC re-fit of `assistant_confidence_threshold` and its `ConfidenceCriteria` are switched
    # off for subclasses (`type(self) is AssistedCandidateGenerator` guards) and our loop never builds stopping
    # criteria: only the head decides when a round ends. Nothing of either is re-implemented here on purpose.
    requires_model_outputs = False

    def __init__(
        self,
        input_ids: torch.LongTensor,
        assistant_model: PreTrainedModel,
        generation_config: GenerationConfig,
        model_kwargs: dict,
        inputs_tensor: torch.Tensor | None = None,
        logits_processor: LogitsProcessorList | None = None,
        *,
        pacer_head: PacerHead,
        config: PacerHeadConfig | None = None,
        stats: PacerStats | None = None,
        phrases: PhrasePool | None = None,
    ):
        if input_ids.shape[0] != 1:
            raise ValueError(
                f"assisted generate with `pacer_head` is only supported for batch_size = 1, got batch_size = "
                f"{input_ids.shape[0]}"
            )
        if input_ids.shape[1] == 0:
            raise ValueError(
                "The prompt is empty (`input_ids` of shape (1, 0)): the draft and the target need at least one token "
                "to start from. Tokenize a non-empty text, or start from the tokenizer's BOS token or chat template."
            )
        super().__init__(input_ids, assistant_model, generation_config, model_kwargs, inputs_tensor, logits_processor)
        self.head = pacer_head
        self.config = config if config is not None else pacer_head.config
        self.stats = stats if stats is not None else PacerStats()
        self.do_sample = bool(self.generation_config.do_sample)
        self._log_threshold = log_threshold(self.config.threshold)

        eos = self.generation_config._eos_token_tensor
        self._eos = eos.to(assistant_model.device) if eos is not None else None
        # The parent drops MinLengthLogitsProcessor because the draft's inner generate() re-creates it from
        # `min_new_tokens`; our loop has no inner generate(), so it masks EOS until the target's `min_length` itself.
        processors = list(self.logits_processor)
        if self._eos is not None and self.main_model_min_length:
            processors.append(MinLengthLogitsProcessor(self.main_model_min_length, self._eos, device=self._eos.device))
        self._processors = LogitsProcessorList(processors)

        self._cache = DynamicCache(config=assistant_model.config)
        self._cache.activate_past_recording()  # lets sliding-window draft layers roll back past their window
        self._cached_ids = input_ids[:, :0].to(assistant_model.device)  # tokens whose keys/values are in the cache
        self._keeps_logits = assistant_model._supports_logits_to_keep()
        # Only a padded prompt needs an explicit mask; positions then follow the mask, as for the target.
        mask = self.assistant_kwargs.get("attention_mask")
        self._prompt_mask = mask if mask is not None and not bool(mask.all()) else None
        self._round_end = 0.0
        self._num_forwards = 0
        self._copying = False
        self._round_candidates: list[int] = []  # the tokens of the round in flight, drafted and tail
        self.phrases = phrases
        if phrases is not None:
            phrases.start_sequence(input_ids[0].tolist())

    # ---- the transformers contract ------------------------------------------------------------------------

    def get_candidates(self, input_ids: torch.LongTensor, *args, **kwargs) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """Drafts one round.

        Returns:
            `candidate_input_ids` (`torch.LongTensor` of shape `(1, sequence_length + k)`) and, per candidate token,
            the processed logits it was drawn from (`torch.FloatTensor` of shape `(1, k, vocab_size)`): the draft's
            for drafted tokens, a one-hot row for a phrase tail. `(input_ids, None)` when the length limit leaves
            no room for a draft.
        """
        input_ids = input_ids.to(self.assistant_model.device)
        if self.phrases is not None:
            self.phrases.extend(input_ids[0, self.phrases.sequence_length :].tolist())
        max_new_tokens = self._max_new_tokens(input_ids, **kwargs)
        if max_new_tokens <= 0:
            self._end_round([], [], 0)
            return input_ids, None
        forwards, self._copying = self._num_forwards, False
        # A phrase keyed on 2-3 tokens goes to the target first, without the draft, as prompt lookup does: where
        # text is being copied that is cheaper than confirming it through draft forwards. The draft (stopped by
        # the head) drafts where no such phrase exists.
        tokens, scores = input_ids[:, :0], None  # [1, 0]
        tail = self._tail(input_ids, min_key_length=LOOKUP_ROUND_KEY_LENGTH)
        if not tail:
            tokens, scores, stopped_by_head = self._draft_blocks(input_ids, max_new_tokens)
            self.stats.head_stops += int(stopped_by_head)
            if tokens.shape[1] == self.config.max_draft or self._copying:
                tail = self._tail(torch.cat([input_ids, tokens], dim=-1))
        self._end_round(tokens[0].tolist(), tail, self._num_forwards - forwards)
        if tail:
            tail_ids = torch.tensor([tail], dtype=tokens.dtype, device=tokens.device)  # [1, e]
            rows = _one_hot_logits(tail_ids, self.config.vocab_size)  # [1, e, V]
            tokens = torch.cat([tokens, tail_ids], dim=-1)
            scores = rows if scores is None else torch.cat([scores, rows], dim=1)  # [1, k + e, V]
        return torch.cat([input_ids, tokens], dim=-1), scores

    def _end_round(self, drafted: list[int], tail: list[int], forwards: int) -> None:
        self.stats.draft_lengths.append(len(drafted))
        self.stats.draft_forwards.append(forwards)
        if self.phrases is not None:
            self.stats.tail_lengths.append(len(tail))
        self._round_candidates = drafted + tail
        self._round_end = time.perf_counter()

    def _max_new_tokens(self, input_ids: torch.LongTensor, **kwargs) -> int:
        """The most tokens this round may draft: `max_draft`, within the target's length budget (the target adds one
        token of its own). A subclass may draft less, e.g. the evaluation harness's oracle."""
        return min(self.config.max_draft, self.main_model_max_length - input_ids.shape[1] - 1)

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int) -> None:
        # Not the parent's: its `heuristic` schedule and ROC threshold are replaced by the head.
        self.stats.target_time_s += time.perf_counter() - self._round_end
        self.stats.accepted_lengths.append(int(num_matches))
        if self.phrases is None:
            return
        self.stats.tail_tokens_accepted += max(0, int(num_matches) - self.stats.draft_lengths[-1])
        self._learn_phrases(input_ids, scores, int(num_matches))

    def _learn_phrases(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int) -> None:
        """Stores what a rejected round teaches (Ouroboros): the target's own tokens after the rejected candidate,
        and the rejected candidates after the target's correction (often right, one token late).

        `scores` `[1, k + 1, V]`: the target's processed logits at each candidate position of the round.
        """
        candidates = self._round_candidates  # k tokens
        n = num_matches
        if n >= len(candidates) or scores.shape[1] != len(candidates) + 1:
            return  # all accepted (or cut by EOS/length): nothing was rejected
        targets = scores[0, n + 1 :].argmax(dim=-1).tolist()  # target's choice after each rejected-branch prefix
        # After candidate n (the rejected one) the target would say targets[0]; its next choices hold only while
        # the rejected branch kept agreeing with it.
        residue = [targets[0]]
        for j in range(1, len(targets)):
            if candidates[n + j] != targets[j - 1]:
                break
            residue.append(targets[j])
        # input_ids ends with the accepted candidates and the target's correction of candidate n
        self.phrases.add(input_ids[0, -4:-1].tolist() + candidates[n : n + 1], residue)
        if n + 1 < len(candidates):
            self.phrases.add(input_ids[0, -3:].tolist(), candidates[n + 1 :])

    # ---- one round ----------------------------------------------------------------------------------------

    def _draft_blocks(self, input_ids: torch.LongTensor, max_new_tokens: int) -> tuple[torch.LongTensor, torch.Tensor, bool]:
        """Drafts up to `max_new_tokens` tokens, one block at a time, until the head stops the round.

        Each draft forward feeds the tokens the draft's cache lacks plus, with phrase drafting, a looked-up phrase
        of m tokens. The draft then picks its token at each fed position exactly as it would alone (argmax, or a
        sample from the processed q) and moves on to the next position only while its token equals the phrase's:
        so one forward yields 1 to m + 1 tokens, each drawn from the draft's own q on the right prefix.

        Returns the drafted tokens `[1, k]`, their processed logits `[1, k, V]` and whether the head stopped.
        """
        block_size = self.config.block_size
        ids = input_ids  # [1, L + i]
        hidden, scores, features = [], [], []  # per drafted token: [1, H], [1, V]; per head call: [1, block, F]
        while True:
            start = time.perf_counter()
            phrase = self._phrase(ids, max_new_tokens - len(scores) - 1)  # m tokens
            logits, fed_hidden = self._forward(ids, phrase)  # [1, m + 1, V], [1, m + 1, H]
            for j in range(len(phrase) + 1):
                if j:  # phrase token j - 1 was confirmed: this position's logits saw the right prefix
                    start = time.perf_counter()
                    self.stats.phrase_tokens_confirmed += 1
                step_scores = self._processors(ids, logits[:, j])  # [1, V]: q before sampling, as the target's p
                token = self._select(step_scores)  # [1, 1]
                ids = torch.cat([ids, token], dim=-1)
                hidden.append(fed_hidden[:, j])
                scores.append(step_scores)
                self.stats.draft_time_s += time.perf_counter() - start
                if self._eos is not None and bool(torch.isin(token, self._eos).any()):
                    return ids[:, input_ids.shape[1] :], torch.stack(scores, dim=1), False  # the target stops too
                drafted = len(scores)
                if drafted == max_new_tokens:
                    return ids[:, input_ids.shape[1] :], torch.stack(scores, dim=1), False
                # After each full block the head decides whether to draft another. The failed block itself is still
                # verified: stopping only ends drafting, keeping sampling exact (threshold 0 never stops: not asked).
                if drafted % block_size == 0 and self._log_threshold > -math.inf:
                    if self._head_says_stop(hidden, scores, ids[:, -block_size:], features):
                        return ids[:, input_ids.shape[1] :], torch.stack(scores, dim=1), True
                if j < len(phrase) and token.item() != phrase[j]:
                    break  # the later fed positions saw the phrase's token, not the draft's: next forward
            else:
                if phrase and len(phrase) == self.config.phrase_length:
                    self._copying = True  # the draft confirmed a whole phrase: the text is being copied
                    return ids[:, input_ids.shape[1] :], torch.stack(scores, dim=1), False

    def _phrase(self, ids: torch.LongTensor, room: int) -> list[int]:
        """The phrase to feed after `ids` (at most `room` and `config.phrase_length` tokens; none without a pool)."""
        if self.phrases is None or room <= 0:
            return []
        phrase, _ = self.phrases.lookup(ids[0].tolist(), min(room, self.config.phrase_length))
        self.stats.phrase_tokens_offered += len(phrase)
        return phrase

    def _tail(self, candidate_ids: torch.LongTensor, min_key_length: int = 1) -> list[int]:
        """Phrase tokens to send without the draft after `candidate_ids` (a round that reached `max_draft` or
        confirmed a whole phrase, or a copy round's context), cut after EOS and to the length budget. Their
        candidate rows are one-hot: that is the distribution they were drawn from. The look-up reads only the
        sequence, this round's draft and the pool, never this round's target, so the round's length stays a
        stopping time."""
        room = min(self.config.phrase_tail, self.main_model_max_length - candidate_ids.shape[1] - 1)
        if self.phrases is None or room <= 0:
            return []
        context = candidate_ids[0].tolist()
        eos = set(self._eos.tolist()) if self._eos is not None else set()
        if context[-1] in eos:
            return []
        tail, match_length = self.phrases.lookup(context, room)
        if match_length < min_key_length:
            return []
        tail = tail[: tail_length(match_length, room)]
        for i, token in enumerate(tail):
            if token in eos:
                return tail[: i + 1]
        return tail

    def _head_says_stop(
        self, hidden: list[torch.Tensor], scores: list[torch.Tensor], block_tokens: torch.LongTensor, features: list
    ) -> bool:
        """Scores the round so far with the shared stop rule ([`says_stop`]) and says whether it stops."""
        start = time.perf_counter()
        block_size = block_tokens.shape[1]
        block_scores = torch.stack(scores[-block_size:], dim=1)  # [1, block, V]
        features.append(draft_distribution_features(block_scores, block_tokens))  # [1, block, F]
        # [1, k, H] and [1, k, F]: the whole round so far
        stop = bool(says_stop(self.head, torch.stack(hidden, dim=1), torch.cat(features, dim=1), self.config))
        self.stats.head_calls += 1
        self.stats.head_time_s += time.perf_counter() - start
        return stop

    # ---- draft model plumbing -----------------------------------------------------------------------------

    def _forward(self, ids: torch.LongTensor, phrase: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Feeds the tokens of `ids` the cache lacks, then the m tokens of `phrase`; returns the logits (float32)
        and post-norm hidden states of the last token of `ids` and of each phrase token: `[1, m + 1, V]`,
        `[1, m + 1, H]`. The phrase's keys and values stay cached; `_sync_cache` drops those the draft did not
        confirm before the next forward."""
        self._sync_cache(ids)
        fed = torch.cat([ids, ids.new_tensor([phrase])], dim=-1) if phrase else ids  # [1, L + i + m]
        num_cached = self._cached_ids.shape[1]
        kwargs = {"logits_to_keep": len(phrase) + 1} if self._keeps_logits else {}
        if self._prompt_mask is not None:
            pad = fed.shape[1] - self._prompt_mask.shape[1]
            mask = torch.cat([self._prompt_mask, self._prompt_mask.new_ones(1, pad)], dim=-1)  # [1, L + i + m]
            kwargs["attention_mask"] = mask
            kwargs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)[:, num_cached:]
        out = self.assistant_model(
            input_ids=fed[:, num_cached:], past_key_values=self._cache, use_cache=True, output_hidden_states=True,
            **kwargs,
        )
        self._cached_ids = fed
        self._num_forwards += 1
        keep = len(phrase) + 1
        # hidden_states[-1] is the post-norm state that feeds the lm_head (transformers ties it to last_hidden_state)
        return out.logits[:, -keep:, :].float(), out.hidden_states[-1][:, -keep:, :]

    def _select(self, scores: torch.Tensor) -> torch.LongTensor:
        """Picks the next draft token from processed logits `[1, V]` exactly as transformers' decoding does."""
        if self.do_sample:
            return torch.multinomial(scores.softmax(dim=-1), num_samples=1)  # [1, 1]
        return scores.argmax(dim=-1, keepdim=True)  # [1, 1]

    def _sync_cache(self, input_ids: torch.LongTensor) -> None:
        """Rolls the draft cache back to the longest cached prefix that agrees with `input_ids`, always leaving at
        least the last token to feed (its logits start the next draft forward)."""
        limit = min(self._cached_ids.shape[1], input_ids.shape[1] - 1)
        agree = self._cached_ids[0, :limit] == input_ids[0, :limit]
        common = limit if bool(agree.all()) else int(agree.long().argmin())
        excess = self._cache.get_seq_length() - common
        if excess > 0:  # only crop(-n) with n > 0: crop(0) empties the cache in older transformers
            self._cache.crop(-excess)
        self._cached_ids = input_ids[:, :common]


def _one_hot_logits(tokens: torch.LongTensor, vocab_size: int) -> torch.Tensor:
    """Logits `[1, e, V]` of the point mass on each of `tokens` `[1, e]`: 0 at the token, -inf elsewhere, so that
    speculative sampling accepts a token x with probability p(x) and resamples from p without x otherwise."""
    logits = torch.full((*tokens.shape, vocab_size), -math.inf, device=tokens.device)
    return logits.scatter_(-1, tokens.unsqueeze(-1), 0.0)
