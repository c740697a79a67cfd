"""`pacer-hf demo` with a per-round trace: the pair's costs as each PACER call starts, then each call's rounds (kind,
tokens sent, drafted and accepted, seconds, and the new tokens per second the planner expected of a plain step, the
best copy and the draft), so a demo call that stopped drafting shows what the planner saw.

    python -m eval.research.demo_trace > demo-trace.txt

    python -m eval.research.demo_trace --disturb > demo-trace.txt

`--disturb` runs a busy loop on every core from the models' load until the second prompt is done, the third prompt
alone: a shared machine that was slow and is fast again (`eval/results/demo-fp32-*-hog-trace*.txt`; see
docs/planner.md).
"""

import argparse
import os
import subprocess
import sys

from pacer_hf import demo, planner, prompts
from pacer_hf.stats import PacerStats


def _trace_calls() -> list[PacerStats]:
    """Make the demo's PACER calls keep their statistics here, and print the costs as each call's planner starts."""
    calls = []

    class Recorded(PacerStats):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            calls.append(self)

    start = planner.RoundPlanner.__init__

    def traced(self, costs: planner.CallCosts, max_new_tokens: int) -> None:
        start(self, costs, max_new_tokens)
        print(f"[call start] step {costs.step():.3f} s, verify 3 {costs.target(3):.3f} s, "
              f"verify 8 {costs.target(8):.3f} s, draft forward {costs.draft(1):.3f} s", flush=True)

    demo.PacerStats = Recorded
    planner.RoundPlanner.__init__ = traced
    return calls


def _disturb(loops: list[subprocess.Popen], until_prompt: int = 2) -> None:
    """Start a busy loop per core as the demo builds its first input (the warm-up's, after the models' load) and
    stop them as it builds prompt `until_prompt + 1`'s."""
    built = prompts.chat_input_ids
    count = 0

    def counted(*args, **kwargs):
        nonlocal count
        count += 1
        if count == 1:
            busy = [sys.executable, "-c", "while True: pass"]
            loops.extend(subprocess.Popen(busy) for _ in range(os.cpu_count() or 1))
        elif count == until_prompt + 2:
            _stop(loops)
        return built(*args, **kwargs)

    prompts.chat_input_ids = counted


def _stop(loops: list[subprocess.Popen]) -> None:
    for loop in loops:
        loop.kill()
        loop.wait()
    loops.clear()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--disturb", action="store_true",
                        help="busy loops on every core until the second prompt is done (see above)")
    args = parser.parse_args(argv)
    calls, loops = _trace_calls(), []
    if args.disturb:
        _disturb(loops)
    try:
        demo.run_demo()
    finally:
        _stop(loops)
    for number, stats in enumerate(calls, 1):
        print(f"=== PACER call {number}")
        for r in stats.plans:
            rates = " ".join(f"{option}={rate:.2f}" for option, rate in (r.rates or {}).items())
            kind = "probe" if r.end == "probe" else r.kind  # a step taken to re-time the step
            print(f"{kind:5s} sent {r.sent:2d} drafted {r.drafted:2d} accepted {r.accepted} "
                  f"{r.seconds or 0:.2f}s {rates}")


if __name__ == "__main__":
    main()
