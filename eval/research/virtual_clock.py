"""The harness on a virtual clock: every model forward costs what a cost model of another machine says, not what it
took here, so a planner can be judged at the bar's costs on a machine that does not have them (and, with
`--overhead-ms`, without this machine's noise).

The bar of issue #27 (`docs/benchmarks.md`) runs in bfloat16 on an AMD EPYC with bfloat16 units, where a draft round
pays on open text; on a CPU without them (AVX2 only) bfloat16 has no prepacked kernels and float32 prices a draft
forward near a plain step, so a planner tuned here learns another machine. This runs the models here (float32, for
speed: the tokens are this machine's), and replaces each forward's seconds with the model's, through the one clock
every timing reads (`time.perf_counter`, patched process-wide): the harness's wall times, the planner's costs and
the records all see the modelled machine. The rest of a call (Python, the head, logits processing) keeps its real
seconds here.

    SB=../shared/data/spec-bench/question.jsonl
    OMP_WAIT_POLICY=PASSIVE python -m eval.research.virtual_clock --pair qwen2.5-coder --dtype float32 --prepack \\
        --prompts sharegpt:10:6 "$SB#writing:0:6" "$SB#translation:60:6" \\
        --methods autoregressive confidence prompt-lookup-k10 entropy entropy+phrases \\
        --out eval/results/virtual-bar-open-text

With `--rev REV` the earlier planners of `eval.research.planner_ab` run too; `--costs XEON_AVX512_FP32` prices the
forwards as an Intel Xeon without bfloat16 units does in float32 (`XEON_AVX512_FP32`: a verification 1.5-2 steps)
instead of the bar's AMD EPYC, and `--costs INTEL_AMX_BF16` as the Intel Xeon with AMX of the later bar runs does in
bfloat16 (fitted to their records by `eval.research.fit_clock`). Every other argument is the harness's.
The records' environment says `"virtual_clock"` with the cost model's constants.

`--overhead-ms X` makes the clock deterministic: time moves only by the modelled forwards, each charged X ms more for
the Python around it (the head, logits processing, look-ups), and never by this machine's real seconds. Without it a
planner's timing-based choices read this machine's Python seconds too, and the same code on the same prompts totalled
196.5-200.9 s in four processes (`docs/planner.md`); with it the same code gives the same records, so an A/B's
difference is the change's (on those prompts) and not the machine's.

The cost model (`BAR_AMD_BF16`, fitted from the bar's own records, `eval/results/planner-bar-amd-v2.jsonl`, and the
cost tables of that machine, `eval/results/costs-qwen-bf16-prepack{,-long}.md`): a target forward of one new token
costs a step, `step_s + step_per_cached_s * L` for a cache of L tokens (fitted on the 54 plain-decoding calls); one
of 2 to 10 tokens 1.07 steps (the tables' mean, 1.09 and 1.06 at caches of 200 and 1000), and each token past 10 adds
4% (the long table: 1.91 steps for 33 tokens); past 64 tokens a prefill,
`prefill_s + prefill_per_token_s * n + prefill_quadratic_s * n^2` (fitted on the same calls' first forwards). A draft
forward of up to 64 tokens costs `draft_ratio` of a target forward of as many tokens, and a longer one
`draft_prefill_per_token_s` a token: least squares over the 54 fixed-k4 calls, each priced by its prompt's plain
step, gave 0.40 of a step and 7.2 ms a prompt token; over fixed-k4, entropy and confidence together 0.44 and 5.5 ms
(entropy alone 0.48: pacer-hf's draft loop also runs the head and reads hidden states, which keep their real
seconds here); the model takes 0.42 and 5.5 ms. The step's fit holds that machine's Python per step too, and this
machine's is added (about 1.2 ms a plain step, 0.5%). The calls' own noise is large (16-23% of a call's time around
the fits), so the model ranks methods; it does not replace the bar.
"""

import argparse
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from pacer_hf.bench import run

from . import planner_ab


