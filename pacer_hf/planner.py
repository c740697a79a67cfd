"""`RoundPlanner`: what each round sends, chosen by expected new tokens per second under this call's measured costs.

A round can send
- a **copy**: tokens read from the sequence (or a stored phrase) after the context's match, without the draft, as
  transformers' prompt lookup does;
- the **draft**, stopped by the head (with phrase confirmation), optionally followed by a copied **tail**;
- nothing: a plain **step** of the target.

Each option's value is its expected new tokens (1 for the target's own token plus the expected accepted candidates)
per expected second, and the planner picks the best. Candidate length follows the same rule: a copied token i is sent
only while its probability of being accepted, P(all before it accepted and it), is worth its verification time at the
call's current rate: P_i >= rate * the seconds that candidate adds to the verification.

Its inputs are this call's own history, never this round's verification, so every round's length stays a stopping
time and the output stays exactly the target's:
- costs ([`CallCosts`]): seconds of a plain target step, of a target call that verifies n candidates, of a draft
  forward that feeds n tokens (small n, and the per-token rate of long catch-ups), fitted online from timed rounds on
  top of priors, and remembered for the pair across the calls of a process ([`costs_for`]);
- acceptance ([`CopyAcceptance`], [`DraftAcceptance`]): how copies of each source and match length, and the draft's
  recent rounds (tokens, seconds, acceptance), fared so far in this call; copies start from the pair's previous call
  (`CARRIED_COPIES`).

Verification is priced apart from a plain step because machines differ there most: on a GPU, or a CPU with bfloat16
matrix units, verifying a few candidates costs about one step; on a CPU without them it costs about two.

The draft is lazy: it starts only when a round is worth drafting and the gain over the rest of the call repays the
forward that catches its cache up (the whole prompt the first time); a catch-up dearer than a plain step (a long
prompt) also waits until the call's first rounds have shown what copying and plain steps achieve, and must be repaid
twice over by the tokens the call is expected to add yet ([`RoundPlanner._repays`]). Rounds without the draft move
its estimates back towards the prior, so one poor draft round does not end drafting for the rest of a call.
"""

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

from .phrases import Phrase

