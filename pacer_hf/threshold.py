"""Expected speed of a drafting policy on labelled sequences, and the threshold that maximises it.

The threshold of a PACER head is derived from measurements (STYLE point 13): the pair's cost ratio (measured by
[`pacer_hf.cost_measurement.measure_cost_model`] or given) and the head's predictions on validation sequences whose acceptance labels are
known (see [`pacer_hf.collect`]). [`choose_threshold`] simulates drafting with each candidate threshold exactly
as [`PacerCandidateGenerator`] drafts, and reports the head's expected speed-up next to the oracle stop and
fixed-length drafting under the same cost model.

Notation: n = positions of a sequence, W = `max_draft`, b = `block_size`; costs are in units of one target
verification forward.
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from pacer_core.config import PacerHeadConfig
from pacer_core.stop_rule import log_threshold


# Candidate thresholds of the search; the chosen one is the best of these on validation data. Finer near 1, where a
# well-calibrated head's per-token probabilities sit when the draft is good.
THRESHOLD_GRID = tuple(sorted(set(np.round(np.linspace(0.0, 1.0, 41), 3).tolist())
                              | {0.96, 0.97, 0.98, 0.985, 0.99, 0.995}))
# (round start t, draft cap, accepted run m if drafting to the cap) -> (tokens drafted k, head calls)
DraftPolicy = Callable[[int, int, int], tuple[int, int]]


@dataclass
class CostModel:
    """Costs of one round's parts relative to the fixed cost of a round: one target forward with its verification,
    about one autoregressive step.

    A round that drafts k tokens and calls the head n times costs k·draft + (1 + k·verify) + n·head: the target
    verifies k + 1 tokens in one forward, which costs a little more than one token's forward on a CPU.
    [`measure_cost_model`] measures all of a drafted token's cost inside `generate()` and puts it in `draft`.

    Args:
        draft (`float`): c, one drafted token (draft forward and its processing) / the fixed cost of a round.
        head (`float`, defaults to 0.0): one head call (features + head forward) / the fixed cost of a round.
        verify (`float`, defaults to 0.0): extra verification time per draft token / the fixed cost of a round.
    """

    draft: float = field(metadata={"help": "Draft forward time / target forward time (c)."})
    head: float = field(default=0.0, metadata={"help": "Head call time / target forward time."})
    verify: float = field(default=0.0, metadata={"help": "Extra verification time per draft token / target forward."})

    def round_cost(self, drafted: int, head_calls: int) -> float:
        """Cost of a round that drafted `drafted` tokens and called the head `head_calls` times."""
        return drafted * (self.draft + self.verify) + 1.0 + head_calls * self.head

    def __post_init__(self) -> None:
        for name in ("draft", "head", "verify"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ValueError(f"`{name}` cost ratio must be a finite number >= 0, got {value!r}.")


@dataclass
class DecodingTotals:
    """Expected totals of a simulated decoding: tokens produced, cost, target calls (rounds), drafted tokens."""

    tokens: float = 0.0
    cost: float = 0.0
    rounds: float = 0.0
    drafted: float = 0.0

    def __add__(self, other: "DecodingTotals") -> "DecodingTotals":
        return DecodingTotals(*(a + b for a, b in zip(asdict(self).values(), asdict(other).values())))

    @property
    def speedup(self) -> float:
        """Tokens per unit cost; autoregressive decoding makes 1 token per unit."""
        return self.tokens / self.cost if self.cost else 0.0

    @property
    def tokens_per_round(self) -> float:
        return self.tokens / self.rounds if self.rounds else 0.0


@dataclass
class ThresholdReport:
    """The expected speed-up curve over thresholds and the baselines, under one cost model.

    Args:
        cost (`CostModel`): the cost model of the simulation.
        thresholds (`list[float]`): candidate thresholds.
        speedups (`list[float]`): the head's expected speed-up at each threshold.
        tokens_per_round (`list[float]`): expected tokens per target call at each threshold.
        best_threshold (`float`): the threshold with the highest expected speed-up (the lowest one among ties).
        best_speedup (`float`): its expected speed-up.
        oracle_speedup (`float`): stopping exactly at the first rejection (the ceiling of any stopping rule).
        fixed_speedups (`dict[int, float]`): drafting a fixed number of tokens per round, for 1..`max_draft`.
    """

    cost: CostModel
    thresholds: list[float]
    speedups: list[float]
    tokens_per_round: list[float]
    best_threshold: float
    best_speedup: float
    oracle_speedup: float
    fixed_speedups: dict[int, float]

    @property
    def best_fixed(self) -> tuple[int, float]:
        """`(draft length, speed-up)` of the best fixed-length policy."""
        return max(self.fixed_speedups.items(), key=lambda item: item[1])

    def format(self) -> str:
        """The curve and the baselines as a plain-text table."""
        lines = [
            f"expected speed-up over autoregressive (cost ratio c={self.cost.draft:.3f}, head={self.cost.head:.4f}, "
            f"verify={self.cost.verify:.4f} per draft token)",
            "threshold  speed-up  tokens/target call",
        ]
        for threshold, speedup, tau in zip(self.thresholds, self.speedups, self.tokens_per_round):
            mark = "  <- chosen" if threshold == self.best_threshold else ""
            lines.append(f"{threshold:9.3f}  {speedup:8.3f}  {tau:18.2f}{mark}")
        k, fixed = self.best_fixed
        lines.append(f"oracle stop: {self.oracle_speedup:.3f}; best fixed length ({k}): {fixed:.3f}; "
                     f"PACER at {self.best_threshold:.3f}: {self.best_speedup:.3f}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {**asdict(self), "fixed_speedups": {str(k): v for k, v in self.fixed_speedups.items()}}


def simulate_decoding(labels: np.ndarray, policy: DraftPolicy, cost: CostModel, max_draft: int) -> DecodingTotals:
    """The expected-speed model: decodes one labelled sequence with a drafting policy, round by round.

    A round starts at position t. The draft cap is `min(max_draft, n - t - 1)`, as in generation, where the target
    adds one token of its own. If drafting went on to the cap, the accepted run m (the consecutive accept-labels
    from t, capped) has probability P(m) = y_t ... y_{t+m-1} (1 - y_{t+m}) (P(cap) = y_t ... y_{t+cap-1}); greedy
    labels are 0/1, so exactly one m is possible, sampling labels are acceptance probabilities. The policy drafts
    k tokens; then a = min(m, k) are accepted, the round yields a + 1 tokens and costs `cost.round_cost(k, calls)`,
    and the next round starts at t + a + 1. Expectations are propagated forward over the round starts.

    Args:
        labels (`np.ndarray` of shape `(n,)`): acceptance label (greedy 0/1, or probability) of each position.
        policy (`DraftPolicy`): `(t, cap, m) -> (k, head_calls)`; only the oracle may look at m.
        cost (`CostModel`): the pair's cost ratios.
        max_draft (`int`): most draft tokens per round.

    Returns:
        `DecodingTotals`: expected tokens, cost, rounds and drafted tokens of the sequence.
    """
    n = labels.shape[0]
    reach = np.zeros(n + 1)  # reach[t]: probability that a round starts at t
    reach[0] = 1.0
    totals = DecodingTotals()
    for t in range(n):
        if reach[t] == 0.0:
            continue
        cap = min(max_draft, n - t - 1)
        y = labels[t : t + cap]  # [cap]
        survive = np.concatenate([[1.0], np.cumprod(y)])  # [cap + 1]: P(the first m drafts are accepted)
        run_prob = survive.copy()
        run_prob[:-1] *= 1.0 - y  # [cap + 1]: P(accepted run == m)
        for m in np.flatnonzero(run_prob > 0):
            k, calls = policy(t, cap, int(m))
            accepted = min(int(m), k)
            weight = reach[t] * run_prob[m]
            totals.tokens += weight * (accepted + 1)
            totals.cost += weight * cost.round_cost(k, calls)
            totals.rounds += weight
            totals.drafted += weight * k
            reach[t + accepted + 1] += weight
    return totals


def head_draft_lengths(
    window_logprobs: np.ndarray, threshold: float, config: PacerHeadConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Draft length and head calls of a round starting at each position, decided as the generator decides.

    After each full block that is not the last one allowed (b·j < cap) the head is asked; the round stops after
    the first block whose pass score (product of acceptance probabilities over the round so far, or over the
    block, per `config.score_mode`) is below `threshold`. Threshold 0 never asks the head.

    Args:
        window_logprobs (`np.ndarray` of shape `(n, max_draft)`): log sigmoid of the head's logits for a round
            starting at each position t (round-local positions 0..W-1); entries past the sequence end are unused.
        threshold (`float`): the stop threshold.
        config (`PacerHeadConfig`): block size, max draft and score mode.

    Returns:
        `(draft_length, head_calls)`, two `np.ndarray` of shape `(n,)`.
    """
    n = window_logprobs.shape[0]
    block, num_blocks = config.block_size, config.max_draft // config.block_size
    cap = np.minimum(config.max_draft, n - 1 - np.arange(n))  # [n]
    blocks = window_logprobs[:, : num_blocks * block].reshape(n, num_blocks, block).sum(axis=-1)  # [n, blocks]
    scores = np.cumsum(blocks, axis=1) if config.score_mode == "round" else blocks  # [n, blocks]: log pass score
    block_ends = block * np.arange(1, num_blocks + 1)  # [blocks]
    asked = (block_ends[None, :] < cap[:, None]) & (threshold > 0)  # [n, blocks]
    stop = asked & (scores < log_threshold(threshold))  # [n, blocks]
    stopped = stop.any(axis=1)
    first = stop.argmax(axis=1)  # [n]: first stopping block, where one stops
    draft_length = np.where(stopped, block_ends[first], cap)
    head_calls = np.where(stopped, first + 1, asked.sum(axis=1))
    return draft_length, head_calls