@dataclass(frozen=True)
class ForwardCosts:
    """Seconds of one forward of n new tokens onto a cache of `cached` tokens, for a target and its draft."""

    step_s: float
    step_per_cached_s: float
    short_tokens: int  # forwards of 2 to this many tokens cost `short_ratio` of a step
    short_ratio: float
    per_token_past_short: float  # of a step
    prefill_from: int  # forwards of more tokens than this are priced as prefills
    prefill_s: float
    prefill_per_token_s: float
    prefill_quadratic_s: float
    draft_ratio: float
    draft_prefill_s: float
    draft_prefill_per_token_s: float
    draft_per_token_past_short: float | None = None  # of its own short forward; None: as the target's

    def target(self, n: int, cached: int) -> float:
        if n > self.prefill_from:
            return self.prefill_s + self.prefill_per_token_s * n + self.prefill_quadratic_s * n * n
        return self._short(n, cached, self.per_token_past_short)

    def draft(self, n: int, cached: int) -> float:
        if n > self.prefill_from:
            return self.draft_prefill_s + self.draft_prefill_per_token_s * n
        per_token = self.per_token_past_short if self.draft_per_token_past_short is None \
            else self.draft_per_token_past_short
        return self.draft_ratio * self._short(n, cached, per_token)

    def _short(self, n: int, cached: int, per_token_past_short: float) -> float:
        step = self.step_s + self.step_per_cached_s * cached
        if n == 1:
            return step
        return step * self.short_ratio * (1.0 + per_token_past_short * max(0, n - self.short_tokens))


BAR_AMD_BF16 = ForwardCosts(
    step_s=0.2372, step_per_cached_s=8.58e-5, short_tokens=10, short_ratio=1.07, per_token_past_short=0.04,
    prefill_from=64, prefill_s=0.360, prefill_per_token_s=6.26e-3, prefill_quadratic_s=2.10e-6,
    draft_ratio=0.42, draft_prefill_s=0.0, draft_prefill_per_token_s=5.5e-3,
)
# This session's kind of machine: an Intel Xeon with AVX-512 and no bfloat16 units, float32 prepacked, where a
# verification costs 1.5-2 steps and the planner's copies fall into runs of plain steps (docs/planner.md). From its
# cost table (eval/results/costs-qwen-fp32-prepack-xeon-avx512.md, a cache of 600 tokens): a step 283 ms, forwards of
# 2-9 tokens 1.46-1.70 steps, 33 tokens 3.47 (a line from 1.6 at 9, 5% a token); the target's prefill 14.5-14.9 ms a
# prompt token; the draft's forward 0.46 of the target's at one token, 300 ms for 33 (its own 2% a token past 9), its
# prefill 86 ms + 2.92 ms a prompt token. The step's growth with the cache: the plain-decoding calls of that machine's
# runs (eval/results/planner-aa-fp32-xeon-avx512.jsonl and the A/Bs beside it), 3.4e-5 s a cached token.
XEON_AVX512_FP32 = ForwardCosts(
    step_s=0.263, step_per_cached_s=3.4e-5, short_tokens=9, short_ratio=1.6, per_token_past_short=0.05,
    prefill_from=64, prefill_s=0.0, prefill_per_token_s=1.45e-2, prefill_quadratic_s=5.3e-7,
    draft_ratio=0.45, draft_prefill_s=0.086, draft_prefill_per_token_s=2.92e-3, draft_per_token_past_short=0.02,
)
# The machine of the Intel bar runs (docs/benchmarks.md: a 2-core Intel Xeon with AMX and avx512_bf16, bfloat16
# prepacked), fitted by `python -m eval.research.fit_clock` to its greedy runs with planned rounds
# (eval/results/planner-bar-intel-v{5,6,7}, their -recheck-repeat3 reruns of v5 and v6, draft-vocab-bar-intel), at the
# `--overhead-ms 2` it is meant for: a step 132 ms and barely growing with the cache; a verification of 2-9 tokens
# 1.11 steps, each token past 9 adding 2.1% (the copy rounds' medians: 1.07-1.16 up to 11 tokens, 1.2 at 12-16, 1.4 at
# 17-22 where AMX's 16-row tiles end, 2.2 at 65); the target's prefill 1.5 ms a prompt token; a draft forward 0.354
# of a step (its head included), its first 0.9 ms a token it feeds. Priced from their counts this way, the runs'
# plain-decoding calls take 1.01 of their real seconds (median; quartiles 0.98-1.04) and the entropy stop's 1.00
# (0.90-1.03); transformers' own drafting loops (fixed-k4, confidence) 0.93: their Python a round is more than 2 ms a
# forward, so the model prices stock drafting a little faster than it ran.
INTEL_AMX_BF16 = ForwardCosts(
    step_s=0.1316, step_per_cached_s=5.4e-6, short_tokens=9, short_ratio=1.11, per_token_past_short=0.021,
    prefill_from=64, prefill_s=0.134, prefill_per_token_s=1.486e-3, prefill_quadratic_s=1.91e-7,
    draft_ratio=0.354, draft_prefill_s=0.0, draft_prefill_per_token_s=9.05e-4, draft_per_token_past_short=0.0,
)
COST_MODELS = {"BAR_AMD_BF16": BAR_AMD_BF16, "XEON_AVX512_FP32": XEON_AVX512_FP32, "INTEL_AMX_BF16": INTEL_AMX_BF16}