# Priors in units of one plain target step (see `CallCosts`).
# Measured on 2-core CPUs with Qwen2.5-Coder 0.5B -> 1.5B (eval/results/costs-*): a draft forward costs 0.2-0.55 of a
# step, each token a long catch-up forward feeds about 1%; verification of n candidates 1.0-2.1 steps for a few, +2.5%
# per candidate.
PRIOR_STEP_S = 0.1  # seconds, until the first round is timed
PRIOR_VERIFY_BASE = 1.0
PRIOR_VERIFY_PER_TOKEN = 0.025
PRIOR_DRAFT = 0.4
PRIOR_DRAFT_PER_TOKEN = 0.1  # per extra token of a short forward (phrase confirmation feeds a few)
PRIOR_FEED_PER_TOKEN = 0.01  # per token of a long catch-up forward
# Per token of a call's first draft forward (the prompt, on a fresh cache), until one is timed: about 1.8% of a step on
# both CPUs measured, where the draft costs 0.27 and 0.88 of the target a prompt token (the bar's AMD EPYC, bfloat16
# prepacked: 5.5 ms a token against a 0.25-0.3 s step, the fit of eval.research.virtual_clock; an AMD EPYC with AVX2
# only, float32 prepacked: 5.5-6.1 ms a token for prompts of 200-600 tokens against a 0.34 s step). At the catch-up's
# 1% a fresh process priced its first start at about half its cost, and a long prompt's start was a cheaper bet than
# it was (rag 543 of eval/results/virtual-bar-summaries-rag; at 1.8% it waits and the bar's rag 60-65 is modelled at
# 1.01 of prompt lookup k10 against 0.975, eval/results/virtual-prefill-price-bar-summaries-rag). Where prompt tokens
# are nearly free (a GPU) the target's own prefill bounds it (`CallCosts.catch_up`).
PRIOR_PREFILL_PER_TOKEN = 0.018
# A forward that feeds more tokens than this is a catch-up, priced per token.
SHORT_FORWARD = 16
# Verifications of up to this many candidates (draft rounds, short copies) and longer ones (long copies) are fitted
# apart: on a CPU with bfloat16 matrix units or a GPU a verification costs about a step up to some tokens and grows
# after, and one line through both would price a short round by the long copies' slope. On the AMD EPYC of
# docs/benchmarks.md (1.5B target, bf16 prepacked, 1000-token cache) a forward of 1 to 10 tokens costs the same within
# noise and each token after about 4% of a step (eval/results/costs-qwen-bf16-prepack-long.md); a line through 1-16
# candidates prices the short ones at a slope they do not have, and cut copies that were free to send.
SHORT_VERIFY = 10
# Candidates that together add at most this share of a step to a verification are free: a copy sends them whatever
# its estimate says (the estimate's tail is the least certain part, and where text is copied, runs go on for tens of
# tokens). Where verification grows from the first candidate on (an AVX2 CPU: 2.5% a token) that is two or three.
# Likewise the phrase tokens a draft forward feeds for confirmation, as a share of that forward.
FREE_VERIFY = 0.05
# Weight of a prior, in observations; and the forgetting of old observations per new one (a shared machine's speed
# drifts, and the text's character changes within a call).
PRIOR_WEIGHT = 2.0
DECAY = 0.97
# Acceptance priors, per look-up and by how many context tokens matched where the copy came from (the longer the match,
# the likelier the text keeps copying): the probability that a copy's first token is accepted, and that each next one is
# once every one before it was (a copy that starts right tends to go on; the prior of every position). The median over
# nine kinds of text (tuning prompts of summaries, rag, qa, translation, math, writing, extraction, code, chat), decoded
# in rounds by `python -m eval.research.copy_priors` (eval/results/copy-priors-tuning.md), made monotone in the match
# length: the median, not the pooled rate, which the texts that copy most would set, and for the next tokens below even
# that (on open text a copy that starts right mostly stops after a token or two; where text is copied, one accepted copy
# teaches a call tens of next tokens). Their weight, in copies that reached a position, is small: the call's own copies,
# pooled over every look-up and match length, soon outweigh them.
MATCH_BUCKETS = (1, 2, 3, 5, 9, 17)  # a match of at least this many tokens
COPY_POSITIONS = (2, 3, 4, 6, 9, 17, 33)  # a copied token's position, learnt apart from these on (the first: 1)
COPY_PRIOR = {
    "sequence": ((0.34, 0.50), (0.45, 0.60), (0.55, 0.70), (0.60, 0.80), (0.75, 0.88), (0.90, 0.95)),
    "earliest": ((0.25, 0.45), (0.50, 0.55), (0.55, 0.65), (0.60, 0.75), (0.65, 0.85), (0.75, 0.90)),
    # not measurable offline (the target's tokens on rejected branches, earlier calls' text): held below the live
    # sequence's, since a stored phrase is older news than the text it was stored from
    "stored": ((0.20, 0.40), (0.25, 0.45), (0.30, 0.50), (0.35, 0.60), (0.40, 0.70), (0.50, 0.80)),
}
COPY_PRIOR_WEIGHT = 3.0
# The chosen copies' expected accepted tokens run ahead of what they get on text that does not copy (qa, translation,
# chat: 25-50% in rate, eval/results/planner-ab-adjacent-step): each is the best of several options priced by estimates
# that start from the priors, and a short answer has too few copies to pull those down. So the call also compares, over
# its copies, the tokens the estimates promised with the tokens accepted, and scales a copy's first-token probability by
# that ratio (at most 1), starting from this many tokens of agreement.
CALIBRATION_PRIOR_TOKENS = 2.0
# A call starts from the copies of the pair's previous call in this process, as the costs do ([`costs_for`]): a short
# answer has one to three copies, too few for its own evidence to pull the priors (medians over nine kinds of text)
# down where its text does not copy. On the Intel bar v7 the planned calls that drafted (open text) had a copy's first
# token accepted 11% (ShareGPT), 17% (translation), 20% (qa) and 22% (writing) of the time against priors of 25-90%:
# translation's six calls sent 12 copies for 2 accepted tokens, each a target call that a draft round would have
# used. The previous call's counts are carried scaled down to at most this many copies (or tokens that reached a
# position) a cell, the weight of the priors, so that a process whose text changes kind learns the new one from a
# call's first few copies, while the previous call's kind of text, not the median's, is where a call starts.
CARRIED_COPIES = COPY_PRIOR_WEIGHT
# The draft's prior round: 3 tokens drafted in 3 forwards, 2.4 of them accepted, about what the entropy stop's rounds
# achieved on the tuning prompts of every kind (accepted / drafted 0.6-0.9, median 0.85: chat 2.7 of 2.9, qa 2.3 of
# 2.7, writing 2.2 of 2.6; eval/results/planner-tuning-qwen-bf16-prepack.md). Optimistic on purpose: a call tries the
# draft where it could pay and learns from its first rounds, while a pessimistic prior is never corrected (a call that
# never drafts never learns that it should). Then the share of rounds whose every drafted token is accepted, by why
# drafting ended (a head stop predicts a rejection; a whole confirmed phrase that the text is being copied); and how
# many recent rounds the running means follow.
DRAFT_PRIOR_TOKENS, DRAFT_PRIOR_FORWARDS, DRAFT_PRIOR_ACCEPTED = 3.0, 3.0, 2.4
ALL_ACCEPTED_PRIOR = {"head": 0.2, "limit": 0.4, "source": 0.5, "eos": 0.5}
RECENT_ROUNDS = 8
# How many rounds the prior round weighs in the running means. Open text drafts rounds of 1 to 16 tokens whose accepted
# share swings from none to all (the entropy stop on qa 342 of the Intel bar: 1, 2, 9, 1, 8, 1, ... tokens), so one
# round says little. Weighed as one, qa 342's third draft round (8 drafted, 1 accepted, after two rounds of 1 token)
# cut the estimate's accepted share from 0.8 to 0.34, the draft fell under a plain step's rate by the margin, and the
# call stepped (13 plain steps, 30 target calls against the entropy stop's 19). So the means follow about
# `RECENT_ROUNDS + DRAFT_PRIOR_ROUNDS` rounds: past the first `RECENT_ROUNDS`, each round moves them by 1/11. In the
# seconds a drafted token takes, the prior (the costs' draft forward) keeps that weight for good: 3 of at most 11.
DRAFT_PRIOR_ROUNDS = 3
# Each round that does not draft moves the draft's estimates this far back towards the prior (its acceptance in the
# call, `DraftAcceptance.forget`, and its forward's price in the process, `CallCosts._forget_draft`): a call that
# stopped drafting after a few poor rounds (or one slow one) tries again after some rounds instead of never, since
# rounds that do not draft teach it nothing about the draft.
DRAFT_FORGET = 0.1
# A plain step is re-timed by every round that steps, a draft forward only by rounds that draft and a verification only
# by rounds that send candidates; and the costs outlive a call. So the step's estimate is the unit of every other cost:
# a draft forward or a verification is learnt as a multiple of a step timed near it (`RATIO_CLIP`), and priced at the
# step's estimate now, keeping what it taught of this machine (a cost as a multiple of a step). A draft timed while a
# shared machine ran 2x slow would otherwise stay overpriced against the fast steps timed later, and a call that steps
# runs no round that would correct it (one of two faults behind the ten calls of eval/results/planner-bar-amd-v2 that
# drafted once or twice and then stepped to the end; the other, the price of a catch-up, is in `CallCosts`). The step
# forgets fast (`STEP_DECAY`, about the last three), so that it is the machine's speed now: with `DECAY` a disturbed
# demo's third call, undisturbed, entered at 1.09 s a step where steps took 0.30 s and still priced them at 0.40 s after
# 40 (eval/results/demo-fp32-intel-hog-trace.txt). And since a cost timed in a call that never steps is taken as a
# multiple of the step as last timed, the planner takes a plain step (a probe) once the target calls since the last one
# took `STEP_RETIME_S` seconds: at most a step's time lost per 20 s of target calls (1-2% on a CPU). Not only where
# drafting is close to a step's rate: with the step stale the planner cannot tell how close it is (a demo whose only
# timed step was the cold first round priced drafting at 1.5-2.3 times a step's rate where it made 1.08x:
# eval/results/demo-fp32-amd-hog-trace-probe-below.txt).
STEP_DECAY = 0.7
STEP_RETIME_S = 20.0
# A shared machine's speed swings 2-3x within a call (a step took 0.13-0.39 s in calls of eval/results/
# planner-bar-intel), so a verification's ratio to a step is learnt only from two target calls timed one right after the
# other: a verification and a plain step, against that step; or two verifications of different lengths, the later
# against the earlier's price (a call that copies steps once or twice, and learnt only next to steps, a process's first
# summaries on the bar's AMD EPYC still priced a 64-token copy at about 2.5 steps where it took 4: the prior's 2.5% a
# candidate, not the machine's 5%; the A/B: eval/results/virtual-verify-shape-amd). A verification timed in a slow
# stretch and divided by a step's estimate from a fast one priced 3 candidates at 1.27-1.57 steps where a bare 4-token
# forward took 1.11 of a 1-token one, and drafting, 1.4 times a step's rate there, looked 1.2 and lost to plain steps by
# the margin. Every target call also times the machine: it is a step's estimate at the ratio learnt, so the step follows
# every target call, and a round's draft forwards are learnt against the step its own target call implies. A swing can
# still fall between the two calls of a pair (the step 2.5x the verification's): a ratio is learnt clipped to within
# this factor of its price now, so that one such pair moves a price by about 1% instead of 10%, and a true price far
# from the prior (a GPU's 64 candidates at 1.05 steps against the prior's 2.6) is still reached, a factor at a time.
RATIO_CLIP = 1.5
# How much faster than a plain step another option must be expected to be before the planner leaves the step, whose
# cost is measured while the option's acceptance is an estimate.
STEP_MARGIN = 0.1
# The margin a draft already running in the call must clear over a plain step. Smaller than `STEP_MARGIN`: a draft round
# corrects the draft's estimate (a step teaches nothing about the draft, and the estimate only drifts back to the prior,
# `DRAFT_FORGET`), and its catch-up after steps is a short forward. With `STEP_MARGIN` the planner stepped wherever
# drafting was under 1.1x a step's rate, where the entropy stop drafts on: on the Intel bar's open text (ShareGPT
# wNBG8Gp_0: 19 plain steps in a row with the draft expected at 1.03-1.09x a step; 15.2 s for the entropy stop, 17.9 s
# planned).
DRAFT_MARGIN = 0.03
# Most tokens one copy may send (the value rule usually stops earlier).
MAX_COPY_TOKENS = 64
# The lazy draft's first start is weighed against what the call's recent rounds achieved (their new tokens per second,
# older rounds forgotten at this factor per round, about the last three), and only once this many rounds ran and the
# call has spent at least the catch-up's time without the draft (ski rental: rent until the rent paid equals the
# price, then buy; never more than twice the better choice's time): the draft's prior is optimistic, and a text that
# copies well (a summary, code) must not pay the draft's catch-up of a long prompt before its first copies show it.
# The call's first round counts, as a step's rent: its target call also prefilled the prompt, so it is not timed as a
# round, but it added its token without the draft like any plain step. Uncounted, a prompt of 55-110 tokens (a
# catch-up of 1-2 steps: translation, short chat) stepped three times before drafting where two steps had paid the
# rent (translation 223 of eval/results/virtual-open-text-entropy: 5.9 s against the entropy stop's 5.4 s).
# A catch-up cheaper than one plain step is bought at once (ski rental where the price is below a day's rent): on short
# prompts (translation, extraction, qa) the answers are short too, and rounds without the draft are a large share there.
RECENT_RATE_DECAY = 0.7
ROUNDS_BEFORE_DRAFT = 2
# And such a dear start is bought only where the time its prior promises to save is this many times its price: the
# prior is optimistic on purpose (a call learns the draft from its first rounds), and a catch-up, once paid, is not
# taken back. At 2 the bet still breaks even if the prior holds on only half of the texts (it saves S - C where it
# holds, loses C where not: 0.5 (S - C) - 0.5 C >= 0 for S >= 2 C). At even odds summary 301 of
# eval/results/virtual-bar-summaries (640 prompt tokens, its copies at 1.5 times a step's rate, the prior's at 1.5 too)
# bought a catch-up the prior said would save 1.1 times its price, drafted one token and lost 4.0 s to prompt lookup's
# 18.8; on summaries 40-47 at the bar's modelled costs, 126.8 s against 135.3 s at even odds
# (eval/results/virtual-dear-odds-ab.md).
DEAR_START_ODDS = 2.0
# It is repaid over the tokens the call is expected to add yet, not over the rest of its budget: answers often end far
# before it (the bar's rag, qa, translation and extraction answers ran 11-109 tokens of 128, eval/results/
# planner-bar-amd-v2): rag 524 of eval/results/virtual-dear-odds-ab bought its 804-token prompt's catch-up on the
# budget's promise of 118 more tokens, 10 tokens before its answer ended at 23, and took 16.5 s against prompt lookup's
# 12.2 s (with this estimate 12.0 s, eval/results/virtual-answer-length-ab). Expected: as many as the call added
# so far (a call that went on for n tokens tends to go on for about as many more), at least this many, at most the
# budget's rest.
EXPECTED_ANSWER_TOKENS = 64
# Phrase confirmation: the probability that the draft's own choice confirms a looked-up phrase's first token, and each
# next one once every one before it was; weighed like the copy priors (`COPY_PRIOR_WEIGHT`). With about three tokens
# offered a forward it gives 0.2 confirmed a forward, 7% of those offered: the planned rounds of
# eval/results/planner-bar-amd-v2 confirmed 1.5-19% (median 5%) of the phrase tokens they offered, on every set.
CONFIRM_PRIOR = (0.1, 0.6)


