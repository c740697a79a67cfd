"""Training data for a PACER head: teacher-forced acceptance labels, stored as safetensors shards with a manifest.

For each prompt the target's greedy continuation is produced with speculative decoding (lossless, so identical to
plain greedy), then the target and the draft each run once, teacher-forced, over prompt + continuation. At every
continuation position t (the token the target produced from the prefix `ids[:t]`):

- `hidden`: the draft's post-norm last hidden state at t - 1, the state that produces draft token t (bf16);
- `features`: [`draft_distribution_features`] of q_t with the greedy draft token argmax q_t;
- `greedy_label`: argmax q_t == argmax p_t, the event that greedy drafting meets at t when the round reached t;
- `soft_label`: sum_x min(p_t(x), q_t(x)) at temperature T, the exact probability that speculative sampling accepts
  the draft's token at t;
- `sampling_features`: the features of q_t at temperature T for a token sampled from it (seeded per prompt), what a
  sampling head sees at inference;
- `target_hidden`: the target's post-norm last hidden state at t - 1, the state that produces token t (bf16);
- `target_features`: [`target_distribution_features`] of p_t (entropy, top-1 log-prob, top-1/top-2 margin).

A round that starts at t (its first drafted token is t) follows a verification that chose token t - 1 from p_{t - 1}:
the target's round-start state is the `target_hidden` and `target_features` of position t - 1. They cost 2·H_target +
12 bytes per position (3 KiB for a 1536-wide target); format version 1 collections lack them and still load.

Notation: p = target distribution, q = draft distribution; P = prompt length, N = continuation length, V =
vocabulary, H = draft hidden size. See DESIGN.md section 4 and arXiv 2602.01274.
"""

import dataclasses
import hashlib
import json
import os
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import GenerationConfig, PreTrainedModel

from pacer_core._version import __version__
from pacer_core.config import PacerHeadConfig, model_sizes
from pacer_core.files import file_sha256, write_file_atomic, write_json_atomic
from pacer_core.features import draft_distribution_features, target_distribution_features
from pacer_core.head import PacerHead

from .pair import check_pair_compatible, draft_fingerprint
from .prompts import CHAT_TEMPLATE_MODES, encode_prompt

MANIFEST_NAME = "manifest.json"
FORMAT_NAME = "pacer-hf-collection"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1 has no target_hidden / target_features
SHARD_TENSORS = (
    "hidden", "features", "sampling_features", "greedy_label", "soft_label", "token", "sequence_offsets",
    "prompt_index", "target_hidden", "target_features",
)
TARGET_TENSORS = ("target_hidden", "target_features")

PromptInput = str | list[int]  # text, or token ids


