"""eval.research.lookup_ab: the planned rounds with the earliest look-up keyed on other n-gram lengths."""

import json

import pytest

from eval.research.lookup_ab import keys_method, main
from pacer_hf.phrases import PhrasePool


def test_the_variants_run_beside_the_shipped_method_and_equal_plain_greedy(tmp_path, monkeypatch):
    used = []
    lookup = PhrasePool.lookup_earliest

    def recording(self, context, max_length):
        used.append(self.prompt_lookup_keys)
        return lookup(self, context, max_length)

    monkeypatch.setattr(PhrasePool, "lookup_earliest", recording)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\nclass Stack:\n", encoding="utf-8")
    main(["--keys", "3-2-1", "1", "--pair", "tiny", "--max-new-tokens", "16", "--prompts", f"{prompts}:0:2",
          "--methods", "entropy+phrases", "earliest@3-2-1", "earliest@1", "--out", str(tmp_path / "ab")])
    records = [json.loads(line) for line in (tmp_path / "ab.jsonl").read_text().splitlines()][1:]
    by_method = {}
    for record in records:
        by_method.setdefault(record["method"], {})[record["prompt_id"]] = record
    assert set(by_method) == {"autoregressive", "entropy+phrases", "earliest@3-2-1", "earliest@1"}
    for method in ("entropy+phrases", "earliest@3-2-1", "earliest@1"):  # float32: each equals plain greedy
        for prompt_id, record in by_method[method].items():
            assert record["tokens"] == by_method["autoregressive"][prompt_id]["tokens"]
    assert {(2, 1), (3, 2, 1), (1,)} <= set(used)  # each method's look-ups used its keys


@pytest.mark.parametrize("spec", ["4-1", "1-2", "", "x"])
def test_keys_that_are_not_indexed_or_not_longest_first_are_refused(spec):
    with pytest.raises(ValueError):
        keys_method(spec)
