"""`PhraseCandidateGenerator`: PACER's blockwise loop with sources composed around it, chosen round by round.

Around the paper's draft-and-stop loop ([`PacerCandidateGenerator._draft_blocks`], untouched) this generator adds,
through the loop's two seams:
- `_propose`: a [`RoundPlanner`] picks each round's candidates: a copy from the sequence without the draft, the
  draft (stopped by the head) and then perhaps a copied tail, or a plain target step;
- `_draft_steps`: phrase confirmation (Ouroboros, arXiv 2402.13720): each draft forward also feeds a looked-up
  phrase (as many of its tokens as the planner finds worth feeding), and the draft moves on to the phrase's next token
  only while its own choice equals it, so one forward yields 1 to m + 1 tokens, each drawn from the draft's own q on
  the right prefix;
- `update_candidate_strategy`: the planner learns the round's costs and acceptance, and the pool stores what a
  rejected round teaches (the target's tokens on the rejected branch).

Exactness: a copied token's candidate row is one-hot (the distribution it was drawn from), a drafted token's is the
draft's processed q, and every decision reads only earlier rounds and this round's drafted tokens, so the round length
stays a stopping time.
"""

import time
from collections.abc import Iterator

import torch

from .candidate_generator import Candidates, DraftStep, PacerCandidateGenerator
from .phrases import NO_PHRASE, Phrase, PhrasePool
from .planner import MAX_COPY_TOKENS, CallCosts, RoundPlanner
from .stats import RoundRecord