@dataclass
class CollectionConfig:
    """Settings of one data collection; recorded in the manifest and checked when a collection is resumed.

    Args:
        max_new_tokens (`int`, defaults to 256):
            Length of the target's greedy continuation of each prompt (fewer at EOS).
        temperature (`float`, defaults to 1.0):
            Temperature of the sampling labels and features (`soft_label`, `sampling_features`).
        batch_size (`int`, defaults to 4):
            Sequences per teacher-forced forward of each model.
        shard_size (`int`, defaults to 64):
            Prompts per shard: the unit that an interrupted run redoes.
        max_prompts (`int`, *optional*):
            Use only the first `max_prompts` prompts of the source. May grow between resumed runs.
        chat_template (`str`, defaults to `"auto"`):
            `"on"`: wrap each text prompt in the tokenizer's chat template as a user turn; `"off"`: tokenize it as
            is; `"auto"`: `"on"` when the tokenizer has a chat template.
        seed (`int`, defaults to 0):
            Seed of the tokens sampled for `sampling_features` (one generator per prompt, so resuming is exact).
        draft_length (`int`, defaults to 4):
            Draft tokens per round while generating the continuations. Speed only: decoding is lossless, so the data
            does not depend on it. 4 was the best fixed length for Qwen2.5-Coder 0.5B -> 1.5B on a CPU in bf16.
    """

    max_new_tokens: int = field(default=256, metadata={"help": "Greedy continuation length per prompt."})
    temperature: float = field(default=1.0, metadata={"help": "Temperature of the sampling labels."})
    batch_size: int = field(default=4, metadata={"help": "Sequences per teacher-forced forward."})
    shard_size: int = field(default=64, metadata={"help": "Prompts per shard (the unit a resumed run redoes)."})
    max_prompts: int | None = field(default=None, metadata={"help": "Use only the first N prompts."})
    chat_template: str = field(default="auto", metadata={"help": f"One of {CHAT_TEMPLATE_MODES}."})
    seed: int = field(default=0, metadata={"help": "Seed of the sampled tokens of the sampling features."})
    draft_length: int = field(default=4, metadata={"help": "Draft tokens per round while generating (speed only)."})

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "batch_size", "shard_size", "draft_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
        if self.max_prompts is not None and (not isinstance(self.max_prompts, int) or self.max_prompts < 1):
            raise ValueError(f"`max_prompts` must be a positive integer or None, got {self.max_prompts!r}.")
        temperature = self.temperature
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
            raise ValueError(f"`temperature` must be a number > 0, got {self.temperature!r}.")
        if self.chat_template not in CHAT_TEMPLATE_MODES:
            raise ValueError(f"`chat_template` must be one of {CHAT_TEMPLATE_MODES}, got {self.chat_template!r}.")


@dataclass
class Collection:
    """Every collected position of a shard directory, concatenated over sequences (S sequences, N positions).

    Args:
        manifest (`dict`): the directory's manifest.
        hidden (`torch.BFloat16Tensor` of shape `(N, draft_hidden_size)`): draft post-norm hidden states.
        features (`torch.FloatTensor` of shape `(N, 3)`): greedy draft distribution features.
        sampling_features (`torch.FloatTensor` of shape `(N, 3)`): features at temperature T, sampled token.
        greedy_label (`torch.FloatTensor` of shape `(N,)`): 1.0 where argmax q == argmax p.
        soft_label (`torch.FloatTensor` of shape `(N,)`): sum_x min(p(x), q(x)) at temperature T.
        token (`torch.LongTensor` of shape `(N,)`): the target's greedy token at each position.
        sequence_offsets (`torch.LongTensor` of shape `(S + 1,)`): sequence s holds positions
            `sequence_offsets[s]:sequence_offsets[s + 1]`.
        prompt_index (`torch.LongTensor` of shape `(S,)`): index of each sequence's prompt in the prompt source.
        target_hidden (`torch.BFloat16Tensor` of shape `(N, target_hidden_size)`, *optional*): target post-norm
            hidden states; `None` for a version-1 collection.
        target_features (`torch.FloatTensor` of shape `(N, 3)`, *optional*): target distribution features; `None`
            for a version-1 collection.
    """

    manifest: dict[str, Any]
    hidden: torch.Tensor
    features: torch.Tensor
    sampling_features: torch.Tensor
    greedy_label: torch.Tensor
    soft_label: torch.Tensor
    token: torch.Tensor
    sequence_offsets: torch.Tensor
    prompt_index: torch.Tensor
    target_hidden: torch.Tensor | None = None
    target_features: torch.Tensor | None = None

    @property
    def num_sequences(self) -> int:
        return self.prompt_index.shape[0]

    def sequence_slices(self) -> list[slice]:
        bounds = self.sequence_offsets.tolist()
        return [slice(bounds[s], bounds[s + 1]) for s in range(self.num_sequences)]


# ---- prompts ----------------------------------------------------------------------------------------------------


