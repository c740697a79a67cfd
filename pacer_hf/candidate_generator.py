"""`PacerCandidateGenerator`: blockwise drafting that a PACER head stops at the right block (the paper's loop).

Notation: p = target distribution, q = draft distribution, both after the target's logits processors.
Shapes: L = tokens so far, k = drafted tokens of the round, H = draft hidden size, V = vocabulary, F = features.
"""

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel
from transformers.generation.candidate_generator import AssistedCandidateGenerator
from transformers.generation.logits_process import MinLengthLogitsProcessor
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList

from pacer_core.config import PacerHeadConfig
from pacer_core.features import draft_distribution_features
from pacer_core.head import PacerHead
from pacer_core.stop_rule import StopRule

from .draft_model import DraftModel
from .stats import PacerStats, RoundRecord

# Stopping criteria that transformers' assisted loop applies exactly by itself: it clips the accepted tokens at the
# first EOS and at the length limit. Every other criterion of the call is checked here on each candidate prefix.
_CLIPPED_BY_TRANSFORMERS = (EosTokenCriteria, MaxLengthCriteria)


@dataclass
class DraftStep:
    """One token the draft drew: `token` `[1, 1]`, the post-norm hidden state that produced it `[1, H]`, and the
    processed logits it was drawn from `[1, V]`."""

    token: torch.LongTensor
    hidden: torch.Tensor
    scores: torch.Tensor


@dataclass
class DraftedRun:
    """The tokens a round drafted, `tokens` `[1, k]`, with the processed logits each was drawn from `[1, k, V]`, and
    why drafting ended: `"head"` (the head stopped it after a block), `"limit"` (the round's room), `"eos"` (an EOS
    token: the target stops there too) or `"source"` (the draft steps ran out: see `PacerCandidateGenerator._draft_steps`)."""

    tokens: torch.LongTensor
    scores: torch.Tensor | None
    end: str


@dataclass
class Candidates:
    """What a round sends to the target: `tokens` `[1, n]` and the distribution each was drawn from `[1, n, V]` (None
    when n = 0). The first `drafted` tokens came from the draft; the rest were sent without it (one-hot rows)."""

    tokens: torch.LongTensor
    rows: torch.Tensor | None
    drafted: int
    record: RoundRecord

    def cut(self, length: int) -> "Candidates":
        """The first `length` candidates (a stopping criterion fires at the next one)."""
        if length >= self.tokens.shape[1]:
            return self
        self.record.sent, self.record.drafted = length, min(self.drafted, length)
        return Candidates(self.tokens[:, :length], self.rows[:, :length] if length else None,
                          min(self.drafted, length), self.record)