class _Fit:
    """y = a + b * n, by least squares over recent observations (older ones forgotten at `decay` per new one) and two
    pseudo-observations of the `prior` line at `n0` and `n1`: weight `PRIOR_WEIGHT` together before any observation,
    fading as observations come in."""

    def __init__(self, n0: float, n1: float, prior: tuple[float, float], decay: float = DECAY):
        self.n0, self.n1 = n0, n1
        self.prior = prior
        self.decay = decay
        self.sums = [0.0] * 5  # w, w n, w n^2, w y, w n y

    def observe(self, n: float, y: float) -> None:
        self.sums = [self.decay * value for value in self.sums]
        for i, value in enumerate((1.0, n, n * n, y, n * y)):
            self.sums[i] += value

    def coefficients(self) -> tuple[float, float]:
        w, wn, wnn, wy, wny = self.sums
        a0, b0 = self.prior
        weight = PRIOR_WEIGHT / 2 / (1 + w)  # the prior's pseudo-observations fade as observations come in
        for n in (self.n0, self.n1):
            y = a0 + b0 * n
            w, wn, wnn = w + weight, wn + weight * n, wnn + weight * n * n
            wy, wny = wy + weight * y, wny + weight * n * y
        det = w * wnn - wn * wn
        b = max((w * wny - wn * wy) / det, 0.0) if det > 1e-12 else b0
        return max((wy - b * wn) / w, 1e-9), b

    def __call__(self, n: float) -> float:
        a, b = self.coefficients()
        return a + b * n

    def fade(self, share: float) -> None:
        """Moves the fit `share` of the way back towards its prior (the observations weigh that much less)."""
        self.sums = [(1 - share) * value for value in self.sums]