def _tokenize(prompts: Sequence[PromptInput], tokenizer: Any, chat_template: str) -> list[list[int]]:
    """Token ids of each prompt ([`encode_prompt`]); text prompts need a tokenizer, token-id prompts pass through."""
    if all(not isinstance(p, str) for p in prompts):
        return [list(p) for p in prompts]
    if tokenizer is None:
        raise ValueError("`tokenizer` is required for text prompts; pass the target's tokenizer or token-id prompts.")
    return [encode_prompt(tokenizer, p, chat_template) if isinstance(p, str) else list(p) for p in prompts]


# ---- manifest and shards ----------------------------------------------------------------------------------------


def model_identity(model: PreTrainedModel) -> dict[str, Any]:
    """What identifies a model in a manifest: name, revision, architecture, vocabulary, hidden size, dtype and its
    fingerprint ([`draft_fingerprint`])."""
    text_config = model.config.get_text_config()
    vocab_size, hidden_size = model_sizes(model)
    return {
        "name_or_path": model.config._name_or_path or None,
        "revision": getattr(model.config, "_commit_hash", None),
        "model_type": model.config.model_type,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "dtype": str(model.dtype).removeprefix("torch."),
        "context_length": getattr(text_config, "max_position_embeddings", None),
        "fingerprint": draft_fingerprint(model),
    }


def _open_manifest(output_dir: Path, fresh: dict[str, Any]) -> dict[str, Any]:
    """Returns the manifest to continue: the existing one when it describes the same collection, else `fresh`."""
    if not (output_dir / MANIFEST_NAME).exists():
        return fresh  # a shard file the manifest does not list yet is rewritten under the same name
    existing = read_manifest(output_dir)
    if existing["format_version"] != fresh["format_version"]:
        raise ValueError(
            f"`output_dir` `{output_dir}` holds a format version {existing['format_version']} collection; this version "
            f"writes version {fresh['format_version']} shards, which are never mixed with older ones. Write to another "
            "directory."
        )
    for key in ("draft", "target", "collection", "prompts_sha256"):
        # a model identity is compared on the fields the existing manifest has (older ones lack the fingerprint)
        ours = {k: fresh[key].get(k) for k in existing.get(key) or {}} if key in ("draft", "target") else fresh[key]
        if existing.get(key) != ours:
            raise ValueError(
                f"`output_dir` `{output_dir}` holds a collection with a different `{key}`: {existing.get(key)} there, "
                f"{fresh[key]} now. Shards of different pairs, prompts or settings are never mixed; write to another "
                "directory (or rerun with the original settings to resume)."
            )
    return existing


def read_manifest(data_dir: str | Path) -> dict[str, Any]:
    """Reads and checks the manifest of a collection directory."""
    path = Path(data_dir) / MANIFEST_NAME
    if not path.is_file():
        raise ValueError(
            f"`{data_dir}` is not a pacer-hf collection: it has no `{MANIFEST_NAME}`. Run `pacer-hf collect`."
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"`{path}` is not valid JSON ({exc}).") from exc
    if manifest.get("format") != FORMAT_NAME or manifest.get("format_version") not in READABLE_VERSIONS:
        raise ValueError(
            f"`{path}` is not a {FORMAT_NAME} manifest of version {READABLE_VERSIONS} (format "
            f"{manifest.get('format')!r}, version {manifest.get('format_version')!r}); collect the data again."
        )
    return manifest


