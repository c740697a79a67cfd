"""The best stop for a pair, chosen by measurement: the trained head against the entropy rule at its best threshold.

On Qwen2.5-Coder 0.5B -> 1.5B no trained head beat the training-free entropy rule (docs/qwen-head.md), and the rule's
1.0-nat threshold was tuned for that pair in greedy decoding. For any other pair, machine or decoding mode,
`pacer-hf train` fits both on the same collection and compares them on the validation split by the same expected-speed
model ([`choose_threshold`]) under the pair's measured costs, in the head's decoding mode; it saves the winner (a rule
is a head: `config.json` and an empty weights file) and records both in the metrics and the card.
"""

import dataclasses
from dataclasses import dataclass

import numpy as np

from pacer_core.config import PacerHeadConfig
from pacer_core.head import ENTROPY_RULE_SETTINGS, PacerHead

from .collection import Collection
from .rounds import RoundBatcher, window_logprobs
from .threshold import CostModel, choose_threshold

# The entropy thresholds tried, in nats: the rule's 1.0 for Qwen2.5-Coder sits inside; past 4 nats nearly nothing
# stops (a 151,936-token vocabulary's q is rarely flatter), below 0.25 nearly everything does.
ENTROPY_GRID = tuple(float(t) for t in np.round(np.arange(0.25, 4.01, 0.25), 2))


@dataclass
class RuleReport:
    """The entropy rule on validation sequences: its best threshold and expected speed-up, and the whole curve."""

    entropy_threshold: float
    speedup: float
    curve: dict[str, float]  # str(threshold in nats) -> expected speed-up


def entropy_rule_config(config: PacerHeadConfig, entropy_threshold: float) -> PacerHeadConfig:
    """The entropy rule for the pair, drafting mode and round length of `config` (a trained head's)."""
    return dataclasses.replace(config, **ENTROPY_RULE_SETTINGS, entropy_threshold=entropy_threshold)


def calibrate_entropy_rule(
    collection: Collection, sequences: list[int], config: PacerHeadConfig, cost: CostModel,
    grid: tuple[float, ...] = ENTROPY_GRID,
) -> RuleReport:
    """The entropy threshold with the highest expected speed-up on `sequences`, in the decoding mode of `config`
    (its labels and its draft features), by the model that picks a trained head's threshold."""
    slices = collection.sequence_slices()
    curve = {}
    for threshold in grid:
        rule = PacerHead(entropy_rule_config(config, threshold))
        batcher = RoundBatcher(collection, rule.config)
        labels = batcher.labels.double().numpy()
        report = choose_threshold([labels[slices[s]] for s in sequences],
                                  [window_logprobs(rule, batcher, slices[s]) for s in sequences],
                                  rule.config, cost, thresholds=(rule.config.threshold,))
        curve[str(threshold)] = report.best_speedup
    best = max(grid, key=lambda t: (curve[str(t)], -t))
    return RuleReport(entropy_threshold=best, speedup=curve[str(best)], curve=curve)