class PhraseCandidateGenerator(PacerCandidateGenerator):
    """A [`PacerCandidateGenerator`] whose rounds a [`RoundPlanner`] composes from copies, the head-stopped draft with
    phrase confirmation, copied tails and plain steps. Built by `generate(..., pacer_phrases=True)` (or a
    `PhrasePool`).

    Args:
        phrases (`PhrasePool`): the pool (indexed with this call's sequence; its stored phrases kept across calls).
        costs (`CallCosts`, *optional*): the pair's cost estimate, shared by the calls of one process
            (`pacer_hf.planner.costs_for`); a fresh one by default.
        *args, **kwargs: those of [`PacerCandidateGenerator`].
    """

    # What plans the rounds: any callable `(costs, max_new_tokens) -> RoundPlanner` (tests script the planner's
    # choices with one).
    planner_class = RoundPlanner

    def __init__(self, *args, phrases: PhrasePool, costs: CallCosts | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        input_ids = args[0] if args else kwargs["input_ids"]
        self.phrases = phrases
        phrases.start_sequence(input_ids[0].tolist())
        self.planner = self.planner_class(costs if costs is not None else CallCosts(),
                                          self.main_model_max_length - input_ids.shape[1])
        self._draft_started = False
        self._round_start = 0.0
        self._round_length = 0  # tokens in the sequence when the round in flight was proposed
        self._tail: Phrase = NO_PHRASE  # the look-up of the copied tokens of the round in flight
        self._draft_s = 0.0  # seconds the round in flight spent drafting, without its catch-up
        self._weighed: tuple[Phrase, int] | None = None  # the round in flight's best copy weighed, sent or not

    # ---- what a round sends -------------------------------------------------------------------------------

    def get_candidates(self, input_ids: torch.LongTensor, *args, **kwargs) -> tuple[torch.LongTensor, torch.Tensor | None]:
        # Every round starts here, also the last one, which the length limit leaves no room to plan (`"limit"`): timed
        # from `_propose`, it would be learnt as lasting from the round before's start and adding both rounds' tokens.
        self._round_start, self._round_length = time.perf_counter(), input_ids.shape[1]
        self._weighed = None  # a round the limit leaves unplanned weighed no copy
        return super().get_candidates(input_ids, *args, **kwargs)

    def _propose(self, input_ids: torch.LongTensor, room: int, draft_room: int) -> Candidates:
        self.phrases.extend(input_ids[0, self.phrases.sequence_length :].tolist())
        options = self.phrases.copy_options(input_ids[0].tolist(), MAX_COPY_TOKENS)
        plan = self.planner.plan(options, room, draft_room, self.draft.missing(input_ids), self._draft_started)
        self._weighed = plan.weighed
        if plan.kind == "step":
            self._tail = NO_PHRASE
            candidates = self._nothing(input_ids, "step")
            candidates.record.end = "probe" if plan.probe else None
            candidates.record.expected = plan.expected
        elif plan.kind == "copy":
            self._tail = plan.copy
            copied = self._cut_after_eos(plan.copy.tokens[: plan.length])
            record = RoundRecord("copy", 0, 0, expected=plan.expected, copied_from=plan.copy.source)
            candidates = self._copied(input_ids[:, :0], None, copied, record)
        else:
            candidates = self._draft_then_tail(input_ids, room, draft_room, plan.expected)
        candidates.record.rates = plan.rates
        return candidates

    def _draft_then_tail(self, input_ids: torch.LongTensor, room: int, draft_room: int,
                         expected: float) -> Candidates:
        """The head-stopped draft, then the copied tail the planner finds worth sending after it; the round's record
        expects the planned draft round's `expected` new tokens and the tail's expected accepted ones."""
        first, self._draft_started = not self._draft_started, True
        start, missing = time.perf_counter(), self.draft.missing(input_ids)
        run = self._draft_blocks(input_ids, draft_room)
        self._draft_s = self._drafting_seconds(time.perf_counter() - start, missing, first)
        drafted = run.tokens.shape[1]
        record = RoundRecord("draft", drafted, drafted, expected=expected, end=run.end)
        self._tail, tail = NO_PHRASE, []
        if run.end != "eos" and room > drafted:
            phrase = self.phrases.lookup(torch.cat([input_ids, run.tokens], dim=-1)[0].tolist(), MAX_COPY_TOKENS)
            length, tail_expected = self.planner.tail_length(phrase if phrase.tokens else None, room - drafted,
                                                             run.end, drafted)
            if length:
                self._tail, tail = phrase, self._cut_after_eos(phrase.tokens[:length])
                record.copied_from, record.expected = phrase.source, expected + tail_expected
        return self._copied(run.tokens, run.scores, tail, record)

    def _drafting_seconds(self, wall_s: float, missing: int, first: bool) -> float:
        """What drafting a round costs without its catch-up: its wall time with the first forward, which also fed the
        `missing` tokens the draft had not seen (the whole prompt the first time, `first`, with one-off set-up costs),
        priced as the costs say a forward of its other tokens costs. The round's forwards are learnt by the costs
        here."""
        timings = self.draft.take_timings()  # [(tokens fed, seconds)] of this round's forwards
        for i, (fed, seconds) in enumerate(timings):
            self.planner.costs.observe_forward(fed, seconds, first=first and i == 0)
        if not timings:
            return wall_s
        fed, seconds = timings[0]
        return max(wall_s - seconds + self.planner.costs.draft(max(fed - missing, 1)), 0.0)

    def _copied(self, tokens: torch.LongTensor, scores: torch.Tensor | None, copied: list[int],
                record: RoundRecord) -> Candidates:
        """`tokens` `[1, k]` (drafted, with their rows `[1, k, V]`) followed by `copied` tokens with one-hot rows."""
        drafted = tokens.shape[1]
        if copied:
            copied_ids = tokens.new_tensor([copied])  # [1, e]
            rows = self._one_hot(copied_ids)  # [1, e, V]
            tokens = torch.cat([tokens, copied_ids], dim=-1)  # [1, k + e]
            scores = rows if scores is None else torch.cat([scores, rows], dim=1)  # [1, k + e, V]
        record.sent = tokens.shape[1]
        return Candidates(tokens, scores, drafted, record)

    def _cut_after_eos(self, tokens: list[int]) -> list[int]:
        """`tokens` up to and including the first EOS: the target stops there."""
        eos = set(self._eos.tolist()) if self._eos is not None else set()
        for i, token in enumerate(tokens):
            if token in eos:
                return tokens[: i + 1]
        return tokens

    # ---- where the draft's tokens come from: phrase confirmation -------------------------------------------

    def _draft_steps(self, input_ids: torch.LongTensor, room: int) -> Iterator[DraftStep]:
        """The draft's tokens, each forward feeding a looked-up phrase of m tokens beside the draft's input (m from
        [`RoundPlanner.confirm_length`], which weighs the call's confirmations so far against what a fed token adds
        to a forward): the draft picks its token at each fed position exactly as it would alone, and moves on to the
        next position only while its token equals the phrase's. Ends early when the draft confirmed a whole phrase:
        the text is being copied, and the planner may send a tail after the drafted tokens."""
        ids, produced = input_ids, 0  # [1, L + i]
        while produced < room:
            start = time.perf_counter()
            offer = self.planner.confirm_length(min(room - produced - 1, self.phrases.phrase_length))
            phrase = self.phrases.lookup(ids[0].tolist(), offer).tokens if offer else []
            self.stats.phrase_tokens_offered += len(phrase)
            logits, hidden = self.draft.forward(ids, phrase)  # [1, m + 1, V], [1, m + 1, H]
            reached = confirmed = 0  # phrase positions the draft chose a token at, and its run of the phrase's
            try:
                for j in range(len(phrase) + 1):
                    if j:  # phrase token j - 1 was confirmed: this position's logits saw the right prefix
                        start = time.perf_counter()
                        self.stats.phrase_tokens_confirmed += 1
                    step = self._select(ids, logits[:, j], hidden[:, j])
                    self.stats.draft_time_s += time.perf_counter() - start
                    ids, produced = torch.cat([ids, step.token], dim=-1), produced + 1
                    matched = j < len(phrase) and int(step.token) == phrase[j]
                    reached, confirmed = reached + (j < len(phrase)), confirmed + matched
                    yield step
                    if j < len(phrase) and not matched:
                        break  # the later fed positions saw the phrase's token, not the draft's: next forward
                else:
                    if phrase and len(phrase) == self.phrases.phrase_length:
                        return
            finally:  # also when the head stops the draft inside the phrase
                self.planner.confirmations.observe(reached, confirmed)

    # ---- what a round teaches -----------------------------------------------------------------------------

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int) -> None:
        target_s = time.perf_counter() - self._round_end
        super().update_candidate_strategy(input_ids, scores, num_matches)
        record, accepted = self._round.record, int(num_matches)
        planner = self.planner
        record.seconds = time.perf_counter() - self._round_start
        if self.stats.rounds > 1:  # the first round's target call also prefilled the prompt: not a round's cost
            planner.observe_round(input_ids.shape[1] - self._round_length, record.seconds)
            planner.costs.observe_round(record.sent, target_s)
        else:
            planner.costs.observe_prefill(self._round_length + record.sent, target_s)
            planner.observe_first_round()
        if record.kind == "draft":
            planner.drafts.observe(record.drafted, accepted, self._draft_s, record.end)
        else:
            planner.drafts.forget()
        copied = record.sent - record.drafted
        if copied and accepted >= record.drafted:  # the copied tokens were reached
            planner.copies.observe(self._tail, copied, accepted - record.drafted)
        elif not copied and self._weighed is not None:
            planner.copies.observe_unsent(*self._weighed, input_ids[0, self._round_length :].tolist())
        self._learn_phrases(input_ids, scores, accepted)

    def _learn_phrases(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int) -> None:
        """Stores what a rejected round teaches (Ouroboros): the target's own tokens after the rejected candidate,
        and the rejected candidates after the target's correction (often right, one token late).

        `scores` `[1, n + 1, V]`: the target's processed logits at each candidate position of the round.
        """
        candidates = self._round.tokens[0].tolist()  # n tokens
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
