"""How much phrase drafting gives on a pair, measured with the draft's own tokens: sizes `phrase_length` and
`phrase_tail` before anyone benchmarks them.

    OMP_WAIT_POLICY=PASSIVE python -m eval.phrase_coverage --pair qwen2.5-coder --head hub_cards/<head> --prepack \\
        --prompts humaneval:100:8 sharegpt:1000:8 --out eval/results/phrase-coverage

Runs `generate(..., pacer_phrases=True)` on each prompt (a fresh pool per prompt) and records every phrase look-up:
the length of the key that matched, the tokens offered, and how many of them the draft confirmed (its own choice
equalled the phrase's) before the round ended; and every tail with the tokens the target accepted. Then it times a
draft forward that feeds 1 + m tokens, for m = 0..8, so that the value of a confirmed token (one draft forward
saved) can be set against the cost of each token fed. Use prompts the benchmark never evaluates on.
"""

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import torch
from tqdm.auto import tqdm

from pacer_hf import PacerCandidateGenerator, PacerHead, PacerStats
from pacer_hf.prompts import load_prompt_set

from .flags import add_generation_flags, add_model_flags, load_models


class _RecordingGenerator(PacerCandidateGenerator):
    """Records each look-up of a round, then scores it against the tokens the draft drafted."""

    log: list = []  # (set, key length, offered, confirmed) per look-up; ("tail", offered, accepted) per tail

    def _phrase(self, ids, room):
        phrase = super()._phrase(ids, room)
        if phrase:  # the same look-up again, for the length of the key that matched
            self._lookups.append((ids.shape[1], self.phrases.lookup(ids[0].tolist(), len(phrase))[1], phrase))
        return phrase

    def get_candidates(self, input_ids, *args, **kwargs):
        self._lookups = []
        candidate_ids, scores = super().get_candidates(input_ids, *args, **kwargs)
        drafted = candidate_ids[0, input_ids.shape[1] : input_ids.shape[1] + self.stats.draft_lengths[-1]].tolist()
        for position, key_length, phrase in self._lookups:
            if not phrase:
                continue
            # phrase[j] was fed at sequence position `position + j`, where the draft's own choice is drafted token
            # `position + j - len(input)`
            own = drafted[position - input_ids.shape[1] :]
            confirmed = 0
            while confirmed < min(len(phrase), len(own)) and own[confirmed] == phrase[confirmed]:
                confirmed += 1
            self.log.append((self.set_name, "phrase", key_length, len(phrase), confirmed))
        return candidate_ids, scores

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        super().update_candidate_strategy(input_ids, scores, num_matches)
        if self.stats.tail_lengths and self.stats.tail_lengths[-1]:
            accepted = max(0, num_matches - self.stats.draft_lengths[-1])
            self.log.append((self.set_name, "tail", 0, self.stats.tail_lengths[-1], accepted))


@torch.inference_mode()
def forward_costs(draft: torch.nn.Module, context: int = 300, repeats: int = 15) -> dict[int, float]:
    """Median ms of a draft forward that feeds 1 + m tokens after `context` cached tokens, m = 0..8."""
    from transformers import DynamicCache

    ids = torch.randint(100, 20000, (1, context + 9))
    cache = DynamicCache(config=draft.config)
    draft(input_ids=ids[:, :context], past_key_values=cache, use_cache=True, logits_to_keep=1)
    times = {m: [] for m in range(9)}
    for _ in range(repeats):
        for m in times:  # interleaved, so that a slow spell of this shared machine hits every m alike
            start = time.perf_counter()
            draft(input_ids=ids[:, context : context + 1 + m], past_key_values=cache, use_cache=True,
                  output_hidden_states=True, logits_to_keep=1 + m)
            times[m].append(time.perf_counter() - start)
            cache.crop(-(1 + m))
    return {m: 1000 * sorted(t)[len(t) // 2] for m, t in times.items()}


def summarize(log: list) -> dict:
    table = defaultdict(lambda: {"lookups": 0, "offered": 0, "confirmed": 0, "reach": [0] * 9})
    for set_name, kind, key_length, offered, confirmed in log:
        row = table[f"{set_name}/{kind}/{key_length}"]
        row["lookups"] += 1
        row["offered"] += offered
        row["confirmed"] += confirmed
        for j in range(1, min(confirmed, 8) + 1):
            row["reach"][j] += 1
    return {key: {**row, "p_at_least": [round(r / row["lookups"], 3) for r in row["reach"][1:]]}
            for key, row in sorted(table.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_flags(parser, pair="qwen2.5-coder")
    add_generation_flags(parser)
    parser.add_argument("--head", required=True)
    parser.add_argument("--prompts", nargs="+", required=True)
    parser.add_argument("--out", type=Path, default=Path("eval/results/phrase-coverage"))
    args = parser.parse_args()
    target, draft, encode, _ = load_models(args)
    head = PacerHead.from_pretrained(args.head).to(dtype=getattr(torch, args.dtype))
    stats = defaultdict(list)
    for prompt in tqdm([p for spec in args.prompts for p in load_prompt_set(spec)], unit="prompt"):
        _RecordingGenerator.set_name = prompt.set_name
        s = PacerStats()
        target.generate(encode(prompt.text), assistant_model=draft, pacer_head=head, pacer_phrases=True,
                        pacer_candidate_generator=_RecordingGenerator, pacer_stats=s,
                        max_new_tokens=args.max_new_tokens, do_sample=False)
        stats[prompt.set_name].append({"tokens_per_draft_forward": s.tokens_per_draft_forward,
                                       "draft_forwards": sum(s.draft_forwards), "drafted": sum(s.draft_lengths),
                                       "rounds": s.rounds, "new_tokens": s.new_tokens})
    result = {"lookups": summarize(_RecordingGenerator.log), "per_prompt": stats,
              "draft_forward_ms": forward_costs(draft), "prompts": args.prompts}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result["lookups"], indent=1))
    print({k: round(sum(r["drafted"] for r in v) / sum(r["draft_forwards"] for r in v), 3) for k, v in stats.items()})
    print(result["draft_forward_ms"])


if __name__ == "__main__":
    main()
