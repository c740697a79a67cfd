"""Training a PACER head on collected data with `accelerate` (one CPU, several GPUs or nodes, unchanged).

Examples are rounds as drafting meets them: a round starts at the sequence start and, as an always-pass drafter
with `max_draft` proceeds, after each rejection or after a fully accepted round; it spans up to `max_draft`
positions. The head is causal over a round and positioned by round-local index, so one forward over the whole
round gives at every position the logit that the blockwise calls at inference give. A position's label counts only
while all earlier positions of its round were accepted (weight = product of the earlier labels: a 0/1 mask for
greedy labels, the probability of reaching it for sampling labels). After training the threshold is chosen on the
validation prompts by expected speed ([`pacer_hf.threshold.choose_threshold`]).

Notation: B = rounds per batch, W = `max_draft`, H = draft hidden size, F = features.
"""

import dataclasses
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Sampler

from .collection import Collection, load_collection, write_json_atomic
from .config import PacerHeadConfig
from .head import PacerHead
from .threshold import CostModel, ThresholdReport, choose_threshold, plot_threshold_curve

METRICS_NAME = "training_metrics.json"
PLOT_NAME = "threshold_curve.png"
RUN_NAME = "training_run.json"
CHECKPOINTS_DIR = "checkpoints"
LATEST_NAME = "latest.json"
PROGRESS_NAME = "progress.json"
# Bins of the expected calibration error.
ECE_BINS = 10
# Rounds per head forward when scoring validation data (memory, not results).
EVAL_BATCH_SIZE = 256


@dataclass
class TrainingConfig:
    """Optimisation settings of `pacer-hf train`.

    Args:
        epochs (`int`, defaults to 5): passes over the training rounds.
        batch_size (`int`, defaults to 64): rounds per optimiser step (per process).
        learning_rate (`float`, defaults to 1e-3): AdamW learning rate.
        weight_decay (`float`, defaults to 0.01): AdamW weight decay.
        max_grad_norm (`float`, defaults to 1.0): gradient clipping norm.
        val_fraction (`float`, defaults to 0.1): share of prompts held out for validation and threshold choice.
        reject_weight (`float`, *optional*): loss weight of a rejection relative to an acceptance; `None` balances
            the classes (accepted / rejected label mass of the training rounds).
        seed (`int`, defaults to 0): seed of the initialisation, the validation split and the data order.
    """

    epochs: int = field(default=5, metadata={"help": "Passes over the training rounds."})
    batch_size: int = field(default=64, metadata={"help": "Rounds per optimiser step (per process)."})
    learning_rate: float = field(default=1e-3, metadata={"help": "AdamW learning rate."})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm."})
    val_fraction: float = field(default=0.1, metadata={"help": "Share of prompts held out for validation."})
    reject_weight: float | None = field(default=None, metadata={"help": "Loss weight of a rejection; None: balanced."})
    seed: int = field(default=0, metadata={"help": "Seed of init, split and data order."})

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
        for name in ("learning_rate", "max_grad_norm"):
            if not getattr(self, name) > 0:
                raise ValueError(f"`{name}` must be > 0, got {getattr(self, name)!r}.")
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"`val_fraction` must be in (0, 1), got {self.val_fraction!r}.")
        if self.reject_weight is not None and not self.reject_weight > 0:
            raise ValueError(f"`reject_weight` must be > 0 or None, got {self.reject_weight!r}.")


@dataclass
class TrainResult:
    """What [`train`] returns: the trained head (threshold set) and the metrics written to `training_metrics.json`."""

    head: PacerHead
    metrics: dict[str, Any]


# ---- rounds -----------------------------------------------------------------------------------------------------


def round_starts(greedy_labels: np.ndarray, max_draft: int) -> list[int]:
    """Start positions of the rounds an always-pass drafter meets on one sequence: after a rejection, or after a
    fully accepted round of `min(max_draft, n - t - 1)` tokens (the target adds one token either way)."""
    n, starts, t = greedy_labels.shape[0], [], 0
    while t < n:
        starts.append(t)
        cap = min(max_draft, n - t - 1)
        rejected = np.flatnonzero(greedy_labels[t : t + cap] == 0)
        t += (int(rejected[0]) if rejected.size else cap) + 1
    return starts