class _SlopeFit:
    """y = anchor + b * (n - n0) for n > n0, the anchor given at query time (the short line's value at n0, so that the
    two lines meet), b by least squares over recent observations (forgetting at `DECAY`) and a `prior` slope that
    counts as `PRIOR_WEIGHT` observations (at `n1` before any, then as far past the anchor as the average one), fading
    as observations come in."""

    def __init__(self, n0: float, n1: float, prior: float):
        self.n0, self.n1 = n0, n1
        self.prior = prior
        self.sums = [0.0] * 4  # w, w x, w x^2, w x y with x = n - n0

    def observe(self, n: float, y: float) -> None:
        x = n - self.n0
        self.sums = [DECAY * value for value in self.sums]
        for i, value in enumerate((1.0, x, x * x, x * y)):
            self.sums[i] += value

    def slope(self, anchor: float) -> float:
        w, wx, wxx, wxy = self.sums
        weight = PRIOR_WEIGHT / (1 + w)
        lever = wxx / w if w > 0 else (self.n1 - self.n0) ** 2  # the prior weighs as much as an average observation
        return max((wxy - anchor * wx + weight * lever * self.prior) / (wxx + weight * lever), 0.0)


class CallCosts:
    """The costs of one pair on this machine, in seconds, learnt online:
    - a plain target step (no candidates): `step()`;
    - a target call that verifies n >= 1 candidates: `target(n)` (a + b n up to `SHORT_VERIFY` candidates, then a
      slope of its own from there);
    - a draft forward that feeds n tokens: `draft(n)` (a + b (n - 1) for short forwards, per token beyond), and
      apart from these the draft's first forward of a call, on a fresh cache (the prompt): `catch_up(n, first=True)`,
      never above the target's prefill of as many tokens (`observe_prefill`, each call's first target call).

    The step is fitted in seconds, from plain steps and from every verification at the ratio learnt; every other cost
    in steps (see `STEP_DECAY`, `RATIO_CLIP`): a verification against a plain step timed right before or after it (or
    a verification of another length right before it, at that one's price); a draft forward against the step its
    round's target call implies; the priors are ratios to a step, and a query multiplies by the step's estimate now.
    Until a step is timed the first timed round sets the step's prior. One object per (target, draft) pair in a
    process ([`costs_for`]), so a call starts from what earlier calls measured.
    """

    def __init__(self) -> None:
        self._step = _Fit(0.0, 0.0, prior=(PRIOR_STEP_S, 0.0), decay=STEP_DECAY)  # seconds
        # the rest in steps
        self._verify = _Fit(1.0, SHORT_VERIFY, prior=(PRIOR_VERIFY_BASE, PRIOR_VERIFY_PER_TOKEN))
        self._verify_long = _SlopeFit(SHORT_VERIFY, 4.0 * SHORT_VERIFY, prior=PRIOR_VERIFY_PER_TOKEN)
        self._draft = _Fit(0.0, SHORT_FORWARD - 1.0, prior=(PRIOR_DRAFT, PRIOR_DRAFT_PER_TOKEN * PRIOR_DRAFT))
        # catch-ups after copies: tens of tokens
        self._feed = _Fit(SHORT_FORWARD, 4.0 * SHORT_FORWARD, prior=(PRIOR_DRAFT, PRIOR_FEED_PER_TOKEN))
        # A call's first draft forward is fitted apart from later catch-ups: on a fresh cache it costs more per token
        # (on an Intel Xeon without bfloat16 units, 21 ms a prompt token against 16 ms a token of a catch-up after
        # 500 cached ones, plus set-up), and a line through prompts of hundreds of tokens, extrapolated down to a
        # catch-up of 16-100 tokens after some copies or steps, priced it at 3.4 steps where it cost 0.5: once the
        # draft lagged 16 tokens, the rest of the call stepped.
        self._prefill = _Fit(1.0, 1024.0, prior=(PRIOR_DRAFT, PRIOR_PREFILL_PER_TOKEN))
        self._target_token_s: float | None = None  # seconds a token of the target's prefill of a prompt, once timed
        self._timed = False  # whether any target call was timed
        self.steps_timed = 0  # plain steps timed: until one is, the planner takes one to learn what a step costs
        self.seconds_since_step = 0.0  # of target calls since a plain step was last timed
        self._previous: tuple[int, float] | None = None  # the last target call of this call: (candidates, seconds)
        self._forwards: list[tuple[int, float, bool]] = []  # draft forwards not yet learnt: (fed tokens, s, first)

    def observe_round(self, candidates: int, seconds: float) -> None:
        """A target call that verified `candidates` took `seconds`."""
        if not self._timed:  # the first timing sets the unit of every prior
            prior = PRIOR_VERIFY_BASE + PRIOR_VERIFY_PER_TOKEN * candidates if candidates else 1.0
            self._step.prior = (seconds / prior, 0.0)
            self._timed = True
        if candidates == 0:
            self._step.observe(0, seconds)
            self.steps_timed += 1
            self.seconds_since_step = 0.0
            step_s = seconds
            if self._previous and self._previous[0]:  # a verification right before
                self._observe_ratio(self._previous[0], self._previous[1] / seconds)
        else:
            if self._previous and self._previous[0] != candidates:  # a step, or a verification of another length
                before, before_s = self._previous
                before_steps = self._verify_steps(before) if before else 1.0  # its price in steps
                self._observe_ratio(candidates, before_steps * seconds / before_s)
            step_s = seconds / self._verify_steps(candidates)  # the step this call implies, at the ratio learnt
            self._step.observe(0, step_s)
            self.seconds_since_step += seconds
        # The step's prior follows the step as it is now, not as the first timed round found it: that round is often
        # cold (a process's first call).
        self._step.prior = (self.step(), 0.0)
        self._previous = (candidates, seconds)
        if not self._forwards:
            self._forget_draft()
        self._observe_forwards(step_s)

    def _forget_draft(self) -> None:
        """A round without the draft (a copy, a plain step): the draft forward's fits move `DRAFT_FORGET` of the way
        back towards their priors, as the call's draft acceptance does (`DraftAcceptance.forget`). The fits are the
        process's: without this, one slow stretch of draft forwards (0.8-1.0 of a step against 0.45, the machine's
        noise) priced the draft above a step for every later call, which then never drafted and so never learnt
        otherwise (eval/results/prefill-share-ab: ShareGPT 1000-1001 took 31.4 s against 25.1 s)."""
        self._draft.fade(DRAFT_FORGET)
        self._feed.fade(DRAFT_FORGET)

    def _observe_ratio(self, candidates: int, steps: float) -> None:
        """A verification of `candidates` took `steps` of the step timed next to it: learnt, clipped to within
        `RATIO_CLIP` of its price now (a swing between the two calls would otherwise teach 2-3x at once)."""
        price = self._verify_steps(candidates)
        steps = min(max(steps, price / RATIO_CLIP), price * RATIO_CLIP)
        (self._verify if candidates <= SHORT_VERIFY else self._verify_long).observe(candidates, steps)

    def _observe_forwards(self, step_s: float) -> None:
        """Learns the draft forwards timed since the last target call as multiples of `step_s`, the step that call
        implies (a ratio learnt against the machine's speed of the moment, see `RATIO_CLIP`)."""
        for fed_tokens, seconds, first in self._forwards:
            steps = seconds / step_s
            if first:
                self._prefill.observe(fed_tokens, steps)
            elif fed_tokens > SHORT_FORWARD:
                self._feed.observe(fed_tokens, steps)
            else:
                self._draft.observe(fed_tokens - 1, steps)
        self._forwards = []

    def observe_forward(self, fed_tokens: int, seconds: float, first: bool = False) -> None:
        """A draft forward that fed `fed_tokens` took `seconds` (`first`: the call's first, on a fresh cache); learnt
        with the next target call, against the step that call implies."""
        self._forwards.append((fed_tokens, seconds, first))

    def observe_prefill(self, fed_tokens: int, seconds: float) -> None:
        """A call's first target call, which fed the prompt and the round's candidates (`fed_tokens`), took
        `seconds`."""
        self._target_token_s = seconds / max(fed_tokens, 1)
        self._observe_forwards(self.step())  # a prefill implies no step: the estimate is the nearest there is
        self._previous = None  # a new call: the last target call is not next to this one

    def step(self) -> float:
        return self._step(0)

    def target(self, candidates: int) -> float:
        """Seconds of a target call with `candidates` candidates (0: a plain step)."""
        if candidates <= 0:
            return self.step()
        return self._verify_steps(candidates) * self.step()

    def _verify_steps(self, candidates: int) -> float:
        """A verification of `candidates` >= 1, in steps."""
        if candidates <= SHORT_VERIFY:
            return self._verify(candidates)
        anchor = self._verify(SHORT_VERIFY)
        return anchor + self._verify_long.slope(anchor) * (candidates - SHORT_VERIFY)

    def free_candidates(self) -> int:
        """The most candidates (up to `SHORT_VERIFY`) whose verification costs at most `FREE_VERIFY` of a step more
        than one candidate's."""
        slope = self._verify.coefficients()[1]  # steps a candidate
        if slope <= 0:
            return SHORT_VERIFY
        return max(1, min(SHORT_VERIFY, 1 + int(FREE_VERIFY / slope + 1e-9)))  # the prior's 2.0 is not 1.999...

    def verify_marginal(self, candidates: int) -> float:
        """Seconds the `candidates`-th candidate adds to a verification of the ones before it: the slope of the line
        `target(n)` follows there (for the first, the short line's: what one candidate more costs, not the jump from a
        plain step)."""
        if candidates <= SHORT_VERIFY:
            return self._verify.coefficients()[1] * self.step()
        return self._verify_long.slope(self._verify(SHORT_VERIFY)) * self.step()

    def draft(self, fed_tokens: int = 1) -> float:
        """Seconds of a draft forward that feeds `fed_tokens`."""
        if fed_tokens > SHORT_FORWARD:
            return self._feed(fed_tokens) * self.step()
        return self._draft(fed_tokens - 1) * self.step()

    def draft_marginal(self) -> float:
        """Seconds one more token adds to a short draft forward (the slope of `draft(n)`)."""
        return self._draft.coefficients()[1] * self.step()

    def catch_up(self, missing: int, first: bool = False) -> float:
        """What feeding `missing` tokens the draft lacks adds to a round's first draft forward (`first`: the call's
        first forward, on a fresh cache, never priced above the target's prefill of as many tokens: a smaller model
        of the same kind is not dearer a prompt token, and where prompt tokens are nearly free, on a GPU, the price
        in steps measured on CPUs would make a long prompt's start look dear for no reason)."""
        if first:
            forward = self._prefill(missing + 1) * self.step()
            if self._target_token_s is not None:
                forward = min(forward, self._target_token_s * (missing + 1))
        else:
            forward = self.draft(missing + 1)
        return max(forward - self.draft(1), 0.0)