def _totals(shards: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("sequences", "positions", "greedy_accepts", "numerics_mismatches")
    totals: dict[str, Any] = {key: sum(shard[key] for shard in shards) for key in keys}
    totals["prompts_done"] = sum(len(shard["prompts"]) + len(shard["skipped"]) for shard in shards)
    totals["prompts_skipped"] = sum(len(shard["skipped"]) for shard in shards)
    totals["soft_label_sum"] = sum(shard["soft_label_sum"] for shard in shards)
    return totals


def _tensor_names(manifest: dict[str, Any]) -> list[str]:
    return [n for n in SHARD_TENSORS if manifest["format_version"] >= 2 or n not in TARGET_TENSORS]


def shard_problem(data_dir: str | Path, manifest: dict[str, Any], entry: dict[str, Any]) -> str | None:
    """What is wrong with the shard of a manifest entry (missing, damaged, unreadable, another shape), or None.

    Entries written by this version carry the shard's SHA-256, which catches damage that keeps the file's size; older
    ones are checked for readability and shape only.
    """
    if entry["file"] is None:
        return None
    path = Path(data_dir) / entry["file"]
    if not path.is_file():
        return "missing"
    if "sha256" in entry and file_sha256(path) != entry["sha256"]:
        return "damaged (its SHA-256 differs from the one recorded in the manifest)"
    try:
        with safe_open(path, framework="pt") as shard:
            names, positions = set(shard.keys()), shard.get_slice("token").get_shape()[0]
    except (SafetensorError, OSError) as exc:
        return f"unreadable ({exc})"
    if names != set(_tensor_names(manifest)) or positions != entry["positions"]:
        return "not the shard its manifest entry describes (other tensors or positions)"
    return None


def load_collection(data_dir: str | Path) -> Collection:
    """Loads every shard of a collection directory (see [`collect`]) into one [`Collection`].

    Raises `ValueError` when the manifest is missing or a shard is missing, corrupt or disagrees with the manifest.
    """
    data_dir = Path(data_dir)
    manifest = read_manifest(data_dir)
    for entry in manifest["shards"]:  # every shard before any is used: a broken one is named before training
        problem = shard_problem(data_dir, manifest, entry)
        if problem is not None:
            raise ValueError(
                f"Shard `{data_dir / entry['file']}` is {problem}. Run the `pacer-hf collect` command that wrote "
                f"`{data_dir}` again (same arguments): it re-collects the prompts of every broken shard."
            )
    names = _tensor_names(manifest)
    parts: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    offset = 0
    for entry in manifest["shards"]:
        if entry["file"] is None:
            continue
        shard = load_file(data_dir / entry["file"])
        for name in names:
            parts[name].append(shard[name][1:] + offset if name == "sequence_offsets" else shard[name])
        offset += entry["positions"]
    if not manifest["shards"] or offset == 0:
        raise ValueError(f"The collection `{data_dir}` holds no positions; run `pacer-hf collect` on more prompts.")
    tensors = {name: torch.cat(chunks) for name, chunks in parts.items()}
    tensors["sequence_offsets"] = torch.cat([torch.zeros(1, dtype=torch.long), tensors["sequence_offsets"]])
    tensors["greedy_label"] = tensors["greedy_label"].float()
    return Collection(manifest=manifest, **tensors)


# ---- per-sequence work ------------------------------------------------------------------------------------------


def _greedy_continuation(
    target: PreTrainedModel, draft: PreTrainedModel, head: PacerHead, ids: list[int], max_new_tokens: int,
    tokenizers: dict[str, Any],
) -> torch.LongTensor:
    """Prompt + the target's greedy continuation `[P + N]`, drafted with an always-pass head (lossless).

    The settings are explicit so the model's `generation_config` cannot add processors: the labels are for plain
    greedy decoding on raw logits (no repetition penalty). `tokenizers`: the `tokenizer` and `assistant_tokenizer`
    of a padded pair (empty otherwise).
    """
    generation_config = GenerationConfig(
        do_sample=False, repetition_penalty=1.0, max_new_tokens=max_new_tokens,
        eos_token_id=target.generation_config.eos_token_id,
        pad_token_id=target.generation_config.pad_token_id or target.generation_config.eos_token_id,
    )
    input_ids = torch.tensor([ids], device=target.device)
    with torch.no_grad():
        out = target.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), generation_config=generation_config,
            assistant_model=draft, pacer_head=head, pacer_phrases=False, **tokenizers,
        )
    return out[0].cpu()


