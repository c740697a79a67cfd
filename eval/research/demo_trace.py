"""`pacer-hf demo` with a per-round trace: the pair's costs as each PACER call starts, then each call's rounds (kind,
tokens sent, drafted and accepted, seconds, and the new tokens per second the planner expected of a plain step, the
best copy and the draft), so a demo call that stopped drafting shows what the planner saw.

    python -m eval.research.demo_trace > demo-trace.txt

Disturbing it on purpose (two busy loops on a 2-core machine while the first two prompts run, the third alone) is how
`eval/results/demo-fp32-intel-hog-trace.txt` was made; see docs/planner.md.
"""

import argparse

from pacer_hf import demo, planner
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)
    calls = _trace_calls()
    demo.run_demo()
    for number, stats in enumerate(calls, 1):
        print(f"=== PACER call {number}")
        for r in stats.plans:
            rates = " ".join(f"{option}={rate:.2f}" for option, rate in (r.rates or {}).items())
            print(f"{r.kind:5s} sent {r.sent:2d} drafted {r.drafted:2d} accepted {r.accepted} "
                  f"{r.seconds or 0:.2f}s {rates}")


if __name__ == "__main__":
    main()