class PacerCandidateGenerator(AssistedCandidateGenerator):
    """Candidate generator for transformers' assisted generation that drafts in blocks of `config.block_size` tokens
    and asks a [`PacerHead`] after each full block whether to draft another one (PACER, arXiv 2602.01274).

    It keeps the parent's set-up (assistant kwargs, logits processors, length limits) but runs its own draft loop,
    [`_draft_blocks`]: one draft forward per token, with the draft's cache kept across rounds ([`DraftModel`]).
    Losslessness: the block the head rejects is still sent to the target (stopping only ends drafting), and whether a
    block is drafted depends only on tokens already drafted, so the draft length is a stopping time and speculative
    sampling stays exact. `get_candidates` returns the processed draft logits each token was drawn from.

    Two seams let other sources compose around this loop without entering it: `_propose` (what a round sends; here
    always the head-stopped draft) and `_draft_steps` (where the draft's tokens come from; here one forward each).
    [`PhraseCandidateGenerator`] uses both.

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
        config (`PacerHeadConfig`): the call's drafting settings (the head's config with per-call overrides).
        stats (`PacerStats`): filled with per-round statistics.
        stopping_criteria (`StoppingCriteriaList`, *optional*): the call's stopping criteria, as `generate()` built
            them (`stop_strings`, `max_time`, the user's `stopping_criteria=`): each candidate prefix passes through
            them before it is sent, so a stop inside an accepted run ends the output where plain decoding ends it.
        target_vocab_size (`int`, *optional*): the target's vocabulary size, when the draft's embedding rows differ
            (a padded pair); defaults to the draft's.
        draft_vocab (`int`, *optional*): the draft scores only ids below it and the sequence's ids ([`DraftModel`]);
            None: its whole vocabulary. `generate()` passes `pacer_draft_vocab` resolved for the draft.
    """

    # The parent's online ROC re-fit of `assistant_confidence_threshold` and its `ConfidenceCriteria` are switched
    # off for subclasses (`type(self) is AssistedCandidateGenerator` guards) and our loop never builds stopping
    # criteria for the draft: only the head decides when a round ends. Nothing of either is re-implemented on purpose.
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
        config: PacerHeadConfig,
        stats: PacerStats,
        stopping_criteria: StoppingCriteriaList | None = None,
        target_vocab_size: int | None = None,
        draft_vocab: int | None = None,
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
        self.config = config
        self.stop_rule = StopRule(pacer_head, config)
        self.stats = stats
        self.do_sample = bool(self.generation_config.do_sample)
        self.vocab_size = target_vocab_size if target_vocab_size is not None else config.vocab_size

        eos = self.generation_config._eos_token_tensor
        self._eos = eos.to(assistant_model.device) if eos is not None else None
        # The parent drops MinLengthLogitsProcessor because the draft's inner generate() re-creates it from
        # `min_new_tokens`; our loop has no inner generate(), so it masks EOS until the target's `min_length` itself.
        processors = list(self.logits_processor)
        if self._eos is not None and self.main_model_min_length:
            processors.append(MinLengthLogitsProcessor(self.main_model_min_length, self._eos, device=self._eos.device))
        self._processors = LogitsProcessorList(processors)

        self._stopping_criteria = StoppingCriteriaList(
            c for c in (stopping_criteria or ()) if not isinstance(c, _CLIPPED_BY_TRANSFORMERS)
        )
        self._criteria_device = input_ids.device  # the target's, where generate() built the criteria
        # What plain decoding hands a criterion as `scores`: None, or with `output_scores` the target's scores so far,
        # which do not exist yet for a token that is only a candidate.
        wants_scores = generation_config.return_dict_in_generate and generation_config.output_scores
        self._criteria_scores = _ScoresOfCandidates() if wants_scores else None

        # Only a padded prompt needs an explicit mask; positions then follow the mask, as for the target.
        mask = self.assistant_kwargs.get("attention_mask")
        self.draft = DraftModel(assistant_model, mask if mask is not None and not bool(mask.all()) else None,
                                self.vocab_size, draft_vocab)
        self._round_end = 0.0
        self._round: Candidates | None = None  # the round in flight

    # ---- the transformers contract ------------------------------------------------------------------------

    def get_candidates(self, input_ids: torch.LongTensor, *args, **kwargs) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """Proposes one round.

        Returns:
            `candidate_input_ids` (`torch.LongTensor` of shape `(1, sequence_length + n)`) and, per candidate token,
            the processed logits it was drawn from (`torch.FloatTensor` of shape `(1, n, vocab_size)`): the draft's
            for drafted tokens, a one-hot row for a token sent without the draft. `(input_ids, None)` when the round
            sends nothing (the length limit leaves no room, or a plain target step).
        """
        input_ids = input_ids.to(self.assistant_model.device)
        room = self.main_model_max_length - input_ids.shape[1] - 1  # the target adds one token of its own
        draft_room = min(room, self._max_new_tokens(input_ids, **kwargs))
        forwards = self.draft.forwards
        candidates = self._propose(input_ids, room, draft_room) if room > 0 else self._nothing(input_ids, "limit")
        candidates = candidates.cut(self._sendable_length(input_ids, candidates.tokens))
        self._record_round(candidates, self.draft.forwards - forwards)
        return torch.cat([input_ids, candidates.tokens], dim=-1), candidates.rows

    def _max_new_tokens(self, input_ids: torch.LongTensor, **kwargs) -> int:
        """The most tokens this round may draft: `max_draft` (within the length budget, which `get_candidates`
        applies). A subclass may draft less, e.g. the evaluation harness's oracle."""
        return self.config.max_draft

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int) -> None:
        # Not the parent's: its `heuristic` schedule and ROC threshold are replaced by the head.
        self.stats.target_time_s += time.perf_counter() - self._round_end
        self.stats.accepted_lengths.append(int(num_matches))
        self._round.record.accepted = int(num_matches)

    # ---- one round ----------------------------------------------------------------------------------------

    def _propose(self, input_ids: torch.LongTensor, room: int, draft_room: int) -> Candidates:
        """What this round sends, at most `room` candidates of which at most `draft_room` drafted: here the draft's
        tokens, stopped by the head (the paper's round)."""
        if draft_room <= 0:
            return self._nothing(input_ids, "limit")
        run = self._draft_blocks(input_ids, draft_room)
        drafted = run.tokens.shape[1]
        return Candidates(run.tokens, run.scores, drafted, RoundRecord("draft", drafted, drafted, end=run.end))

    def _draft_blocks(self, input_ids: torch.LongTensor, room: int) -> DraftedRun:
        """Drafts up to `room` tokens, one block at a time, until the head stops the round.

        After each full block the head scores the round so far; drafting stops when its pass score falls below the
        threshold. The block it rejected is still sent: stopping only ends drafting, so whether a block is drafted
        depends only on tokens drafted before it (a stopping time), which keeps speculative sampling exact.
        """
        hidden, scores, features = [], [], []  # per drafted token: [1, H], [1, V]; per head call: [1, block, F]
        tokens = input_ids[:, :0]  # [1, 0]
        end = "source"
        for step in self._draft_steps(input_ids, room):
            tokens = torch.cat([tokens, step.token], dim=-1)  # [1, i]
            hidden.append(step.hidden)
            scores.append(step.scores)
            if self._eos is not None and bool(torch.isin(step.token, self._eos).any()):
                end = "eos"  # the target stops there too
            elif tokens.shape[1] == room:
                end = "limit"
            elif self.stop_rule.asks_head(tokens.shape[1]) and self._head_says_stop(hidden, scores, tokens, features):
                end = "head"
            else:
                continue
            break
        return DraftedRun(tokens, torch.stack(scores, dim=1) if scores else None, end)  # [1, k], [1, k, V]

    def _draft_steps(self, input_ids: torch.LongTensor, room: int) -> Iterator[DraftStep]:
        """The draft's tokens after `input_ids`, one forward each, for as long as the caller asks (at most `room`)."""
        ids = input_ids  # [1, L + i]
        for _ in range(room):
            start = time.perf_counter()
            logits, hidden = self.draft.forward(ids, [])  # [1, 1, V], [1, 1, H]
            step = self._select(ids, logits[:, 0], hidden[:, 0])
            self.stats.draft_time_s += time.perf_counter() - start
            ids = torch.cat([ids, step.token], dim=-1)
            yield step

    def _select(self, ids: torch.LongTensor, logits: torch.Tensor, hidden: torch.Tensor) -> DraftStep:
        """The draft's token after `ids` from its raw logits `[1, V]`, exactly as transformers' decoding picks it:
        argmax or a sample of the processed q (the target's logits processors, as for the target's p)."""
        scores = self._processors(ids, logits)  # [1, V]
        if self.do_sample:
            token = torch.multinomial(scores.softmax(dim=-1), num_samples=1)  # [1, 1]
        else:
            token = scores.argmax(dim=-1, keepdim=True)  # [1, 1]
        return DraftStep(token, hidden, scores)

    def _head_says_stop(self, hidden: list[torch.Tensor], scores: list[torch.Tensor], tokens: torch.LongTensor,
                        features: list[torch.Tensor]) -> bool:
        """Scores the round so far with the shared stop rule ([`StopRule`]) and says whether it stops."""
        start = time.perf_counter()
        block_size = self.config.block_size
        block_scores = torch.stack(scores[-block_size:], dim=1)  # [1, block, V]
        features.append(draft_distribution_features(block_scores, tokens[:, -block_size:]))  # [1, block, F]
        # [1, k, H] and [1, k, F]: the whole round so far
        stop = bool(self.stop_rule.says_stop(torch.stack(hidden, dim=1), torch.cat(features, dim=1)))
        self.stats.head_calls += 1
        self.stats.head_time_s += time.perf_counter() - start
        return stop

    def _nothing(self, input_ids: torch.LongTensor, source: str) -> Candidates:
        """A round that sends no candidate: the target adds its own token."""
        return Candidates(input_ids[:, :0], None, 0, RoundRecord(source, 0, 0))

    def _one_hot(self, tokens: torch.LongTensor) -> torch.Tensor:
        """Logits `[1, e, V]` of the point mass on each of `tokens` `[1, e]`: 0 at the token, -inf elsewhere, so that
        speculative sampling accepts a token x with probability p(x) and resamples from p without x otherwise: the
        distribution a token sent without the draft was drawn from."""
        logits = torch.full((*tokens.shape, self.vocab_size), -math.inf, device=tokens.device)
        return logits.scatter_(-1, tokens.unsqueeze(-1), 0.0)

    # ---- stopping criteria and statistics -----------------------------------------------------------------

    def _sendable_length(self, input_ids: torch.LongTensor, candidates: torch.LongTensor) -> int:
        """How many of a round's `candidates` `[1, n]` may be sent: those before the first one that completes a text
        the call's stopping criteria end on.

        transformers checks the criteria once per round, after appending every accepted token, so a stop inside an
        accepted run would come too late (and stock assisted generation runs past it). Here every candidate prefix is
        checked before it is sent; the token that would end the text is left to the target, which then produces it
        as its own token of the round, after which transformers' check stops the call. The cut depends only on the
        candidates, never on the verification: the round length stays a stopping time.
        """
        for j in range(candidates.shape[1] if self._stopping_criteria else 0):
            prefix = torch.cat([input_ids, candidates[:, : j + 1]], dim=-1).to(self._criteria_device)  # [1, L + j + 1]
            if bool(self._stopping_criteria(prefix, self._criteria_scores).any()):
                return j
        return candidates.shape[1]

    def _record_round(self, candidates: Candidates, forwards: int) -> None:
        self.stats.draft_vocab = self.draft.vocab_limit
        self.stats.draft_lengths.append(candidates.drafted)
        self.stats.draft_forwards.append(forwards)
        self.stats.copied_lengths.append(candidates.tokens.shape[1] - candidates.drafted)
        self.stats.head_stops += int(candidates.record.end == "head")
        self.stats.plans.append(candidates.record)
        self._round = candidates
        self._round_end = time.perf_counter()


class _ScoresOfCandidates:
    """Stands for `scores` when a stopping criterion is asked about a candidate prefix under `output_scores=True`:
    the target has not scored a candidate yet, so a criterion that reads `scores` cannot be honoured exactly."""

    def _refuse(self, *args, **kwargs):
        raise ValueError(
            "A stopping criterion of this `generate(..., pacer_head=...)` call reads `scores`. pacer-hf checks the "
            "stopping criteria on every candidate token before the target scores it (so that a stop inside an "
            "accepted run is honoured exactly), and cannot give such a criterion the target's scores. Use a "
            "criterion that reads only `input_ids`, or call `generate()` without `pacer_head`."
        )

    __getitem__ = __iter__ = __len__ = __bool__ = _refuse

    def __getattr__(self, name: str):
        if name.startswith("__"):  # protocol look-ups (copy, pickle) are not reads of the scores
            raise AttributeError(name)
        self._refuse()