_COSTS: "weakref.WeakKeyDictionary[object, dict[tuple[int, int | None], CallCosts]]" = weakref.WeakKeyDictionary()
# The copies of the last call planned with each cost estimate (one per pair in a process: `CARRIED_COPIES`).
_LAST_COPIES: "weakref.WeakKeyDictionary[CallCosts, CopyAcceptance]" = weakref.WeakKeyDictionary()


def costs_for(target: object, draft: object, draft_vocab: int | None = None) -> CallCosts:
    """The cost estimate of this (target, draft) pair in this process, created on first use; one per draft
    vocabulary limit (`pacer_draft_vocab`), since a draft scoring fewer ids runs faster."""
    by_draft = _COSTS.setdefault(target, {})
    return by_draft.setdefault((id(draft), draft_vocab), CallCosts())


def blend(counts: Sequence[float] | None, prior: float, weight: float = COPY_PRIOR_WEIGHT) -> float:
    """A probability from `counts` = [tries, hits] (none: no tries) and a `prior` that weighs `weight` tries."""
    tries, hits = counts or (0.0, 0.0)
    return (hits + weight * prior) / (tries + weight)


def match_bucket(match_length: int) -> int:
    """The index of the `MATCH_BUCKETS` bucket of a match length."""
    return max(i for i, low in enumerate(MATCH_BUCKETS) if match_length >= low)


def position_bucket(position: int) -> int:
    """The index of the `COPY_POSITIONS` bucket of a copied token's position (2 or more)."""
    return max(i for i, low in enumerate(COPY_POSITIONS) if position >= low)