def _teacher_forced(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    sequences: list[tuple[int, torch.LongTensor, int]],
    config: CollectionConfig,
) -> list[dict[str, torch.Tensor]]:
    """One forward of each model over a batch of `(prompt_index, ids [P + N], P)` sequences; per-position records."""
    lengths = [ids.shape[0] for _, ids, _ in sequences]
    batch = torch.zeros(len(sequences), max(lengths), dtype=torch.long)  # [B, L]
    for row, (_, ids, _) in enumerate(sequences):
        batch[row, : ids.shape[0]] = ids
    # Right padding needs no attention mask: under the causal mask no real position attends to a later pad.
    with torch.no_grad():
        target_out = target(batch.to(target.device), use_cache=False, output_hidden_states=True)
        draft_out = draft(batch.to(draft.device), use_cache=False, output_hidden_states=True)
    records = []
    for row, (prompt_index, ids, prompt_len) in enumerate(sequences):
        rows = slice(prompt_len - 1, ids.shape[0] - 1)  # logits at t - 1 give token t, t in [P, P + N)
        p_logits = target_out.logits[row, rows].float().cpu()  # [N, V]
        q_logits = _at_width(draft_out.logits[row, rows].float().cpu(), p_logits.shape[-1])  # [N, V]
        drafted = q_logits.argmax(dim=-1)  # [N]: the greedy draft token
        p_t = (p_logits / config.temperature).softmax(dim=-1)  # [N, V]
        q_t = (q_logits / config.temperature).softmax(dim=-1)  # [N, V]
        generator = torch.Generator().manual_seed(config.seed * 2**32 + prompt_index)
        sampled = torch.multinomial(q_t, 1, generator=generator).squeeze(-1)  # [N]
        records.append({
            "hidden": draft_out.hidden_states[-1][row, rows].to(torch.bfloat16).cpu(),  # [N, H]
            "features": draft_distribution_features(q_logits, drafted),  # [N, 3]
            "sampling_features": draft_distribution_features(q_logits / config.temperature, sampled),  # [N, 3]
            "greedy_label": (drafted == p_logits.argmax(dim=-1)).to(torch.uint8),  # [N]
            "soft_label": torch.minimum(p_t, q_t).sum(dim=-1),  # [N]
            "target_hidden": target_out.hidden_states[-1][row, rows].to(torch.bfloat16).cpu(),  # [N, H_target]
            "target_features": target_distribution_features(p_logits),  # [N, 3]
            "token": ids[prompt_len:],  # [N]
            "prompt_index": torch.tensor([prompt_index]),
            "numerics_mismatches": int((p_logits.argmax(dim=-1) != ids[prompt_len:]).sum()),
        })
    return records


def _at_width(logits: torch.Tensor, width: int) -> torch.Tensor:
    """Draft logits `[N, V_draft]` at the target's vocabulary width, as drafting sees them: rows the target lacks
    dropped, rows the draft lacks impossible (-inf)."""
    if logits.shape[-1] >= width:
        return logits[:, :width]
    return torch.cat([logits, logits.new_full((logits.shape[0], width - logits.shape[-1]), float("-inf"))], dim=-1)


def _write_shard(path: Path, records: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    """Saves the records of one shard atomically and returns its manifest entry (without the prompt lists)."""
    tensors = {name: torch.cat([r[name] for r in records]) for name in SHARD_TENSORS if name != "sequence_offsets"}
    lengths = torch.tensor([r["token"].shape[0] for r in records])
    tensors["sequence_offsets"] = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])  # [S + 1]
    write_file_atomic(path, lambda tmp: save_file(tensors, tmp, metadata={"format": FORMAT_NAME}))
    return {
        "file": path.name,
        "sha256": file_sha256(path),
        "sequences": len(records),
        "positions": int(lengths.sum()),
        "greedy_accepts": int(tensors["greedy_label"].sum()),
        "soft_label_sum": round(float(tensors["soft_label"].double().sum()), 6),
        "numerics_mismatches": sum(r["numerics_mismatches"] for r in records),
    }


