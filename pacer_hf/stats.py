"""`PacerStats`: what one `generate()` call with a PACER head did, round by round."""

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class RoundRecord:
    """One round: what was sent, why, what the planner expected and what the target accepted.

    Args:
        kind (`str`): `"draft"` (the draft, stopped by the head, possibly with a copied tail), `"copy"` (copied
            tokens, no draft), `"step"` (nothing sent: a plain target step the planner chose) or `"limit"` (nothing:
            the length limit left no room).
        sent (`int`): candidate tokens sent to the target.
        drafted (`int`): of those, tokens the draft drew (the rest were copied, with one-hot rows).
        expected (`float`, *optional*): the new tokens the planner expected the round to add, a draft round's with its
            copied tail's expected accepted tokens (`None` without a planner).
        accepted (`int`, *optional*): candidates the target accepted (set once it has verified them).
        end (`str`, *optional*): why drafting ended: `"head"`, `"limit"`, `"eos"` or `"source"` (a whole phrase
            confirmed); in a plain step, `"probe"` where it was taken to re-time the step (none timed in
            `STEP_RETIME_S` seconds of target calls), not as the best option.
        copied_from (`str`, *optional*): the look-up that proposed the copied tokens (`"sequence"`, `"earliest"`,
            `"stored"`).
        rates (`dict[str, float]`, *optional*): the expected new tokens per second of each option the planner weighed
            for this round (`"step"`, `"copy"`: the best copy, `"draft"`: without its catch-up, which the rest of the
            call must repay).
        seconds (`float`, *optional*): the round's wall time, from choosing its candidates to learning from its
            verification (set once verified).
    """

    kind: str
    sent: int
    drafted: int
    expected: float | None = None
    accepted: int | None = None
    end: str | None = None
    copied_from: str | None = None
    rates: dict[str, float] | None = None
    seconds: float | None = None


@dataclass
class PacerStats:
    """Per-call drafting statistics, filled by [`PacerCandidateGenerator`]: pass a fresh one as
    `generate(..., pacer_stats=PacerStats())` and read it after the call (each call fills its own, so threads that
    share a head stay apart).

    A round is one target verification: it sends `draft_lengths[i]` drafted tokens and `copied_lengths[i]` copied
    ones, the target accepts `accepted_lengths[i]` of them and adds one token of its own (unless EOS or the length
    limit cut it). `plans[i]` says what the round was and why.

    Args:
        draft_lengths (`list[int]`): drafted tokens per round.
        accepted_lengths (`list[int]`): accepted candidates per round (after EOS/length clipping).
        copied_lengths (`list[int]`): tokens sent without the draft per round (copies and tails, phrase drafting).
        plans (`list[RoundRecord]`): each round's kind, sizes, the planner's expectation and the outcome.
        head_calls (`int`): calls of the head (one per full block that was not the last allowed one).
        head_stops (`int`): rounds that the head ended before `max_draft`.
        draft_time_s (`float`): seconds in draft forwards and token selection.
        head_time_s (`float`): seconds in feature computation and head calls.
        target_time_s (`float`): seconds between handing candidates to transformers and getting the verdict
            back (target forward and verification).
        total_time_s (`float`): wall time of the whole `generate()` call.
        draft_forwards (`list[int]`): draft forwards per round; below `draft_lengths` when phrases were confirmed.
        phrase_tokens_offered (`int`): phrase tokens fed to the draft for confirmation (phrase drafting).
        phrase_tokens_confirmed (`int`): of those, the tokens the draft chose itself and drafted on from, each
            saving a draft forward (so drafted tokens = draft forwards + confirmed tokens).
        draft_vocab (`int`, *optional*): the draft scored ids below this and the sequence's ids (`pacer_draft_vocab`);
            None: its whole vocabulary.
    """

    draft_lengths: list[int] = field(default_factory=list)
    accepted_lengths: list[int] = field(default_factory=list)
    copied_lengths: list[int] = field(default_factory=list)
    plans: list[RoundRecord] = field(default_factory=list)
    head_calls: int = 0
    head_stops: int = 0
    draft_time_s: float = 0.0
    head_time_s: float = 0.0
    target_time_s: float = 0.0
    total_time_s: float = 0.0
    draft_forwards: list[int] = field(default_factory=list)
    phrase_tokens_offered: int = 0
    phrase_tokens_confirmed: int = 0
    draft_vocab: int | None = None

    @property
    def rounds(self) -> int:
        return len(self.accepted_lengths)

    @property
    def drafted_tokens(self) -> int:
        """Tokens the draft drew and sent."""
        return sum(self.draft_lengths)

    @property
    def candidate_tokens(self) -> int:
        """Candidate tokens sent to the target: drafted and copied."""
        return sum(self.draft_lengths) + sum(self.copied_lengths)

    @property
    def copied_tokens_accepted(self) -> int:
        """Copied tokens the target accepted (those after each round's drafted ones)."""
        return sum(max(0, a - d) for a, d in zip(self.accepted_lengths, self.draft_lengths))

    @property
    def tokens_per_draft_forward(self) -> float:
        """Draft tokens per draft forward: 1 without phrases, more where the draft confirmed phrase tokens."""
        forwards = sum(self.draft_forwards)
        return sum(self.draft_lengths) / forwards if forwards else 0.0

    @property
    def accepted_tokens(self) -> int:
        return sum(self.accepted_lengths)

    @property
    def new_tokens(self) -> int:
        """Tokens added to the output: the accepted candidates plus the target's own token of each round."""
        return self.accepted_tokens + self.rounds

    @property
    def tokens_per_target_call(self) -> float:
        """Mean tokens added per target verification (tau)."""
        return self.new_tokens / self.rounds if self.rounds else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted candidates per candidate sent."""
        return self.accepted_tokens / self.candidate_tokens if self.candidate_tokens else 0.0

    @property
    def candidates_per_accepted(self) -> float:
        """Candidate tokens sent per accepted one (1 is no waste)."""
        return self.candidate_tokens / self.accepted_tokens if self.accepted_tokens else float("inf")

    @property
    def draft_length_histogram(self) -> dict[int, int]:
        """Number of rounds per draft length."""
        return dict(sorted(Counter(self.draft_lengths).items()))

    @property
    def round_kinds(self) -> dict[str, int]:
        """Number of rounds of each kind (`"draft"`, `"copy"`, `"step"`, `"limit"`)."""
        return dict(sorted(Counter(plan.kind for plan in self.plans).items()))

    def summary(self) -> str:
        kinds = self.round_kinds
        planned = (
            f"round kinds={kinds} copied accepted/sent={self.copied_tokens_accepted}/{sum(self.copied_lengths)} "
            f"phrase tokens confirmed/offered={self.phrase_tokens_confirmed}/{self.phrase_tokens_offered} "
            if set(kinds) - {"draft"} or self.phrase_tokens_offered else ""
        )
        return (
            f"rounds={self.rounds} candidates={self.candidate_tokens} accepted={self.accepted_tokens} "
            f"(rate {self.acceptance_rate:.2f}, {self.tokens_per_target_call:.2f} tokens/target call) "
            f"head calls={self.head_calls} head stops={self.head_stops} "
            f"draft lengths={self.draft_length_histogram} {planned}"
            f"{'' if self.draft_vocab is None else f'draft vocabulary=ids<{self.draft_vocab}+text '}"
            f"time draft/head/target/total={self.draft_time_s:.3f}/{self.head_time_s:.3f}/"
            f"{self.target_time_s:.3f}/{self.total_time_s:.3f}s"
        )