class CopyAcceptance:
    """Acceptance of copies in this call: the probability that a copy's first token is accepted, per source and
    match-length bucket, and that its token i is once every token before it was, per source, match bucket and position
    (`COPY_POSITIONS`), learnt from the copies that reached that position.

    Each cell's estimate starts from the call's evidence at that position pooled over every source and match length,
    which starts from the cell's prior (a first token) or from the pooled estimate of the position before (a next one:
    what the call learnt of its second tokens also holds for its tenth until a copy gets that far), so a call whose text
    does not copy learns it from its first few copies, whatever look-up and match length they had. By position, not one
    rate for every next token: four copies stopped after their first token and one accepted for 40 tokens say that a
    second token is accepted 1 time in 5, and that the 10th is once the 9th was; one rate learnt from every next token
    would put both near 0.9. And a call whose copies get fewer tokens than these estimates promised scales every copy's
    first-token probability by the ratio (`calibration`, `CALIBRATION_PRIOR_TOKENS`). Rounds that send no copy teach
    too: the tokens a plain step or a draft round added say how far the best copy weighed would have been accepted
    ([`observe_unsent`]).

    Args:
        previous ([`CopyAcceptance`], *optional*): the pair's previous call, whose counts this one starts from, scaled
            down to the priors' weight (`CARRIED_COPIES`).
    """

    prior_weight: float = COPY_PRIOR_WEIGHT  # in copies (eval.research.copy_rules weighs its priors otherwise)

    def __init__(self, previous: "CopyAcceptance | None" = None) -> None:
        self._first: dict[tuple, list[float]] = {}  # () or (source, bucket) -> [copies, first accepted]
        self._next: dict[tuple, list[float]] = {}  # (position bucket[, source, bucket]) -> [reached, accepted]
        self._promised = self._accepted = 0.0  # over the call's copies: expected accepted tokens, and accepted
        if previous is not None:  # the pair's previous call (`CARRIED_COPIES`); the calibration is each call's own
            self._first, self._next = _carried(previous._first), _carried(previous._next)

    def _blend(self, counts: list[float] | None, prior: float) -> float:
        return blend(counts, prior, self.prior_weight)

    @property
    def calibration(self) -> float:
        """The call's copies' accepted tokens over what the estimates expected of them, at most 1
        (`CALIBRATION_PRIOR_TOKENS`)."""
        return min(1.0, (self._accepted + CALIBRATION_PRIOR_TOKENS) / (self._promised + CALIBRATION_PRIOR_TOKENS))

    def hazards(self, option: Phrase, tokens: int) -> list[float]:
        """For i = 1..`tokens` of `option`: P(token i accepted | every token before it was)."""
        hazards = self._estimates(option, tokens)  # always holds the first token's, even for tokens=0
        hazards[0] *= self.calibration
        return hazards

    def _estimates(self, option: Phrase, tokens: int) -> list[float]:
        """`hazards` as the counts and priors estimate them, before the call's calibration."""
        cell = (option.source, match_bucket(option.match_length))
        prior_first, prior_next = COPY_PRIOR[cell[0]][cell[1]]
        hazards = [self._blend(self._first.get(cell), self._blend(self._first.get(()), prior_first))]
        pooled = prior_next  # a position no copy reached yet starts from the one before it
        for position in range(2, tokens + 1):
            at = (position_bucket(position),)
            if position == COPY_POSITIONS[at[0]]:
                pooled = self._blend(self._next.get(at), pooled)
            hazards.append(self._blend(self._next.get(at + cell), pooled))
        return hazards

    def observe(self, option: Phrase, sent: int, accepted: int) -> None:
        """A copy of `option`'s first `sent` tokens, of which the first `accepted` were accepted."""
        if sent <= 0:
            return
        accepted = min(accepted, sent)
        reach = 1.0
        for hazard in self._estimates(option, sent):
            reach *= hazard
            self._promised += reach
        self._accepted += accepted
        cell = (option.source, match_bucket(option.match_length))
        for key in ((), cell):
            counts = self._first.setdefault(key, [0.0, 0.0])
            counts[0], counts[1] = counts[0] + 1, counts[1] + (accepted > 0)
        for position in range(2, min(sent, accepted + 1) + 1):  # sent, and every token before it accepted
            at = (position_bucket(position),)
            for key in (at, at + cell):
                counts = self._next.setdefault(key, [0.0, 0.0])
                counts[0], counts[1] = counts[0] + 1, counts[1] + (position <= accepted)

    def observe_unsent(self, option: Phrase, length: int, added: Sequence[int]) -> None:
        """A round that sent none of `option`'s first `length` tokens (a plain step, a draft round) added the tokens
        `added`: as far as they go, they say how many of the copy the target would have accepted (under sampling too:
        a one-hot candidate is accepted exactly when the target's token is it), and are learnt as that copy.

        Without it a call that steps learns nothing more about copies: where a verification costs 1.5 steps (float32
        on a CPU without bfloat16 units), two copies rejected at their first token left copies at 0.8-1.1 of a step's
        rate, under `STEP_MARGIN`, and summaries stepped tens of times in a row where prompt lookup kept copying (at
        that machine's modelled costs, summaries 40-47: 195.1 s against 200.1 s, 53 plain steps against 98;
        eval/results/virtual-unsent-copies-xeon.md)."""
        known = min(length, len(added))
        matched = next((i for i in range(known) if option.tokens[i] != added[i]), known)
        self.observe(option, min(matched + 1, known), matched)  # sent up to the first miss; none known: nothing


def _carried(counts: dict[tuple, list[float]]) -> dict[tuple, list[float]]:
    """`counts` ([tries, hits] a cell) scaled down to at most `CARRIED_COPIES` tries a cell."""
    carried = {}
    for key, (tries, hits) in counts.items():
        if tries > 0:
            scale = min(1.0, CARRIED_COPIES / tries)
            carried[key] = [tries * scale, hits * scale]
    return carried


class DraftAcceptance:
    """The draft's recent rounds in this call, as running means over the last `RECENT_ROUNDS` (a prior round first,
    weighing `DRAFT_PRIOR_ROUNDS`): tokens drafted, tokens accepted, seconds of drafting per drafted token (its
    forwards, selection and head calls, without the catch-up of tokens it had not seen; the prior is the costs' draft
    forward); and per way drafting ended, the share of rounds whose every drafted token was accepted (a tail after the
    draft is reached only then). Rounds without the draft move the means back towards the prior ([`forget`])."""

    def __init__(self) -> None:
        self.rounds = 0
        self.drafted, self.accepted = DRAFT_PRIOR_TOKENS, DRAFT_PRIOR_ACCEPTED
        self._per_token, self._per_token_weight = 0.0, 0.0  # seconds per drafted token, and its weight in rounds
        self._all_accepted = {end: [share, 1.0] for end, share in ALL_ACCEPTED_PRIOR.items()}  # end -> [mean, n]

    def seconds(self, costs: CallCosts) -> float:
        """Expected seconds of drafting a round."""
        prior = costs.draft(1) * DRAFT_PRIOR_FORWARDS / DRAFT_PRIOR_TOKENS
        weight = self._per_token_weight
        per_token = (weight * self._per_token + DRAFT_PRIOR_ROUNDS * prior) / (weight + DRAFT_PRIOR_ROUNDS)
        return per_token * self.drafted

    def observe(self, drafted: int, accepted: int, seconds: float, end: str) -> None:
        self.rounds = min(self.rounds + 1, RECENT_ROUNDS)
        step = 1 / (self.rounds + DRAFT_PRIOR_ROUNDS)
        self.drafted += step * (drafted - self.drafted)
        self.accepted += step * (min(accepted, drafted) - self.accepted)
        if drafted > 0:
            self._per_token_weight = min(self._per_token_weight + 1, RECENT_ROUNDS)
            self._per_token += (seconds / drafted - self._per_token) / self._per_token_weight
        share = self._all_accepted.setdefault(end, [0.5, 1.0])
        share[1] = min(share[1] + 1, RECENT_ROUNDS)
        share[0] += (float(accepted >= drafted) - share[0]) / share[1]

    def forget(self) -> None:
        """A round without the draft: the estimates move `DRAFT_FORGET` of the way back towards the prior round."""
        self.drafted += DRAFT_FORGET * (DRAFT_PRIOR_TOKENS - self.drafted)
        self.accepted += DRAFT_FORGET * (DRAFT_PRIOR_ACCEPTED - self.accepted)
        self._per_token_weight *= 1 - DRAFT_FORGET

    def all_accepted(self, end: str) -> float:
        """The share of draft rounds that ended by `end` and had every drafted token accepted."""
        return self._all_accepted.get(end, [0.5])[0]


