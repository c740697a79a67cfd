"""The pair's costs measured where they are paid: inside `generate()` on this machine, in units of a round.

Set `OMP_WAIT_POLICY=PASSIVE` before starting Python on small CPUs, or OpenMP spin-waits make timings noisy.
"""

import statistics
import time

import numpy as np
import torch
from transformers import PreTrainedModel

from pacer_core.features import NUM_DISTRIBUTION_FEATURES, draft_distribution_features
from pacer_core.head import PacerHead

from .stats import PacerStats
from .threshold import CostModel

# KV-cache length at which the micro-benchmark times forwards: a typical mid-generation context.
BENCHMARK_CONTEXT = 200
# Output lengths of the timed generate() calls: two, so that the fit separates the prefill from the rounds.
TIMED_NEW_TOKENS = (4, 12)


def _timed_generate(target: PreTrainedModel, draft: PreTrainedModel, head: PacerHead, ids: torch.LongTensor,
                    new_tokens: int, draft_length: int) -> tuple[float, int, int]:
    """Wall seconds, target calls and drafted tokens of one `generate()` in the head's decoding mode that drafts
    exactly `draft_length` tokens per round (threshold 0: the head is never asked, so every round drafts to the cap)."""
    stats = PacerStats()
    start = time.perf_counter()
    target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=draft, pacer_head=head,
                    pacer_phrases=False, pacer_stats=stats, pacer_threshold=0.0, pacer_block_size=1, pacer_max_draft=draft_length,
                    max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                    do_sample=head.config.decoding == "sampling")
    seconds = time.perf_counter() - start
    return seconds, stats.rounds, stats.drafted_tokens


def measure_cost_model(
    draft: PreTrainedModel, target: PreTrainedModel, head: PacerHead, repeats: int = 3
) -> CostModel:
    """Measures the pair's costs where they are paid: inside `target.generate(assistant_model=draft,
    pacer_head=head)` on this machine, with per-step logits processing and Python.

    `repeats` generations from `BENCHMARK_CONTEXT` random tokens for each of two constant draft lengths (1 and
    `max(max_draft // 2, 2)` tokens per round) and two output lengths (`TIMED_NEW_TOKENS`), in the head's decoding
    mode, are fitted by least squares to wall = prefill + rounds·R + drafted·D. R is the fixed cost of a round
    (target forward and verification), D the cost of one drafted token (draft forward, its processing, and the
    extra verification cost of one more token, so `verify` is 0 here). Costs are returned relative to R, the unit
    of [`CostModel`]. The head's cost is a micro-benchmark of one call (features of a block + the head over half of
    `max_draft` positions), since a threshold-0 round never asks the head.

    Raises:
        `ValueError`: if the timings are too noisy to give positive costs (pass the cost ratio by hand instead).
    """
    config = head.config
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(config.vocab_size, (1, BENCHMARK_CONTEXT), generator=generator).to(target.device)
    runs = []  # (wall seconds, rounds, drafted tokens)
    for draft_length in (1, max(config.max_draft // 2, 2)):
        _timed_generate(target, draft, head, ids, TIMED_NEW_TOKENS[0], draft_length)  # warm-up
        runs += [_timed_generate(target, draft, head, ids, n, draft_length)
                 for n in TIMED_NEW_TOKENS for _ in range(repeats)]
    seconds, rounds, drafted = np.array(runs, dtype=float).T  # [runs] each
    design = np.stack([np.ones_like(rounds), rounds, drafted], axis=1)  # [runs, 3]
    (_, round_s, drafted_s), *_ = np.linalg.lstsq(design, seconds, rcond=None)
    if not (round_s > 0 and drafted_s > 0):
        raise ValueError(
            f"the timings of this machine were too noisy to measure the pair's costs (a round {1000 * round_s:.1f} "
            f"ms, a drafted token {1000 * drafted_s:.1f} ms); run alone, or pass the cost ratio by hand."
        )
    positions = max(config.max_draft // 2, 1)  # a typical round: half of W (the head scores the whole round so far)
    inputs = {"device": head.device, "dtype": head.dtype}
    hidden = torch.randn(1, positions, config.draft_hidden_size, generator=generator).to(**inputs)  # [1, k, H]
    features = torch.randn(1, positions, NUM_DISTRIBUTION_FEATURES, generator=generator).to(**inputs)  # [1, k, F]
    scores = torch.randn(1, config.block_size, config.vocab_size, generator=generator).to(draft.device)  # [1, b, V]
    head_times = []
    with torch.no_grad():
        for _ in range(10 + 2):  # the first two are warm-up
            start = time.perf_counter()
            draft_distribution_features(scores, scores.argmax(dim=-1))  # one block's features per call
            head(hidden, features)
            head_times.append(time.perf_counter() - start)
    return CostModel(draft=float(drafted_s / round_s), head=float(statistics.median(head_times[2:]) / round_s))
