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
import io
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Sampler

from pacer_core.config import PacerHeadConfig
from pacer_core.files import write_json_atomic
from pacer_core.head import PacerHead
from pacer_core.pair import check_head_sizes

from .calibration import calibrate_entropy_rule, entropy_rule_config
from .collection import Collection, load_collection
from .hub import METRICS_NAME, PLOT_NAME
from .rounds import RoundBatcher, Rounds, calibration_metrics, evaluate_head, predict_rounds
from .threshold import CostModel, plot_threshold_curve

RUN_NAME = "training_run.json"
CHECKPOINTS_DIR = "checkpoints"
RUNNER_UP_DIR = "runner-up"  # the stop that lost the comparison, kept
LATEST_NAME = "latest.json"
PROGRESS_NAME = "progress.json"


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
    """What [`train`] returns: the saved stop (the trained head with its threshold, or the entropy rule at its
    calibrated threshold, whichever is faster on the validation prompts) and the metrics of `training_metrics.json`."""

    head: PacerHead
    metrics: dict[str, Any]


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
    check_head_sizes(base, draft["vocab_size"], draft["hidden_size"], f"the data's draft `{draft['name_or_path']}`",
                     fix="Use a `head_config` for that draft or leave it unset.")
    return dataclasses.replace(
        base,
        draft_name_or_path=draft["name_or_path"], draft_revision=draft["revision"],
        draft_fingerprint=draft.get("fingerprint"),  # absent from collections written before fingerprints
        target_name_or_path=target["name_or_path"], target_revision=target["revision"],
        target_vocab_size=target["vocab_size"], temperature=manifest["collection"]["temperature"],
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
    """Trains a PACER head on a collection, chooses its threshold, compares it with the entropy rule at its best
    threshold ([`calibrate_entropy_rule`]) and saves the faster of the two to `output_dir` (the other goes to
    `output_dir/runner-up`).

    Run it under `accelerate launch` for several GPUs or nodes; on one CPU it runs as is. Each epoch ends with a
    checkpoint (`accelerator.save_state`: model, optimiser, RNG states; epoch and global step in `progress.json`);
    `resume=True` continues from the latest one and ends with the same head as an uninterrupted run. Both stops are
    judged on the validation prompts by expected speed under `cost`, in the head's decoding mode; the saved one
    records both models' identity, and `training_metrics.json` (with the comparison, `stop_comparison`) and
    `threshold_curve.png` go next to it, in the same atomic save.

    Args:
        data_dir (`str` or `Path`): a collection written by [`pacer_hf.collect`].
        output_dir (`str` or `Path`): where the head, metrics, plot and checkpoints go.
        cost ([`CostModel`]): the pair's cost ratios, from `--cost-ratio` or [`measure_cost_model`].
        head_config ([`PacerHeadConfig`], *optional*): head architecture and drafting settings; the pair identity
            is filled in from the data. Defaults to `PacerHeadConfig` defaults.
        config ([`TrainingConfig`], *optional*): optimisation settings; defaults to `TrainingConfig()`.
        resume (`bool`, defaults to `False`): continue the run in `output_dir` from its latest checkpoint.

    Returns:
        [`TrainResult`]: the saved stop and the metrics.
    """
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm

    if head_config is not None and head_config.architecture == "entropy":
        raise ValueError(
            "The `entropy` architecture is a rule with no weights: there is nothing to train. Build it with "
            "`PacerHead.entropy_stop(draft)`, or train an `attention` or `mlp` head."
        )
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
    batcher = RoundBatcher(collection, head_config)
    train_rounds = Rounds(collection, train_sequences, head_config.max_draft)
    val_rounds = Rounds(collection, val_sequences, head_config.max_draft)
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
        val = calibration_metrics(*predict_rounds(accelerator.unwrap_model(head), batcher, val_rounds.rounds))
        accelerator.print(
            f"epoch {epoch + 1}: val AUC {val['auc']:.4f}, ECE {val['ece']:.4f}, log loss {val['log_loss']:.4f}"
        )
        _save_checkpoint(accelerator, output_dir, progress)

    head = accelerator.unwrap_model(head).eval()
    val, report = evaluate_head(head, collection, val_sequences, cost)
    head.config = dataclasses.replace(head_config, threshold=report.best_threshold)
    # The same data, split and expected-speed model for the training-free rule: the faster of the two is saved.
    rule_report = calibrate_entropy_rule(collection, val_sequences, head.config, cost)
    rule = PacerHead(entropy_rule_config(head.config, rule_report.entropy_threshold)).eval()
    saved, runner_up = (head, rule) if report.best_speedup >= rule_report.speedup else (rule, head)
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
        "stop_comparison": {
            "saved": saved.config.architecture,
            "head": {"architecture": head.config.architecture, "threshold": report.best_threshold,
                     "expected_speedup": report.best_speedup},
            "entropy_rule": {"entropy_threshold": rule_report.entropy_threshold,
                             "expected_speedup": rule_report.speedup, "curve": rule_report.curve},
            "oracle_speedup": report.oracle_speedup,
        },
    }
    accelerator.print(report.format())
    accelerator.print(
        f"val AUC {val['auc']:.4f}, ECE {val['ece']:.4f}. Expected speed-up on the validation prompts: the trained "
        f"head {report.best_speedup:.3f} (threshold {report.best_threshold}), the entropy rule "
        f"{rule_report.speedup:.3f} ({rule_report.entropy_threshold} nats), oracle stop {report.oracle_speedup:.3f}. "
        f"Saved: the {'trained head' if saved is head else 'entropy rule'}; the other in {RUNNER_UP_DIR}/."
    )
    if accelerator.is_main_process:
        plot = io.BytesIO()
        plot_threshold_curve(report, plot)
        extra = {METRICS_NAME: (json.dumps(metrics, indent=2) + "\n").encode(), PLOT_NAME: plot.getvalue()}
        # one commit each: a folder never holds new weights beside old metrics, or a head without its config
        runner_up.save_pretrained(output_dir / RUNNER_UP_DIR, model_card_kwargs={"metrics": metrics})
        saved.save_pretrained(output_dir, model_card_kwargs={"metrics": metrics}, extra_files=extra)
    accelerator.wait_for_everyone()
    return TrainResult(head=saved, metrics=metrics)

