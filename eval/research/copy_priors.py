"""The round planner's copy priors, measured: how often a copy's first token is accepted, and then each next one, by
look-up and match length.

    python -m eval.research.copy_priors eval/results/phrase-tuning-ar-qwen-bf16.jsonl \
        eval/results/planner-tuning-qwen-fp32-prepack.jsonl --out eval/results/copy-priors-tuning

Reads greedy runs' autoregressive records (tuning prompts: the run's prompts must resolve) and decodes each output
again in rounds, as the planner meets them: at a round's start the pool's copy options (`PhrasePool.copy_options`, the
library's own look-ups) are compared with the output; the round then ends after the first option's accepted run and
the target's own token. Per source (`sequence`, `earliest`, `stored`) and match-length bucket (`MATCH_BUCKETS`) it
counts whether a copy's first token was accepted and, after an accepted first token, each next token accepted or
rejected: the two probabilities the planner starts from (`pacer_hf.planner.COPY_PRIOR`). A copy is followed for at most
`MAX_COPY_TOKENS` tokens; a run cut there counts no rejection.
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path

from transformers import AutoTokenizer

from pacer_hf import PhrasePool
from pacer_hf.bench.report import load_records
from pacer_hf.models import PAIRS, fetch_model
from pacer_hf.planner import COPY_PRIOR, MATCH_BUCKETS, MAX_COPY_TOKENS, match_bucket
from pacer_hf.prompts import chat_input_ids, load_prompt_set


def count(prompt: list[int], output: list[int]) -> dict[tuple[str, int], list[int]]:
    """Per (source, bucket): [copies, first tokens accepted, next tokens accepted, next-token rejections]."""
    counts: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    pool = PhrasePool()
    pool.start_sequence(prompt)
    t = 0
    while t < len(output):
        context = prompt + output[:t]
        pool.extend(context[pool.sequence_length :])
        runs = []
        for option in pool.copy_options(context, MAX_COPY_TOKENS):
            run = 0
            while run < len(option.tokens) and t + run < len(output) and option.tokens[run] == output[t + run]:
                run += 1
            cell = counts[(option.source, match_bucket(option.match_length))]
            cell[0] += 1
            if run:
                cell[1] += 1
                cell[2] += run - 1
                cell[3] += int(run < len(option.tokens) and t + run < len(output))
            runs.append(run)
        t += (runs[0] if runs else 0) + 1  # the round sent the first option; the target adds its own token
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("records", type=Path, nargs="+", help="`pacer-hf bench` records files with autoregressive records")
    parser.add_argument("--out", type=Path, required=True, help="output prefix (.json and .md)")
    args = parser.parse_args()
    runs = [load_records(path) for path in args.records]
    tokenizer = AutoTokenizer.from_pretrained(fetch_model(PAIRS[runs[0][0]["pair"]][1]))  # the target's
    prompts = {(p.set_name, p.prompt_id): p.text for environment, _ in runs for spec in environment["prompts"]
               for p in load_prompt_set(spec)}
    records = [record for _, run_records in runs for record in run_records]
    by_set: dict[str, dict[tuple[str, int], list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0, 0]))
    for record in records:
        if record["method"] != "autoregressive":
            continue
        prompt = chat_input_ids(tokenizer, prompts[(record["set"], record["prompt_id"])])[0].tolist()
        for key, cell in count(prompt, record["tokens"]).items():
            for name in (record["set"], "all"):
                total = by_set[name][key]
                for i, value in enumerate(cell):
                    total[i] += value
    rows = []
    for name, cells in by_set.items():
        for (source, bucket), (copies, first, nexts, rejections) in sorted(cells.items()):
            rows.append({"set": name, "source": source, "match_from": MATCH_BUCKETS[bucket], "copies": copies,
                         "first": first / copies, "next": nexts / (nexts + rejections) if nexts + rejections else None,
                         "next_tokens": nexts + rejections, "prior": COPY_PRIOR[source][bucket]})
    args.out.with_suffix(".json").write_text(json.dumps({"records": [str(r) for r in args.records], "rows": rows}, indent=2) + "\n")
    sources = ", ".join(f"`{path}`" for path in args.records)
    lines = [f"Acceptance of copies, round by round, on {sources} (`python -m eval.research.copy_priors`)", "",
             "| set | look-up | match >= | copies | first token | next tokens | each next | planner prior (first, next) |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['set']} | {r['source']} | {r['match_from']} | {r['copies']} | {r['first']:.2f} | "
              f"{r['next_tokens']} | {'-' if r['next'] is None else format(r['next'], '.2f')} | "
              f"{r['prior'][0]:.2f}, {r['prior'][1]:.2f} |" for r in rows]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
