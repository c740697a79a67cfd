"""`PacerStats`: what one `generate()` call with a PACER head did, round by round."""

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class PacerStats:
    """Per-call drafting statistics, filled by [`PacerCandidateGenerator`]: pass a fresh one as
    `generate(..., pacer_stats=PacerStats())` and read it after the call (safe when calls overlap), or read
    `pacer_head.last_stats`, the latest call's.

    A round is one target verification: the draft proposes `draft_lengths[i]` tokens, the target accepts
    `accepted_lengths[i]` of them and adds one token of its own (unless EOS or the length limit cut it).

    Args:
        draft_lengths (`list[int]`): drafted tokens per round.
        accepted_lengths (`list[int]`): accepted draft tokens per round (after EOS/length clipping).
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
        tail_lengths (`list[int]`): phrase tokens appended without the draft, per round (phrase drafting).
        tail_tokens_accepted (`int`): of those, the tokens the target accepted.
    """

    draft_lengths: list[int] = field(default_factory=list)
    accepted_lengths: list[int] = field(default_factory=list)
    head_calls: int = 0
    head_stops: int = 0
    draft_time_s: float = 0.0
    head_time_s: float = 0.0
    target_time_s: float = 0.0
    total_time_s: float = 0.0
    draft_forwards: list[int] = field(default_factory=list)
    phrase_tokens_offered: int = 0
    phrase_tokens_confirmed: int = 0
    tail_lengths: list[int] = field(default_factory=list)
    tail_tokens_accepted: int = 0

    @property
    def rounds(self) -> int:
        return len(self.accepted_lengths)

    @property
    def drafted_tokens(self) -> int:
        """Candidate tokens sent to the target: drafted ones and any phrase tail."""
        return sum(self.draft_lengths) + sum(self.tail_lengths)

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
        """Tokens added to the output: the accepted drafts plus the target's own token of each round."""
        return self.accepted_tokens + self.rounds

    @property
    def tokens_per_target_call(self) -> float:
        """Mean tokens added per target verification (tau)."""
        return self.new_tokens / self.rounds if self.rounds else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def drafted_per_accepted(self) -> float:
        return self.drafted_tokens / self.accepted_tokens if self.accepted_tokens else float("inf")

    @property
    def draft_length_histogram(self) -> dict[int, int]:
        """Number of rounds per draft length."""
        return dict(sorted(Counter(self.draft_lengths).items()))

    def summary(self) -> str:
        phrases = (
            f"phrase tokens confirmed/offered={self.phrase_tokens_confirmed}/{self.phrase_tokens_offered} "
            f"({self.tokens_per_draft_forward:.2f} tokens/draft forward) "
            f"tail accepted/offered={self.tail_tokens_accepted}/{sum(self.tail_lengths)} "
            if self.phrase_tokens_offered or self.tail_lengths else ""
        )
        return (
            f"rounds={self.rounds} drafted={self.drafted_tokens} accepted={self.accepted_tokens} "
            f"(rate {self.acceptance_rate:.2f}, {self.tokens_per_target_call:.2f} tokens/target call) "
            f"head calls={self.head_calls} head stops={self.head_stops} "
            f"draft lengths={self.draft_length_histogram} {phrases}"
            f"time draft/head/target/total={self.draft_time_s:.3f}/{self.head_time_s:.3f}/"
            f"{self.target_time_s:.3f}/{self.total_time_s:.3f}s"
        )