class _Rounds(Dataset):
    """Rounds of a set of sequences; item i is `(first global position, length)`. The rounds are cut by the greedy
    labels in both decoding modes: for sampling labels they stand for the rounds a typical run meets."""

    def __init__(self, collection: Collection, sequences: list[int], max_draft: int):
        slices = collection.sequence_slices()
        greedy = collection.greedy_label.numpy()
        rounds = []
        for s in sequences:
            span = slices[s]
            for t in round_starts(greedy[span], max_draft):
                rounds.append((span.start + t, min(max_draft, span.stop - span.start - t)))
        self.rounds = torch.tensor(rounds, dtype=torch.long).reshape(-1, 2)  # [R, 2]

    def __len__(self) -> int:
        return self.rounds.shape[0]

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.rounds[index]


class _Batcher:
    """Gathers padded round tensors from the collection (the collate function of the data loader)."""

    def __init__(self, collection: Collection, config: PacerHeadConfig):
        self.collection, self.width = collection, config.max_draft
        sampling = config.decoding == "sampling"
        self.features = collection.sampling_features if sampling else collection.features
        self.labels = collection.soft_label if sampling else collection.greedy_label

    def targets(self, rounds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Positions `[B, W]`, labels `[B, W]` and weights `[B, W]` of `rounds` `[B, 2]`; the weight of a position
        is the probability that all earlier positions of its round were accepted (0 past the round's end)."""
        offsets = torch.arange(self.width)  # [W]
        valid = offsets[None, :] < rounds[:, 1:2]  # [B, W]
        index = torch.where(valid, rounds[:, :1] + offsets[None, :], 0)  # [B, W]
        labels = self.labels[index] * valid  # [B, W]
        reach = torch.cumprod(torch.cat([torch.ones_like(labels[:, :1]), labels[:, :-1]], dim=1), dim=1)  # [B, W]
        return index, labels, reach * valid

    def __call__(self, items: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        index, labels, weights = self.targets(torch.stack(items))
        return {
            "hidden": self.collection.hidden[index].float(),  # [B, W, H]
            "features": self.features[index],  # [B, W, F]
            "labels": labels,  # [B, W]
            "weights": weights,  # [B, W]
        }


class _EpochSampler(Sampler[int]):
    """A permutation of the rounds fixed by `(seed, epoch)`: the data order is a function of the epoch alone, so a
    resumed run sees the same batches as an uninterrupted one."""

    def __init__(self, size: int, seed: int):
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return iter(torch.randperm(self.size, generator=generator).tolist())


def _round_loss(
    logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, log_reject_weight: float
) -> torch.Tensor:
    """Weighted BCE with rejections up-weighted by r = exp(`log_reject_weight`).

    Weighting shifts the loss-minimising logit to logit(p) - log r, so the loss reads the head's logit shifted by
    -log r (logit adjustment, Menon et al. 2021): gradients see balanced classes, and the head itself stays
    calibrated, which the pass score (a product of its probabilities) and the threshold rely on.
    """
    shifted = logits - log_reject_weight  # [B, W]
    per_position = labels * F.softplus(-shifted) + math.exp(log_reject_weight) * (1 - labels) * F.softplus(shifted)
    return (weights * per_position).sum() / weights.sum().clamp(min=1e-8)


# ---- evaluation -------------------------------------------------------------------------------------------------


def _predict_rounds(head: PacerHead, batcher: _Batcher, rounds: torch.Tensor) -> tuple[np.ndarray, ...]:
    """Acceptance probabilities, labels and weights of the valid positions of `rounds` `[R, 2]`."""
    device = next(head.parameters()).device
    probs, labels, weights = [], [], []
    with torch.no_grad():
        for chunk in rounds.split(EVAL_BATCH_SIZE):
            batch = batcher(list(chunk))
            logits = head(batch["hidden"].to(device), batch["features"].to(device)).float().cpu()
            keep = batch["weights"] > 0
            probs.append(torch.sigmoid(logits)[keep])
            labels.append(batch["labels"][keep])
            weights.append(batch["weights"][keep])
    return tuple(torch.cat(x).double().numpy() for x in (probs, labels, weights))


def calibration_metrics(probs: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> dict[str, float]:
    """Weighted ROC AUC, expected calibration error and log loss of predicted acceptance probabilities.

    Soft labels enter the AUC as a positive of weight w·y plus a negative of weight w·(1 - y).
    """
    from sklearn.metrics import roc_auc_score

    both = np.concatenate([probs, probs])
    truth = np.concatenate([np.ones_like(labels), np.zeros_like(labels)])
    mass = np.concatenate([weights * labels, weights * (1 - labels)])
    auc = float(roc_auc_score(truth, both, sample_weight=mass)) if 0 < labels.mean() < 1 else float("nan")
    bins = np.minimum((probs * ECE_BINS).astype(int), ECE_BINS - 1)
    ece = 0.0
    for b in range(ECE_BINS):
        in_bin = bins == b
        if weights[in_bin].sum() > 0:
            mass = weights[in_bin]
            gap = np.average(labels[in_bin], weights=mass) - np.average(probs[in_bin], weights=mass)
            ece += mass.sum() / weights.sum() * abs(gap)
    clipped = np.clip(probs, 1e-7, 1 - 1e-7)
    log_loss = -np.average(labels * np.log(clipped) + (1 - labels) * np.log(1 - clipped), weights=weights)
    return {"auc": auc, "ece": float(ece), "log_loss": float(log_loss), "positions": int((weights > 0).sum())}


def window_logprobs(head: PacerHead, batcher: _Batcher, span: slice) -> np.ndarray:
    """Log acceptance probabilities `(n, W)` of a round starting at every position of one sequence."""
    starts = torch.arange(span.start, span.stop)  # [n]
    rounds = torch.stack([starts, (span.stop - starts).clamp(max=batcher.width)], dim=1)  # [n, 2]
    device = next(head.parameters()).device
    out = []
    with torch.no_grad():
        for chunk in rounds.split(EVAL_BATCH_SIZE):
            batch = batcher(list(chunk))
            out.append(F.logsigmoid(head(batch["hidden"].to(device), batch["features"].to(device)).float().cpu()))
    return torch.cat(out).double().numpy()


def _scoring_config(head: PacerHead, decoding: str | None) -> PacerHeadConfig:
    """The head's config, scored with the labels and features of `decoding` when given."""
    return head.config if decoding is None else dataclasses.replace(head.config, decoding=decoding)


def head_metrics(
    head: PacerHead, collection: Collection, sequences: list[int], decoding: str | None = None
) -> dict[str, float]:
    """[`calibration_metrics`] of `head` over the rounds of `sequences`, with the labels and features of `decoding`
    (default: the head's own `config.decoding`)."""
    config = _scoring_config(head, decoding)
    rounds = _Rounds(collection, sequences, config.max_draft)
    return calibration_metrics(*_predict_rounds(head, _Batcher(collection, config), rounds.rounds))


def evaluate_head(
    head: PacerHead, collection: Collection, sequences: list[int], cost: CostModel, decoding: str | None = None
) -> tuple[dict[str, float], ThresholdReport]:
    """Calibration metrics of `head` on the rounds of `sequences`, and the expected-speed threshold report there.

    Args:
        head ([`PacerHead`]): the head, in eval mode.
        collection (`Collection`): the data, from [`pacer_hf.load_collection`].
        sequences (`list[int]`): the sequences to score (validation sequences, see [`split_sequences`]).
        cost ([`CostModel`]): the pair's cost ratios.
        decoding (`str`, *optional*): the labels and features to score with, `"greedy"` or `"sampling"`; defaults to
            the head's own `config.decoding` (another mode tells how a head transfers).
    """
    config = _scoring_config(head, decoding)
    batcher = _Batcher(collection, config)
    metrics = head_metrics(head, collection, sequences, decoding)
    slices = collection.sequence_slices()
    position_labels = batcher.labels.double().numpy()
    report = choose_threshold(
        [position_labels[slices[s]] for s in sequences],
        [window_logprobs(head, batcher, slices[s]) for s in sequences],
        config, cost,
    )
    return metrics, report


# ---- checkpoints ------------------------------------------------------------------------------------------------


def _save_checkpoint(accelerator: Any, output_dir: Path, progress: dict[str, int]) -> None:
    """`accelerator.save_state` into a temporary folder, renamed into place once complete; `latest.json` then
    points at it. A kill mid-save leaves the previous checkpoint in charge."""
    root = output_dir / CHECKPOINTS_DIR
    name = f"epoch-{progress['epoch']:04d}"
    tmp, final = root / f".tmp-{name}", root / name
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    if accelerator.is_main_process:
        (tmp / PROGRESS_NAME).write_text(json.dumps(progress))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        write_json_atomic(root / LATEST_NAME, {"checkpoint": name})
        for old in root.glob("epoch-*"):
            if old.name != name:
                shutil.rmtree(old)
    accelerator.wait_for_everyone()


def _latest_checkpoint(output_dir: Path) -> Path | None:
    latest = output_dir / CHECKPOINTS_DIR / LATEST_NAME
    if not latest.is_file():
        return None
    return output_dir / CHECKPOINTS_DIR / json.loads(latest.read_text())["checkpoint"]


# ---- the job ----------------------------------------------------------------------------------------------------


def _head_config_for(collection: Collection, head_config: PacerHeadConfig | None) -> PacerHeadConfig:
    """The head config: `head_config`'s settings (defaults when None) with the pair identity of the data."""
    manifest = collection.manifest
    draft, target = manifest["draft"], manifest["target"]
    base = head_config if head_config is not None else PacerHeadConfig(
        vocab_size=draft["vocab_size"], draft_hidden_size=draft["hidden_size"]
    )
    if (base.vocab_size, base.draft_hidden_size) != (draft["vocab_size"], draft["hidden_size"]):
        raise ValueError(
            f"`head_config` is for a draft with vocab_size={base.vocab_size}, hidden size {base.draft_hidden_size}, "
            f"but the data was collected with `{draft['name_or_path']}` (vocab_size={draft['vocab_size']}, hidden "
            f"size {draft['hidden_size']}). Use a config for that draft or leave `head_config` unset."
        )
    return dataclasses.replace(
        base,
        draft_name_or_path=draft["name_or_path"], draft_revision=draft["revision"],
        target_name_or_path=target["name_or_path"], target_revision=target["revision"],
        temperature=manifest["collection"]["temperature"],
    )


def split_sequences(collection: Collection, config: TrainingConfig) -> tuple[list[int], list[int]]:
    """Training and validation sequences of `collection`, split by prompt (fixed by `config.seed` and
    `config.val_fraction`)."""
    prompts = sorted(set(collection.prompt_index.tolist()))
    if len(prompts) < 2:
        raise ValueError(
            f"The collection holds {len(prompts)} prompt(s); training needs at least 2 (one for validation). "
            "Collect more prompts."
        )
    order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(config.seed)).tolist()
    num_val = min(max(1, round(config.val_fraction * len(prompts))), len(prompts) - 1)
    val_prompts = {prompts[i] for i in order[:num_val]}
    sequences = range(collection.num_sequences)
    by_prompt = collection.prompt_index.tolist()
    return ([s for s in sequences if by_prompt[s] not in val_prompts],
            [s for s in sequences if by_prompt[s] in val_prompts])


def _check_run(output_dir: Path, run: dict[str, Any], resume: bool) -> None:
    """Records the run's settings; refuses to overwrite another run or to resume one with other settings."""
    path = output_dir / RUN_NAME
    if path.exists():
        if not resume:
            raise ValueError(
                f"`output_dir` `{output_dir}` already holds a training run; pass `resume=True` (`--resume`) to "
                "continue it, or choose another directory."
            )
        previous = json.loads(path.read_text())
        if previous != run:
            changed = sorted(k for k in run if previous.get(k) != run[k])
            raise ValueError(
                f"Cannot resume the run in `{output_dir}` with different {changed}; rerun with the original settings "
                "or train into another directory."
            )
    output_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, run)


def train(
    data_dir: str | Path,
    output_dir: str | Path,
    *,
    cost: CostModel,
    head_config: PacerHeadConfig | None = None,
    config: TrainingConfig | None = None,
    resume: bool = False,
) -> TrainResult:
    """Trains a PACER head on a collection, chooses its threshold and saves it to `output_dir`.

    Run it under `accelerate launch` for several GPUs or nodes; on one CPU it runs as is. Each epoch ends with a
    checkpoint (`accelerator.save_state`: model, optimiser, RNG states; epoch and global step in `progress.json`);
    `resume=True` continues from the latest one and ends with the same head as an uninterrupted run. The head is
    saved with the chosen threshold, its block size and both models' identity; `training_metrics.json` and
    `threshold_curve.png` go next to it.

    Args:
        data_dir (`str` or `Path`): a collection written by [`pacer_hf.collect`].
        output_dir (`str` or `Path`): where the head, metrics, plot and checkpoints go.
        cost ([`CostModel`]): the pair's cost ratios, from `--cost-ratio` or [`measure_cost_model`].
        head_config ([`PacerHeadConfig`], *optional*): head architecture and drafting settings; the pair identity
            is filled in from the data. Defaults to `PacerHeadConfig` defaults.
        config ([`TrainingConfig`], *optional*): optimisation settings; defaults to `TrainingConfig()`.
        resume (`bool`, defaults to `False`): continue the run in `output_dir` from its latest checkpoint.

    Returns:
        [`TrainResult`].
    """
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm

    started = time.perf_counter()
    config = config if config is not None else TrainingConfig()
    output_dir = Path(output_dir)
    collection = load_collection(data_dir)
    head_config = _head_config_for(collection, head_config)
    accelerator = Accelerator()
    run = {  # what a resumed run must share with the interrupted one
        "data": collection.manifest["totals"],
        "draft": collection.manifest["draft"],
        "head_config": {k: v for k, v in head_config.to_dict().items() if k not in ("threshold", "pacer_hf_version")},
        "training_config": dataclasses.asdict(config),
    }
    if accelerator.is_main_process:
        _check_run(output_dir, run, resume)
    accelerator.wait_for_everyone()

    train_sequences, val_sequences = split_sequences(collection, config)
    batcher = _Batcher(collection, head_config)
    train_rounds = _Rounds(collection, train_sequences, head_config.max_draft)
    val_rounds = _Rounds(collection, val_sequences, head_config.max_draft)
    _, labels, weights = batcher.targets(train_rounds.rounds)
    accepted, rejected = float((weights * labels).sum()), float((weights * (1 - labels)).sum())
    if accepted == 0 or rejected == 0:
        raise ValueError(
            f"The training rounds hold {accepted:.0f} accepted and {rejected:.0f} rejected positions; a head needs "
            "both. Collect more prompts (or check that the draft and target are not identical)."
        )
    reject_weight = config.reject_weight if config.reject_weight is not None else accepted / rejected
    log_reject_weight = math.log(reject_weight)

    set_seed(config.seed)
    head = PacerHead(head_config)
    with torch.no_grad():
        # Start from the best constant, the logit of the base acceptance rate, instead of the "always accept"
        # initialisation (CONTINUE_LOGIT): rejections would otherwise cost ~10 nats each and the first steps would
        # only move the bias. The classifier weight is zero, so this is exactly the initial prediction.
        head.classifier.bias.fill_(math.log(accepted / rejected))
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    sampler = _EpochSampler(len(train_rounds), config.seed)
    loader = DataLoader(train_rounds, batch_size=config.batch_size, sampler=sampler, collate_fn=batcher)
    head, optimizer, loader = accelerator.prepare(head, optimizer, loader)

    progress = {"epoch": 0, "global_step": 0}
    checkpoint = _latest_checkpoint(output_dir) if resume else None
    if checkpoint is not None:
        accelerator.load_state(str(checkpoint))
        progress = json.loads((checkpoint / PROGRESS_NAME).read_text())
        accelerator.print(f"resuming from {checkpoint} (epoch {progress['epoch']}, step {progress['global_step']})")

    for epoch in range(progress["epoch"], config.epochs):
        head.train()
        loader.set_epoch(epoch)
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{config.epochs}", disable=not accelerator.is_local_main_process)
        for batch in bar:
            logits = head(batch["hidden"], batch["features"])  # [B, W]
            loss = _round_loss(logits, batch["labels"], batch["weights"], log_reject_weight)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(head.parameters(), config.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad()
            progress["global_step"] += 1
        progress["epoch"] = epoch + 1
        head.eval()
        val = calibration_metrics(*_predict_rounds(accelerator.unwrap_model(head), batcher, val_rounds.rounds))
        accelerator.print(
            f"epoch {epoch + 1}: val AUC {val['auc']:.4f}, ECE {val['ece']:.4f}, log loss {val['log_loss']:.4f}"
        )
        _save_checkpoint(accelerator, output_dir, progress)

    head = accelerator.unwrap_model(head).eval()
    val, report = evaluate_head(head, collection, val_sequences, cost)
    head.config = dataclasses.replace(head_config, threshold=report.best_threshold)
    manifest = collection.manifest
    metrics = {
        "prompt_source": manifest["prompt_source"],
        "collection": manifest["collection"],
        "positions": manifest["totals"]["positions"],
        "train_sequences": len(train_sequences),
        "val_sequences": len(val_sequences),
        "train_rounds": len(train_rounds),
        "val_rounds": len(val_rounds),
        "reject_weight": reject_weight,
        **progress,
        "train_seconds": time.perf_counter() - started,
        "val": val,
        "threshold": report.to_dict(),
    }
    accelerator.print(report.format())
    accelerator.print(f"val AUC {val['auc']:.4f}, ECE {val['ece']:.4f}; threshold {report.best_threshold} saved")
    if accelerator.is_main_process:
        head.save_pretrained(output_dir, model_card_kwargs={"metrics": metrics})
        write_json_atomic(output_dir / METRICS_NAME, metrics)
        plot_threshold_curve(report, output_dir / PLOT_NAME)
    accelerator.wait_for_everyone()
    return TrainResult(head=head, metrics=metrics)

