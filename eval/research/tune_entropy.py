"""Chooses the entropy-stop threshold on a tuning split, disjoint from the evaluation prompts.

    OMP_WAIT_POLICY=PASSIVE python -m eval.research.tune_entropy --pair qwen2.5-coder --prompts humaneval:140:4 sharegpt:500:4

Runs the `entropy` method for each candidate threshold on the same prompts (thresholds interleaved, rotating
order) and prints the one with the highest mean tokens/s; pass it to `pacer-hf bench --entropy-threshold`.
"""

import argparse
import dataclasses
import json
import statistics


from pacer_hf.prompts import load_prompt_set

from pacer_hf.bench.flags import add_generation_flags, add_model_flags, load_models
from pacer_hf.bench.methods import Pair, entropy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_flags(parser)
    add_generation_flags(parser)
    parser.add_argument("--prompts", nargs="+", required=True, help="tuning prompt sets, SOURCE:START:COUNT")
    parser.add_argument("--thresholds", type=float, nargs="+", default=[0.5, 1.0, 2.0, 3.0])
    args = parser.parse_args()
    models = load_models(args)
    target, draft, encode = models.target, models.draft, models.encode
    base = Pair(target, draft, max_new_tokens=args.max_new_tokens)
    prompts = [encode(p.text) for spec in args.prompts for p in load_prompt_set(spec)]
    entropy(dataclasses.replace(base, max_new_tokens=8), prompts[0])  # warm-up
    rates: dict[float, list[float]] = {t: [] for t in args.thresholds}
    for index, ids in enumerate(prompts):
        order = args.thresholds[index % len(args.thresholds):] + args.thresholds[: index % len(args.thresholds)]
        for threshold in order:
            record = entropy(dataclasses.replace(base, entropy_threshold=threshold), ids)
            rates[threshold].append(len(record.tokens) / record.wall_s)
    means = {t: statistics.mean(r) for t, r in rates.items()}
    best = max(means, key=means.get)
    print(json.dumps({"tokens_per_s_mean": means, "best_entropy_threshold": best}, indent=2))


if __name__ == "__main__":
    main()