class Confirmations:
    """How the draft confirms looked-up phrases in this call: the probability that it confirms a phrase's first token,
    and each next one once every one before it was (pooled over positions), from the call's forwards on top of
    `CONFIRM_PRIOR`."""

    def __init__(self) -> None:
        self._first, self._next = [0.0, 0.0], [0.0, 0.0]  # [tries, confirmed]

    def hazards(self) -> tuple[float, float]:
        """P(first token confirmed), P(next token confirmed | every one before it was)."""
        return blend(self._first, CONFIRM_PRIOR[0]), blend(self._next, CONFIRM_PRIOR[1])

    def observe(self, reached: int, confirmed: int) -> None:
        """A forward whose draft chose a token at `reached` positions of the fed phrase, the first `confirmed` of them
        its tokens (a mismatch ends the run; a stopped draft ends it too, without a mismatch)."""
        if reached <= 0:
            return
        self._first[0], self._first[1] = self._first[0] + 1, self._first[1] + (confirmed > 0)
        for position in range(2, min(reached, confirmed + 1) + 1):
            self._next[0], self._next[1] = self._next[0] + 1, self._next[1] + (position <= confirmed)


@dataclass
class Plan:
    """What the planner chose for a round: `"copy"` (send `copy.tokens[:length]`), `"draft"` (draft, then a tail
    chosen after drafting by [`RoundPlanner.tail_length`]) or `"step"`; the new tokens it expects the round to add;
    and the expected new tokens per second of each option it weighed (`"step"`, `"copy"`: the best copy, `"draft"`:
    without its catch-up, which the rest of the call must repay), so a slow call shows why it chose what it did;
    `probe`: a step taken to re-time the step (`STEP_RETIME_S`), not because it was the best option."""

    kind: str
    expected: float
    copy: Phrase | None = None
    length: int = 0
    rates: dict[str, float] = field(default_factory=dict)
    probe: bool = False
    weighed: tuple[Phrase, int] | None = None  # the best copy weighed and its length, sent or not


