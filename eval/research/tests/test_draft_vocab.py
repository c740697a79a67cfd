"""eval.research.draft_vocab: the planned rounds at other draft vocabulary limits, as more harness methods."""

import json

from eval.research.draft_vocab import main


def test_the_variants_run_beside_the_shipped_method_and_equal_plain_greedy(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\nclass Stack:\n", encoding="utf-8")
    main(["--vocab", "0", "24", "4096", "--pair", "tiny", "--max-new-tokens", "16", "--prompts", f"{prompts}:0:2",
          "--methods", "entropy+phrases", "planned+fullvocab", "planned+vocab24", "planned+vocab4k",
          "--out", str(tmp_path / "ab")])
    records = [json.loads(line) for line in (tmp_path / "ab.jsonl").read_text().splitlines()][1:]
    by_method = {}
    for record in records:
        by_method.setdefault(record["method"], {})[record["prompt_id"]] = record
    variants = {"entropy+phrases", "planned+fullvocab", "planned+vocab24", "planned+vocab4k"}
    assert set(by_method) == {"autoregressive"} | variants
    for method in variants:  # float32: each equals plain greedy
        for prompt_id, record in by_method[method].items():
            assert record["tokens"] == by_method["autoregressive"][prompt_id]["tokens"]
    assert sum(record["draft_forwards"] for record in by_method["planned+vocab24"].values()) > 0  # it drafted
