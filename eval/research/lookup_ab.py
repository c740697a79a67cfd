"""The planned rounds with prompt lookup's look-up (the `earliest` copy source) keyed on other n-gram lengths, as more
harness methods.

The planner copies from two look-ups (`pacer_hf.phrases`): the occurrence whose context matches furthest back, and the
earliest occurrence of the context's last 2 tokens, else its last token: transformers' prompt-lookup rule (its
`max_matching_ngram_size` default). Method `earliest@3-2-1` is the harness's `entropy+phrases` with the earliest
look-up trying the last 3 tokens first (the rule before 2026-12-06), with its own cost estimate:

    python -m eval.research.lookup_ab --keys 3-2-1 --pair qwen2.5-coder --dtype bfloat16 --prepack \\
        --prompts humaneval:100:6 --methods prompt-lookup-k10 entropy+phrases earliest@3-2-1 \\
        --out eval/results/lookup-ab

Every other argument is the harness's (`pacer-hf bench --help`).
"""

import sys

from eval.research.planner_ab import variants_main
from pacer_hf.bench import methods
from pacer_hf.phrase_drafting import PhraseCandidateGenerator
from pacer_hf.phrases import KEY_LENGTHS
from pacer_hf.planner import CallCosts


def keys_method(spec: str) -> tuple[str, object]:
    """The harness method `earliest@SPEC` for keys `SPEC` (e.g. `3-2-1`, longest first)."""
    keys = tuple(int(n) for n in spec.split("-"))
    if not keys or not set(keys) <= set(KEY_LENGTHS) or list(keys) != sorted(keys, reverse=True):
        raise ValueError(f"--keys {spec!r}: key lengths from {KEY_LENGTHS}, longest first, e.g. '3-2-1'.")
    costs = CallCosts()  # its own estimate, as each `planner@REV` of eval.research.planner_ab

    class Generator(PhraseCandidateGenerator):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "costs": costs})
            self.phrases.prompt_lookup_keys = keys  # the pool is fresh per call (`methods.planned`)

    name = f"earliest@{spec}"
    return name, methods.planned(name, Generator)


def main(argv: list[str] | None = None) -> None:
    variants_main(argv, __doc__, "--keys", keys_method, prog="python -m eval.research.lookup_ab",
                  help_text="key lengths of the earliest look-up, longest first, one method `earliest@KEYS` each")


if __name__ == "__main__":
    main(sys.argv[1:])