def choose_threshold(
    labels: Sequence[np.ndarray],
    window_logprobs: Sequence[np.ndarray],
    config: PacerHeadConfig,
    cost: CostModel,
    thresholds: Sequence[float] = THRESHOLD_GRID,
) -> ThresholdReport:
    """Picks the threshold with the highest expected speed-up on validation sequences (ratio of summed tokens to
    summed cost over sequences), and reports the oracle stop and fixed draft lengths under the same model.

    Args:
        labels (`Sequence[np.ndarray]`): per validation sequence, the acceptance labels `(n,)` of the decoding mode.
        window_logprobs (`Sequence[np.ndarray]`): per sequence, the head's log acceptance probabilities `(n, W)` of
            a round starting at each position (see [`head_draft_lengths`]).
        config (`PacerHeadConfig`): the head's drafting settings.
        cost (`CostModel`): the pair's cost ratios.
        thresholds (`Sequence[float]`, *optional*): candidates; defaults to `THRESHOLD_GRID`.

    Returns:
        [`ThresholdReport`].
    """
    if len(labels) == 0 or len(labels) != len(window_logprobs):
        raise ValueError(
            f"`labels` and `window_logprobs` must hold the same non-zero number of sequences, got {len(labels)} and "
            f"{len(window_logprobs)}."
        )

    def total(policy_for: Callable[[int], DraftPolicy]) -> DecodingTotals:
        return sum((simulate_decoding(y, policy_for(s), cost, config.max_draft) for s, y in enumerate(labels)),
                   DecodingTotals())

    curve = []
    for threshold in thresholds:
        decisions = [head_draft_lengths(w, threshold, config) for w in window_logprobs]
        curve.append(total(lambda s: lambda t, cap, m: (int(decisions[s][0][t]), int(decisions[s][1][t]))))
    best = max(range(len(curve)), key=lambda i: (curve[i].speedup, -i))
    oracle = total(lambda s: lambda t, cap, m: (m, 0))
    fixed = {k: total(lambda s: lambda t, cap, m: (min(k, cap), 0)).speedup for k in range(1, config.max_draft + 1)}
    return ThresholdReport(
        cost=cost,
        thresholds=[float(t) for t in thresholds],
        speedups=[c.speedup for c in curve],
        tokens_per_round=[c.tokens_per_round for c in curve],
        best_threshold=float(thresholds[best]),
        best_speedup=curve[best].speedup,
        oracle_speedup=oracle.speedup,
        fixed_speedups=fixed,
    )


def plot_threshold_curve(report: ThresholdReport, path: str | Path | BinaryIO) -> None:
    """Saves (as PNG, to a path or a binary file) the expected speed-up over thresholds, with the oracle, the best fixed length and autoregressive."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(report.thresholds, report.speedups, marker=".", label="PACER head")
    k, fixed = report.best_fixed
    ax.axhline(report.oracle_speedup, linestyle="--", color="tab:green", label="oracle stop")
    ax.axhline(fixed, linestyle=":", color="tab:orange", label=f"best fixed length ({k})")
    ax.axhline(1.0, color="grey", linewidth=0.8, label="autoregressive")
    ax.axvline(report.best_threshold, color="tab:red", linewidth=0.8, label=f"chosen {report.best_threshold:.3f}")
    ax.set_xlabel("threshold")
    ax.set_ylabel("expected speed-up")
    ax.set_title(f"cost ratio c = {report.cost.draft:.3f}")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)