class RoundPlanner:
    """Chooses each round's candidates for one `generate()` call (see the module docstring).

    Args:
        costs ([`CallCosts`]): the pair's cost estimate, updated by the generator as rounds are timed.
        max_new_tokens (`int`): the call's new-token budget, for the lazy draft's break-even.
    """

    def __init__(self, costs: CallCosts, max_new_tokens: int):
        self.costs = costs
        self.copies = CopyAcceptance(_LAST_COPIES.get(costs))
        _LAST_COPIES[costs] = self.copies  # this call's copies start the pair's next call
        self.drafts = DraftAcceptance()
        self.confirmations = Confirmations()
        self.max_new_tokens = max_new_tokens
        self.new_tokens = 0
        self.seconds = 0.0
        self.rounds_timed = 0
        self._first_round = False  # whether the call's first (untimed) round ran
        self._recent = [0.0, 0.0]  # new tokens, seconds of recent rounds (decayed)

    @property
    def rate(self) -> float:
        """New tokens per second of this call so far, starting from plain decoding's (one token per step)."""
        return (self.new_tokens + PRIOR_WEIGHT) / (self.seconds + PRIOR_WEIGHT * self.costs.step())

    def copy_length(self, option: Phrase, reach: float = 1.0, room: int = MAX_COPY_TOKENS,
                    before: int = 0) -> tuple[int, float]:
        """How many of `option`'s tokens to send after `before` drafted candidates, and their expected accepted count,
        when the round reaches the first of them with probability `reach`: token i goes while P(it and all before it
        are accepted) is worth its verification time at the call's rate, or while the verification's free candidates
        ([`CallCosts.free_candidates`]) last."""
        free = self.costs.free_candidates() - before
        length, expected = 0, 0.0
        for hazard in self.copies.hazards(option, min(len(option.tokens), room, MAX_COPY_TOKENS)):
            reach *= hazard
            # what its verification time would buy, at the call's rate
            if length >= free and reach < self.rate * self.costs.verify_marginal(before + length + 1):
                break
            length += 1
            expected += reach
        return length, expected

    def plan(self, options: Sequence[Phrase], room: int, draft_room: int, draft_missing: int,
             draft_started: bool) -> Plan:
        """The best of copying one of `options`, drafting and a plain step.

        Args:
            options: the continuations the look-ups found (possibly none).
            room (`int`): the most candidates the round may send.
            draft_room (`int`): the most it may draft (0: no drafting this round).
            draft_missing (`int`): tokens the draft's cache lacks (its catch-up forward feeds them).
            draft_started (`bool`): whether the draft has run in this call (its first forward fills the cache).
        """
        step_rate = 1.0 / self.costs.step()
        step = Plan("step", 1.0, rates={"step": step_rate})
        if not self.costs.steps_timed:  # every option is priced against a step: time one first (it costs nothing)
            return step
        best = self._best(options, room, draft_room, draft_missing, draft_started, step)
        if self.costs.seconds_since_step >= STEP_RETIME_S:
            # the step's estimate is stale, and it is what every other cost is priced against
            return Plan("step", 1.0, rates=best.rates, probe=True, weighed=best.weighed)
        return best

    def _best(self, options: Sequence[Phrase], room: int, draft_room: int, draft_missing: int, draft_started: bool,
              step: Plan) -> Plan:
        """`plan` once a step was timed: the option of the best expected rate, a plain step unless another beats it by
        `STEP_MARGIN` (a draft not yet run in this call: by anything)."""
        best, best_rate = step, (1.0 + STEP_MARGIN) * step.rates["step"]
        rates, weighed = step.rates, None
        for option in options:
            length, expected = self.copy_length(option, room=room)
            rate = (1 + expected) / self.costs.target(length) if length else 0.0
            if length and rate > rates.get("copy", 0.0):
                weighed = (option, length)
            rates["copy"] = max(rates.get("copy", 0.0), rate)
            if rate > best_rate:
                best, best_rate = Plan("copy", 1 + expected, option, length, rates), rate
        step.weighed = best.weighed = weighed
        if draft_room <= 0:
            return best
        drafts = self.drafts
        drafted = max(1, round(min(drafts.drafted, draft_room)))
        expected = 1 + min(drafts.accepted, drafted)
        catch_up = self.costs.catch_up(draft_missing, first=not draft_started)
        draft_rate = expected / (drafts.seconds(self.costs) + self.costs.target(drafted))
        rates["draft"] = draft_rate
        # Until the draft has run in this call its acceptance is the prior's, which the call's first draft rounds
        # replace: an untried draft whose start costs less than a step needs no margin over a step. With it, short
        # chat prompts whose draft, priced by the prior, made 1.03x a step's rate never drafted, where the entropy stop
        # made 1.10-1.13x of plain decoding (eval/results/step-probe-ab.md). A start dearer than a step (a long
        # prompt's catch-up) is a bet on the prior that the call's first draft rounds cannot take back: the draft must
        # beat a step by the margin, and repay its catch-up against a step that fast. Without the margin,
        # summarization 282 of eval/results/steps-unit-ab.md (1,060 prompt tokens) started at 1.19x a step's rate;
        # its first draft round took 7.1 s against 0.34 s a step, and its draft rounds had 3 of 21 sent tokens accepted.
        explore = not draft_started and best.kind == "step" and not self._dear(catch_up)
        if explore:
            bar = step.rates["step"]
        elif draft_started and best.kind == "step":
            bar = (1.0 + DRAFT_MARGIN) * step.rates["step"]
        else:
            bar = best_rate
        if draft_rate <= bar:
            return best
        # The catch-up (the prompt's at the first start; later, the tokens stepped or copied since the draft last
        # ran) is paid once, then the call drafts at `draft_rate`: the rest of the call must repay it. Charged to one
        # round instead, it grew with every step, and a call that stepped after a poor draft round stepped to the end.
        if draft_started:
            starts = self._saves(catch_up, bar, draft_rate, self._budget_left())
        else:
            starts = self._repays(catch_up, draft_rate, bar)
        return Plan("draft", expected, rates=rates, weighed=weighed) if starts else best

    def _dear(self, catch_up: float) -> bool:
        """Whether a first start's catch-up costs more than a plain step (a long prompt's): such a start waits for the
        call's first rounds and clears `STEP_MARGIN` like any other option; a cheaper one is bought at once."""
        return catch_up > self.costs.step()

    @staticmethod
    def _saves(price: float, other_rate: float, draft_rate: float, remaining: float) -> bool:
        """Whether drafting `remaining` tokens at `draft_rate` instead of `other_rate` saves more than `price`
        seconds."""
        return remaining * (1 / other_rate - 1 / draft_rate) > price

    def _budget_left(self) -> int:
        """The most tokens this call may add yet."""
        return max(self.max_new_tokens - self.new_tokens, 0)

    def _expected_remaining(self) -> float:
        """The tokens this call is expected to add yet (see `EXPECTED_ANSWER_TOKENS`)."""
        return min(self._budget_left(), max(self.new_tokens, EXPECTED_ANSWER_TOKENS))

    def _repays(self, catch_up: float, draft_rate: float, other_rate: float) -> bool:
        """Whether starting the draft now repays its catch-up forward: the time drafting would save over the rest of
        the call's budget at its rate instead of the other options' (or of the recent rounds', if faster), against
        that forward's extra time. A catch-up dearer than a plain step (a long prompt) waits until
        `ROUNDS_BEFORE_DRAFT` rounds ran (the first one included) and the call spent its time in them, and must be
        repaid `DEAR_START_ODDS` times over by the tokens the call is expected to add yet (`EXPECTED_ANSWER_TOKENS`);
        a cheaper one (a short prompt) can be bought at once."""
        dear = self._dear(catch_up)
        rounds, rent = self.rounds_timed, self.seconds
        if self._first_round:  # its token cost about a step beyond the prefill
            rounds, rent = rounds + 1, rent + self.costs.step()
        if dear and (rounds < ROUNDS_BEFORE_DRAFT or rent < catch_up):
            return False
        tokens, seconds = self._recent
        other_rate = max(other_rate, tokens / seconds if seconds > 0 else 0.0)
        if dear:
            price, remaining = DEAR_START_ODDS * catch_up, self._expected_remaining()
        else:
            price, remaining = catch_up, self._budget_left()
        return draft_rate > other_rate and self._saves(price, other_rate, draft_rate, remaining)

    def confirm_length(self, phrase_length: int) -> int:
        """How many tokens of a looked-up phrase of `phrase_length` a draft forward feeds for confirmation: token i
        goes while the chance that it and every one before it are confirmed, times the forward a confirmed token saves,
        outweighs what feeding it adds to the forward, or while the fed tokens together add at most `FREE_VERIFY` of
        a forward. Where a few more tokens cost about nothing (a GPU, a CPU with bfloat16 matrix units) several go
        however rarely the draft confirms; in float32 on a CPU each costs several percent of the forward, and a call
        whose draft rarely confirms feeds none (on open text 1 confirmed of 171 offered in one call). A call whose
        draft confirms whole phrases feeds them whole on either."""
        saved, added = self.costs.draft(1), self.costs.draft_marginal()
        free = int(FREE_VERIFY * saved / added) if added > 0 else phrase_length
        first, later = self.confirmations.hazards()
        reach, length = 1.0, 0
        while length < phrase_length:
            reach *= later if length else first
            if length >= free and reach * saved < added:
                break
            length += 1
        return length

    def tail_length(self, option: Phrase | None, room: int, end: str, drafted: int) -> tuple[int, float]:
        """After `drafted` tokens of a draft that ended by `end`: how many of `option`'s tokens to append, reached
        only if every drafted token is accepted (the share of such rounds so far)."""
        if option is None or room <= 0:
            return 0, 0.0
        return self.copy_length(option, reach=self.drafts.all_accepted(end), room=room, before=drafted)

    def observe_first_round(self) -> None:
        """The call's first round ran: its target call also prefilled the prompt, so it is not timed as a round, but
        its token came without the draft, like a plain step's (the lazy draft's rent, `ROUNDS_BEFORE_DRAFT`)."""
        self._first_round = True

    def observe_round(self, new_tokens: int, seconds: float) -> None:
        """A round of this call added `new_tokens` in `seconds` (drafting and verification)."""
        self.new_tokens += new_tokens
        self.seconds += seconds
        self.rounds_timed += 1
        self._recent = [RECENT_RATE_DECAY * self._recent[0] + new_tokens, RECENT_RATE_DECAY * self._recent[1] + seconds]
