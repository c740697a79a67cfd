"""Rounds as drafting meets them in collected data, and how well a head predicts their acceptances.

A round starts at the sequence start and, as an always-pass drafter with `max_draft` proceeds, after each rejection
or after a fully accepted round; it spans up to `max_draft` positions. Training ([`pacer_hf.train`]) fits a head on
these rounds; the metrics here score it (calibration and, through [`pacer_hf.threshold.choose_threshold`], expected speed).

Notation: B = rounds per batch, W = `max_draft`, H = draft hidden size, F = features.
"""

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from pacer_core.config import PacerHeadConfig
from pacer_core.head import PacerHead

from .collection import Collection
from .threshold import CostModel, ThresholdReport, choose_threshold

# Bins of the expected calibration error.
ECE_BINS = 10
# Rounds per head forward when scoring validation data (memory, not results).
EVAL_BATCH_SIZE = 256


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


class Rounds(Dataset):
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


class RoundBatcher:
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


# ---- evaluation -------------------------------------------------------------------------------------------------


def predict_rounds(head: PacerHead, batcher: RoundBatcher, rounds: torch.Tensor) -> tuple[np.ndarray, ...]:
    """Acceptance probabilities, labels and weights of the valid positions of `rounds` `[R, 2]`."""
    device = head.device
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


def window_logprobs(head: PacerHead, batcher: RoundBatcher, span: slice) -> np.ndarray:
    """Log acceptance probabilities `(n, W)` of a round starting at every position of one sequence."""
    starts = torch.arange(span.start, span.stop)  # [n]
    rounds = torch.stack([starts, (span.stop - starts).clamp(max=batcher.width)], dim=1)  # [n, 2]
    device = head.device
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
    rounds = Rounds(collection, sequences, config.max_draft)
    return calibration_metrics(*predict_rounds(head, RoundBatcher(collection, config), rounds.rounds))


def evaluate_head(
    head: PacerHead, collection: Collection, sequences: list[int], cost: CostModel, decoding: str | None = None
) -> tuple[dict[str, float], ThresholdReport]:
    """Calibration metrics of `head` on the rounds of `sequences`, and the expected-speed threshold report there.

    Args:
        head ([`PacerHead`]): the head, in eval mode.
        collection (`Collection`): the data, from [`pacer_hf.collection.load_collection`].
        sequences (`list[int]`): the sequences to score (validation sequences, see [`split_sequences`]).
        cost ([`CostModel`]): the pair's cost ratios.
        decoding (`str`, *optional*): the labels and features to score with, `"greedy"` or `"sampling"`; defaults to
            the head's own `config.decoding` (another mode tells how a head transfers).
    """
    config = _scoring_config(head, decoding)
    batcher = RoundBatcher(collection, config)
    metrics = head_metrics(head, collection, sequences, decoding)
    slices = collection.sequence_slices()
    position_labels = batcher.labels.double().numpy()
    report = choose_threshold(
        [position_labels[slices[s]] for s in sequences],
        [window_logprobs(head, batcher, slices[s]) for s in sequences],
        config, cost,
    )
    return metrics, report