def _new_and_cached(args: tuple, kwargs: dict) -> tuple[int, int]:
    """The forward's new tokens and the cache it extends, from a causal LM's call."""
    fed = kwargs.get("input_ids")
    if fed is None:
        fed = args[0] if args else kwargs.get("inputs_embeds")
    cache = kwargs.get("past_key_values")
    cached = cache.get_seq_length() if cache is not None and hasattr(cache, "get_seq_length") else 0
    return int(fed.shape[1]), int(cached)


class VirtualClock:
    """`time.perf_counter` plus an offset that turns each hooked forward's real seconds into modelled ones; with
    `overhead_s`, only the modelled forwards, each plus `overhead_s` (deterministic)."""

    def __init__(self, costs: ForwardCosts, overhead_s: float | None = None):
        self.costs = costs
        self.overhead_s = overhead_s
        self.offset_s = 0.0
        self.modelled_s = 0.0
        self._real = time.perf_counter
        self._started: dict[int, tuple[float, float]] = {}

    def now(self) -> float:
        if self.overhead_s is not None:
            return self.modelled_s
        return self._real() + self.offset_s

    def install(self) -> None:
        time.perf_counter = self.now

    def uninstall(self) -> None:
        time.perf_counter = self._real

    def attach(self, model: torch.nn.Module, price) -> None:
        """Hooks registered before the harness's own, so that its post-forward hook reads the corrected clock."""

        def before(module, args, kwargs):
            self._started[id(module)] = (self._real(), price(*_new_and_cached(args, kwargs)))

        def after(module, args, kwargs, output):
            real_start, modelled = self._started.pop(id(module))
            self.offset_s += modelled - (self._real() - real_start)
            self.modelled_s += modelled + (self.overhead_s or 0.0)

        model.register_forward_pre_hook(before, with_kwargs=True)
        model.register_forward_hook(after, with_kwargs=True)


def main(argv: list[str] | None = None) -> None:
    picker = argparse.ArgumentParser(add_help=False)
    picker.add_argument("--costs", choices=sorted(COST_MODELS), default="BAR_AMD_BF16")
    picker.add_argument("--overhead-ms", type=float, default=None)
    picked, argv = picker.parse_known_args(argv)
    overhead_s = None if picked.overhead_ms is None else picked.overhead_ms / 1000
    clock = VirtualClock(COST_MODELS[picked.costs], overhead_s)
    load_models, environment = run.load_models, run.environment

    def load_on_the_clock(args: argparse.Namespace):
        models = load_models(args)
        clock.attach(models.target, clock.costs.target)
        clock.attach(models.draft, clock.costs.draft)
        return models

    def environment_on_the_clock(*args, **kwargs) -> dict[str, Any]:
        return {**environment(*args, **kwargs),
                "virtual_clock": {"model": picked.costs, **asdict(clock.costs), "overhead_s": overhead_s}}

    run.load_models, run.environment = load_on_the_clock, environment_on_the_clock
    clock.install()
    try:
        if any(arg == "--rev" or arg.startswith("--rev=") for arg in argv):
            planner_ab.main(argv)
        else:
            run.main(argv, prog="python -m eval.research.virtual_clock")
    finally:
        clock.uninstall()
        run.load_models, run.environment = load_models, environment


if __name__ == "__main__":
    main(sys.argv[1:])
