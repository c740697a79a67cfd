"""The README's Python code runs as written, on tiny models: its loaders are pointed at tiny stand-ins, nothing else."""

import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import pacer_hf  # noqa: F401  (teaches generate() the `pacer_head` argument)
from pacer_hf import PacerHead, PacerHeadConfig
from pacer_hf.tiny_models import tiny_pair, tiny_tokenizer

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_the_readme_is_short_and_has_its_snippets():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 200
    assert len(_python_blocks()) >= 2


@pytest.fixture
def tiny_hub(monkeypatch):
    """`from_pretrained` of the README's classes returns tiny models, the tiny tokenizer and a head for them."""
    target, draft = tiny_pair("qwen2", "noisy", seed=0)
    models = {"Qwen/Qwen2.5-Coder-1.5B-Instruct": target, "Qwen/Qwen2.5-Coder-0.5B-Instruct": draft}
    head = PacerHead(PacerHeadConfig.for_draft(draft, block_size=2, threshold=0.5)).eval()
    loaded = []

    def load_model(name, **kwargs):
        loaded.append(name)
        return models[name]

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", load_model)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda name, **kwargs: tiny_tokenizer())
    monkeypatch.setattr(PacerHead, "from_pretrained", classmethod(lambda cls, name, **kwargs: head))
    return loaded


def test_the_readme_python_blocks_run_in_order(tiny_hub, capsys):
    namespace: dict = {}
    for block in _python_blocks():
        exec(compile(block, str(README), "exec"), namespace)
    assert sorted(set(tiny_hub)) == ["Qwen/Qwen2.5-Coder-0.5B-Instruct", "Qwen/Qwen2.5-Coder-1.5B-Instruct"]
    stats, out, inputs = namespace["stats"], namespace["out"], namespace["inputs"]
    assert stats.new_tokens == out.shape[1] - inputs["input_ids"].shape[1] > 0 and stats.rounds > 0
    plain = namespace["target"].generate(**inputs, max_new_tokens=128, do_sample=False)
    assert torch.equal(out, plain)  # the snippet's output is the target's own greedy output
    assert "rounds" in capsys.readouterr().out
