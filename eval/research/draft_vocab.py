"""The planned rounds at other draft vocabulary limits (`pacer_draft_vocab`), as more harness methods.

`generate()` lets the draft score only ids below a limit and the ids of the call's sequence (`pacer_hf.draft_vocabulary`;
on a CPU, 32,768 for a draft with more than 65,536 output rows). Method `planned+vocab{K // 1024}k` is the harness's
`entropy+phrases` with `pacer_draft_vocab=K`; `--vocab 0` adds `planned+fullvocab`, the whole vocabulary. Each keeps
its own cost estimate (`costs_for` is per limit), so they run interleaved beside the shipped method:

    python -m eval.research.draft_vocab --vocab 0 16384 65536 --pair qwen2.5-coder --dtype bfloat16 --prepack \
        --prompts sharegpt:1000:4 --methods entropy+phrases planned+fullvocab planned+vocab16k planned+vocab64k \
        --out eval/results/draft-vocab-ab

Every other argument is the harness's (`pacer-hf bench --help`).
"""

import sys

from eval.research.planner_ab import variants_main
from pacer_hf.bench import methods


def vocab_method(limit: int) -> tuple[str, object]:
    """The harness method for `pacer_draft_vocab=limit` (0: the whole vocabulary, `planned+fullvocab`)."""
    if limit == 0:
        return "planned+fullvocab", methods.planned("planned+fullvocab", pacer_draft_vocab=None)
    name = f"planned+vocab{limit // 1024}k" if limit % 1024 == 0 else f"planned+vocab{limit}"
    return name, methods.planned(name, pacer_draft_vocab=limit)


def main(argv: list[str] | None = None) -> None:
    variants_main(argv, __doc__, "--vocab", vocab_method, value_type=int, prog="python -m eval.research.draft_vocab",
                  help_text="the limits K to run, one method `planned+vocab{K // 1024}k` each "
                            "(0: the whole vocabulary)")


if __name__ == "__main__":
    main(sys.argv[1:])
