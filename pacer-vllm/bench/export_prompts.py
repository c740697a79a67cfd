"""Writes the harness's prompts as token ids, with the folders of the pinned pair, for `bench.py` (which runs in the
vLLM environment, where pacer-hf cannot be installed). Run with pacer-hf installed:

    python pacer-vllm/bench/export_prompts.py humaneval:0:4 sharegpt:0:4 --out runs/vllm-prompts.json
"""

import argparse
import json
from pathlib import Path

from transformers import AutoTokenizer

from pacer_hf.models import PAIRS, fetch_model
from pacer_hf.prompts import encode_prompt, load_prompt_set


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompt_sets", nargs="+", help="SOURCE:START:COUNT, as in `pacer-hf bench --prompts`")
    parser.add_argument("--pair", default="qwen2.5-coder", choices=sorted(PAIRS))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    draft_name, target_name = PAIRS[args.pair]
    draft, target = fetch_model(draft_name), fetch_model(target_name)
    tokenizer = AutoTokenizer.from_pretrained(target)
    prompts = [{"set": p.set_name, "id": p.prompt_id,
                "prompt_token_ids": p.text if isinstance(p.text, list) else encode_prompt(tokenizer, p.text)}
               for spec in args.prompt_sets for p in load_prompt_set(spec)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"draft": str(draft), "target": str(target), "prompts": prompts}))
    print(f"{len(prompts)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