# A shard whose prompts were all skipped has no file.
_EMPTY_SHARD = {
    "file": None, "sequences": 0, "positions": 0, "greedy_accepts": 0, "soft_label_sum": 0.0, "numerics_mismatches": 0
}


def _chunks(items: list[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _skip_reason(ids: list[int], max_new_tokens: int, context: int | None) -> str | None:
    if not ids:
        return "empty prompt"
    if context is not None and len(ids) + max_new_tokens > context:
        return (f"prompt of {len(ids)} tokens + max_new_tokens {max_new_tokens} exceeds the models' context of "
                f"{context} tokens")
    return None


# ---- the job ----------------------------------------------------------------------------------------------------


def collect(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    prompts: Sequence[PromptInput],
    output_dir: str | Path,
    *,
    tokenizer: Any = None,
    draft_tokenizer: Any = None,
    config: CollectionConfig | None = None,
    prompt_source: str | None = None,
) -> dict[str, Any]:
    """Collects teacher-forced PACER training data for a draft/target pair into `output_dir` (resumable).

    Shards `shard-NNNNN.safetensors` hold `shard_size` consecutive pending prompts each; `manifest.json` records both
    models, the settings, a hash of the prompts and per-shard counts. A shard and then the manifest are replaced
    atomically, so an interrupted run (kill, full disk) loses at most the shard in progress, and running the same
    call again continues with the first unfinished prompt. Each shard's SHA-256 is in the manifest: a shard that is
    missing or damaged is collected again by the same call. A directory holding another pair's data is refused.

    Args:
        target (`PreTrainedModel`): the target model, whose greedy continuations and acceptances are recorded.
        draft (`PreTrainedModel`): the draft model; shares the target's vocabulary.
        prompts (`Sequence[str | list[int]]`): text prompts (need `tokenizer`) or token ids; see [`pacer_hf.prompts.load_prompt_set`].
        output_dir (`str` or `Path`): shard directory, created if needed.
        tokenizer (*optional*): the target's tokenizer, for text prompts and the chat template.
        draft_tokenizer (*optional*): the draft's tokenizer; needed (with `tokenizer`) when the two models pad their
            embeddings differently, to check that they share one vocabulary.
        config ([`CollectionConfig`], *optional*): collection settings; defaults to `CollectionConfig()`.
        prompt_source (`str`, *optional*): where the prompts came from, recorded in the manifest.

    Returns:
        `dict`: the final manifest.
    """
    config = config if config is not None else CollectionConfig()
    if len(prompts) == 0:
        raise ValueError("`prompts` is empty; give at least one prompt.")
    head = PacerHead(PacerHeadConfig.for_draft(
        draft, threshold=0.0, block_size=config.draft_length, max_draft=config.draft_length,  # fixed-length drafting
    )).to(draft.device)
    check_pair_compatible(head.config, draft, target, tokenizer, draft_tokenizer)
    padded = model_sizes(draft)[0] != model_sizes(target)[0]
    tokenizers = {"tokenizer": tokenizer, "assistant_tokenizer": draft_tokenizer} if padded else {}
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    token_ids = _tokenize(prompts, tokenizer, config.chat_template)
    draft_id, target_id = model_identity(draft), model_identity(target)
    contexts = [c for c in (draft_id["context_length"], target_id["context_length"]) if c]
    context = min(contexts) if contexts else None
    manifest = _open_manifest(output_dir, {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "pacer_hf_version": __version__,
        "draft": draft_id,
        "target": target_id,
        "hidden_dtype": "bfloat16",
        "prompt_source": prompt_source,
        "num_prompts": len(token_ids),
        # max_prompts and draft_length may change between resumed runs (neither changes the data); the rest must match
        "collection": {k: v for k, v in dataclasses.asdict(config).items() if k not in ("max_prompts", "draft_length")},
        "prompts_sha256": hashlib.sha256(json.dumps(token_ids).encode()).hexdigest(),
        "shards": [],
        "totals": _totals([]),
    })
    done = {i for shard in manifest["shards"] for i in shard["prompts"]}
    done |= {s["prompt"] for shard in manifest["shards"] for s in shard["skipped"]}
    wanted = range(min(len(token_ids), config.max_prompts or len(token_ids)))
    pending = [i for i in wanted if i not in done]
    # A shard that fails its check (missing, damaged) is collected again under its own name, in its own slot.
    broken = [index for index, entry in enumerate(manifest["shards"])
              if shard_problem(output_dir, manifest, entry) is not None]
    work = [(index, _shard_prompts(manifest["shards"][index])) for index in broken]
    work += [(None, chunk) for chunk in _chunks(pending, config.shard_size)]
    bar = tqdm(total=len(wanted) + sum(len(prompts) for index, prompts in work if index is not None),
               initial=len(wanted) - len(pending), unit="prompt", desc="collect")
    for index, prompts in work:
        slot = len(manifest["shards"]) if index is None else index
        entry = _collect_shard(target, draft, head, tokenizers, token_ids, prompts, context, config,
                               output_dir / f"shard-{slot:05d}.safetensors", bar)
        if index is None:
            manifest["shards"].append(entry)
        else:
            manifest["shards"][index] = entry
        manifest["totals"] = _totals(manifest["shards"])
        write_json_atomic(output_dir / MANIFEST_NAME, manifest)
    bar.close()
    _report_skipped(manifest)
    return manifest


def _shard_prompts(entry: dict[str, Any]) -> list[int]:
    """The prompts a shard covers, collected and skipped, in order."""
    return sorted(entry["prompts"] + [s["prompt"] for s in entry["skipped"]])


def _collect_shard(
    target: PreTrainedModel, draft: PreTrainedModel, head: PacerHead, tokenizers: dict[str, Any],
    token_ids: list[list[int]], prompts: list[int],
    context: int | None, config: CollectionConfig, path: Path, bar: tqdm,
) -> dict[str, Any]:
    """Collects `prompts` into the shard file `path`; returns its manifest entry."""
    records, prompts_done, skipped = [], [], []
    start, new_tokens = time.perf_counter(), 0
    for batch in _chunks(prompts, config.batch_size):
        sequences = []
        for i in batch:
            reason = _skip_reason(token_ids[i], config.max_new_tokens, context)
            if reason is not None:
                skipped.append({"prompt": i, "reason": reason})
                continue
            full = _greedy_continuation(target, draft, head, token_ids[i], config.max_new_tokens, tokenizers)
            sequences.append((i, full, len(token_ids[i])))
        if sequences:
            records += _teacher_forced(target, draft, sequences, config)
        prompts_done += [i for i, _, _ in sequences]
        new_tokens += sum(ids.shape[0] - prompt_len for _, ids, prompt_len in sequences)
        bar.update(len(batch))
        bar.set_postfix(tokens_per_s=f"{new_tokens / (time.perf_counter() - start):.1f}")
    entry = _write_shard(path, records) if records else _EMPTY_SHARD
    return {**entry, "prompts": prompts_done, "skipped": skipped}


def _report_skipped(manifest: dict[str, Any]) -> None:
    skipped = [s for shard in manifest["shards"] for s in shard["skipped"]]
    if skipped and len(skipped) == manifest["totals"]["prompts_done"]:
        raise ValueError(
            f"Every prompt was skipped, e.g. prompt {skipped[0]['prompt']}: {skipped[0]['reason']}. Use shorter "
            "prompts or a smaller `max_new_tokens`."
        )
    if skipped:
        warnings.warn(
            f"{len(skipped)} prompts were skipped (listed in the manifest), e.g. prompt {skipped[0]['prompt']}: "
            f"{skipped[0]['reason']}.",
            UserWarning,
            stacklevel=3,
        )
