"""The harness with the round planner of an earlier commit as one more method, interleaved with today's.

A change to the planner is judged against the planner before it (or several earlier ones: `--rev A B`) on the same
prompts, in one process, every method interleaved (this machine's speed moves too much between runs to compare two
runs). Method `planner@REV` is
`entropy+phrases` with `pacer_hf/planner.py` as commit REV had it (read with `git show`), and its own cost estimate
(`CallCosts` of that planner, shared by its calls as today's is by `entropy+phrases`'s):

    python -m eval.research.planner_ab --rev 60dde82 --pair qwen2.5-coder --dtype bfloat16 --prepack \
        --prompts sharegpt:1000:6 --methods entropy+phrases planner@60dde82 --out eval/results/planner-ab

Every other argument is the harness's (`pacer-hf bench --help`); the report is the harness's too. The earlier planner
must offer today's interface (`RoundPlanner(costs, max_new_tokens)`, `plan`, `tail_length`, `observe_round`, and
`CallCosts`); its plans are recorded as today's `Plan`s.
"""

import argparse
import importlib.util
import inspect
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from pacer_hf import planner as current_planner
from pacer_hf.bench import methods, run
from pacer_hf.phrase_drafting import PhraseCandidateGenerator

PLANNER_PATH = "pacer_hf/planner.py"


def planner_at(rev: str) -> ModuleType:
    """`pacer_hf/planner.py` as commit `rev` had it, imported as a module of the package (its relative imports are
    today's modules)."""
    repo = Path(__file__).resolve().parents[2]
    try:
        source = subprocess.run(["git", "show", f"{rev}:{PLANNER_PATH}"], cwd=repo, check=True, capture_output=True,
                                text=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or error
        raise ValueError(f"Cannot read {PLANNER_PATH} at {rev!r} from the git repository {repo}: {detail}") from error
    spec = importlib.util.spec_from_loader(f"pacer_hf._planner_at_{rev}", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "pacer_hf"
    exec(compile(source, f"{rev}:{PLANNER_PATH}", "exec"), module.__dict__)
    module.Plan = current_planner.Plan  # so that today's generator can record its plans
    return module


def _feeding_whole_phrases(planner_class: type) -> type:
    """A planner from before 2026-12-03, when every draft forward fed the whole looked-up phrase for confirmation, with
    today's confirmation interface."""

    class WholePhrases(planner_class):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.confirmations = current_planner.Confirmations()  # learnt, never read

        def confirm_length(self, phrase_length: int) -> int:
            return phrase_length

    return WholePhrases


def _first_round_uncounted(planner_class: type) -> type:
    """A planner from before 2026-12-05, when a call's first round counted for nothing towards the lazy draft's
    start, with today's interface."""

    class FirstRoundUncounted(planner_class):
        def observe_first_round(self) -> None:
            pass

    return FirstRoundUncounted


def planner_method(rev: str):
    """The harness method `planner@REV`."""
    module = planner_at(rev)
    costs = module.CallCosts()
    if "first" not in inspect.signature(costs.observe_forward).parameters:
        # before 2026-12-03 a call's first draft forward was learnt as any other: today's generator says which it is
        observe = costs.observe_forward
        costs.observe_forward = lambda fed_tokens, seconds, first=False: observe(fed_tokens, seconds)
    if not hasattr(costs, "observe_prefill"):
        # before 2026-12-05 the target's prefill (a call's first target call) was not learnt
        costs.observe_prefill = lambda fed_tokens, seconds: None
    name = f"planner@{rev}"
    earlier = module.RoundPlanner
    if not hasattr(earlier, "confirm_length"):
        earlier = _feeding_whole_phrases(earlier)
    if not hasattr(earlier, "observe_first_round"):
        earlier = _first_round_uncounted(earlier)

    class Generator(PhraseCandidateGenerator):
        planner_class = earlier

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "costs": costs})  # its own estimate, not today's `costs_for` one

    return name, methods.planned(name, Generator)


def main(argv: list[str] | None = None) -> None:
    variants_main(argv, __doc__, "--rev", planner_method, prog="python -m eval.research.planner_ab",
                  help_text="the commits whose planners run as methods `planner@REV`, one each")


def variants_main(argv: list[str] | None, doc: str, flag: str, method: Callable[..., tuple[str, object]],
                  prog: str, help_text: str, value_type: type = str) -> None:
    """A research command: `flag` takes one or more values, `method(value)` gives each one's `(name, method)`, and
    every other argument is the harness's (`bench_with`)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(flag, dest="values", required=True, nargs="+", type=value_type, help=help_text)
    args, bench_argv = parser.parse_known_args(argv)
    bench_with(dict(method(value) for value in args.values), bench_argv, prog=prog)


def bench_with(extra: dict, bench_argv: list[str], prog: str) -> None:
    """The harness (`pacer-hf bench` with `bench_argv`) with the methods `extra` (name -> method) beside its own."""
    registry = run.registry

    def with_extra(pair: methods.Pair) -> dict:
        return {**registry(pair), **extra}

    run.registry = with_extra
    try:
        run.main(bench_argv, prog=prog)
    finally:
        run.registry = registry


if __name__ == "__main__":
    main(sys.argv[1:])
