"""A gauge of the machine's speed around each benchmarked call.

A shared CPU runs some stretches at half speed (the same target prefill timed 0.37 s in one method's call and
0.85-0.91 s in the others' of one run), and a stretch that lands on one method's calls moves its ratio as much as a
real difference would. The harness times one fixed target forward right before and right after every call, outside
its wall time, and writes both into the record (`gauge_s`); the report then also compares methods with each call's
time scaled by how slow the machine was around it ([`gauged_walls`]). The gauge sees the machine only at the call's
two ends, so it corrects a stretch that spans a call, not one that starts and ends inside it.
"""

import statistics
import time

import torch

from pacer_hf.models import synchronize

GAUGE_TOKENS = 8  # a short forward: mostly reading the weights, as a decoding step does


class SpeedGauge:
    """Times one forward of `target` on `GAUGE_TOKENS` fixed token ids, without a cache."""

    def __init__(self, target: torch.nn.Module):
        self.target = target
        self.ids = torch.arange(GAUGE_TOKENS, device=target.device)[None]  # (1, GAUGE_TOKENS): valid in any vocabulary

    @torch.no_grad()
    def __call__(self) -> float:
        synchronize(self.target.device)
        start = time.perf_counter()
        self.target(self.ids, use_cache=False)
        synchronize(self.target.device)
        return time.perf_counter() - start


def gauged_walls(records: list[dict]) -> list[float] | None:
    """Each record's wall time scaled to the run's typical machine speed: `wall_s` times the run's median gauge over
    the mean of the record's own two gauges (a call timed while the machine ran at half speed counts half its
    seconds). `None` unless every record has its gauges (runs written before them)."""
    if not records or any(not r.get("gauge_s") for r in records):
        return None
    speeds = [statistics.mean(r["gauge_s"]) for r in records]
    typical = statistics.median(speeds)
    return [r["wall_s"] * typical / speed for r, speed in zip(records, speeds)]
