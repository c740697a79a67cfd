"""How much of a head's gap to the oracle stop other cheap inputs could close, measured before building them in.

A logistic stack re-reads a trained head's logit together with candidate inputs. It is fit (weighted BCE on greedy
labels, each round up to its first rejection, as training weighs it) on one prompt range of a collection, its
threshold is chosen there, and it is scored on another range with the expected-speed model. Candidate inputs:

- `history`: the acceptance rate of the sequence's last 32 positions before the round (smoothed towards 0.9). A
  generator knows it from its earlier rounds; the head never sees it, it reads one round.
- `margin`: log q(top-1) - log q(top-2) of the draft distribution at each drafted token. The collection stores
  log q(token), log q(top-1) and the entropy, so the runner-up is recomputed from the stored hidden states with the
  draft's lm_head.

The `head, recalibrated` row stacks nothing (it only rescales and shifts the logit), so a candidate is worth building
into the head only by what it adds over that row. Both ranges must hold prompts the head was not trained on.

    python -m eval.headroom --data runs/qwen-bf16-data-400 --head hub_cards/pacer-qwen2.5-coder-0.5b-to-1.5b \
        --draft qwen2.5-coder-0.5b-instruct --fit-prompts 112:160 --eval-prompts 160:192 \
        --cost-ratio 0.394 --head-cost-ratio 0.0063 --out eval/results/headroom-qwen-chat
"""

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pacer_hf import CostModel, PacerHead, PacerHeadConfig, load_collection
from pacer_hf.models import load_model
from pacer_hf.threshold import ThresholdReport, choose_threshold
from pacer_hf.training import _Batcher, calibration_metrics, round_starts, window_logprobs

HISTORY_WINDOW = 32
HISTORY_PRIOR = (0.9, 4.0)  # (rate, pseudo-count): the first rounds of a sequence read mostly the prior
CANDIDATES = {"head, recalibrated": (), "+ history": ("history",), "+ margin": ("margin",),
              "+ history + margin": ("history", "margin")}


def acceptance_history(labels: np.ndarray) -> np.ndarray:
    """Smoothed acceptance rate of positions `[t - HISTORY_WINDOW, t)` at each position t: `(n,)`."""
    rate, count = HISTORY_PRIOR
    cumulative = np.concatenate([[0.0], np.cumsum(labels)])
    t = np.arange(labels.shape[0])
    start = np.maximum(0, t - HISTORY_WINDOW)
    return (cumulative[t] - cumulative[start] + rate * count) / (t - start + count)


def runner_up_margin(hidden: torch.Tensor, lm_head: torch.Tensor) -> np.ndarray:
    """log q(top-1) - log q(top-2) from draft hidden states `[N, H]` and the lm_head weight `[V, H]`: `(N,)`."""
    margins = []
    with torch.no_grad():
        for chunk in hidden.split(256):
            top2 = (chunk.float() @ lm_head.T).topk(2, dim=-1).values  # [c, 2]; log-softmax keeps logit differences
            margins.append(top2[:, 0] - top2[:, 1])
    return torch.cat(margins).double().numpy()


@dataclasses.dataclass
class ScoredSequence:
    """One sequence's greedy labels `(n,)`, head logits of a round starting at each position `(n, W)` and candidate
    inputs per round position `{name: (n, W)}`."""

    labels: np.ndarray
    logits: np.ndarray
    inputs: dict[str, np.ndarray]

    def stacked_logprobs(self, weights: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
        """log sigmoid of the stack `w0·logit + sum_j wj·input_j + bias`: `(n, W)`."""
        z = weights[0] * self.logits + weights[-1]
        for w, name in zip(weights[1:-1], names):
            z = z + w * self.inputs[name]
        return -np.logaddexp(0.0, -z)

    def round_examples(self, names: tuple[str, ...], width: int) -> tuple[np.ndarray, np.ndarray]:
        """Stack inputs `(E, 1 + len(names))` and labels `(E,)` of the positions a round reaches: each round of an
        always-pass drafter up to and including its first rejection."""
        rows, labels = [], []
        for t in round_starts(self.labels, width):
            for w in range(min(width, self.labels.shape[0] - t)):
                rows.append([self.logits[t, w], *(self.inputs[name][t, w] for name in names)])
                labels.append(self.labels[t + w])
                if self.labels[t + w] == 0:
                    break
        return np.asarray(rows).reshape(-1, 1 + len(names)), np.asarray(labels)


def load_sequences(collection, head: PacerHead, sequences: list[int], margin: np.ndarray) -> list[ScoredSequence]:
    """Labels, head logits and candidate inputs of `sequences`."""
    batcher = _Batcher(collection, dataclasses.replace(head.config, decoding="greedy"))
    width, slices, out = head.config.max_draft, collection.sequence_slices(), []
    for s in sequences:
        span = slices[s]
        labels = collection.greedy_label[span].double().numpy()
        n = labels.shape[0]
        logprobs = np.minimum(window_logprobs(head, batcher, span), -1e-12)  # [n, W]
        position = np.minimum(np.arange(n)[:, None] + np.arange(width)[None, :], n - 1)  # [n, W]; past n unused
        history = acceptance_history(labels)
        out.append(ScoredSequence(labels, logprobs - np.log(-np.expm1(logprobs)), {
            "history": np.repeat(np.log(history / (1 - history))[:, None], width, axis=1),  # known at round start
            "margin": margin[span][position],
        }))
    return out


def fit_stack(sequences: list[ScoredSequence], names: tuple[str, ...], width: int) -> np.ndarray:
    """Weights `(2 + len(names),)` of the stack: logit weight, input weights, bias (L-BFGS on the BCE)."""
    parts = [seq.round_examples(names, width) for seq in sequences]
    x = torch.from_numpy(np.concatenate([p[0] for p in parts]))  # [E, 1 + d]
    y = torch.from_numpy(np.concatenate([p[1] for p in parts]))  # [E]
    weights = torch.zeros(x.shape[1] + 1, dtype=torch.float64)
    weights[0] = 1.0  # start from the head as it is
    weights.requires_grad_(True)
    optimizer = torch.optim.LBFGS([weights], max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.binary_cross_entropy_with_logits(x @ weights[:-1] + weights[-1], y)
        loss.backward()
        return loss

    optimizer.step(closure)
    return weights.detach().numpy()


def score(
    sequences: list[ScoredSequence], weights: np.ndarray, names: tuple[str, ...], config: PacerHeadConfig,
    cost: CostModel,
) -> tuple[float, ThresholdReport]:
    """AUC of the stack on the positions rounds reach and its expected-speed report on `sequences`."""
    parts = [seq.round_examples(names, config.max_draft) for seq in sequences]
    x, y = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    probs = 1 / (1 + np.exp(-(x @ weights[:-1] + weights[-1])))
    auc = calibration_metrics(probs, y, np.ones_like(y))["auc"]
    report = choose_threshold([seq.labels for seq in sequences],
                              [seq.stacked_logprobs(weights, names) for seq in sequences], config, cost)
    return auc, report


def prompt_range(text: str) -> range:
    start, _, stop = text.partition(":")
    try:
        prompts = range(int(start), int(stop))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START:STOP prompt indices, got {text!r}") from None
    if not prompts:
        raise argparse.ArgumentTypeError(f"the prompt range {text!r} is empty")
    return prompts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a collection written by `pacer-hf collect`")
    parser.add_argument("--head", required=True, help="a trained head (folder or Hub id)")
    parser.add_argument("--draft", required=True, help="the collection's draft model, for its lm_head (pinned "
                        "name, Hub id or local path)")
    parser.add_argument("--fit-prompts", type=prompt_range, required=True, help="START:STOP prompt indices to fit on")
    parser.add_argument("--eval-prompts", type=prompt_range, required=True, help="START:STOP prompt indices to score")
    parser.add_argument("--cost-ratio", type=float, required=True, help="drafted token / round")
    parser.add_argument("--head-cost-ratio", type=float, default=0.0, help="head call / round")
    parser.add_argument("--verify-cost-ratio", type=float, default=0.0, help="verified draft token / round")
    parser.add_argument("--out", required=True, help="output prefix: writes OUT.json and OUT.md")
    args = parser.parse_args(argv)
    if set(args.fit_prompts) & set(args.eval_prompts):
        parser.error("--fit-prompts and --eval-prompts overlap")
    cost = CostModel(draft=args.cost_ratio, head=args.head_cost_ratio, verify=args.verify_cost_ratio)
    collection = load_collection(args.data)
    head = PacerHead.from_pretrained(args.head).eval()
    prompt_of = collection.prompt_index.tolist()
    split = {name: [s for s, p in enumerate(prompt_of) if p in prompts]
             for name, prompts in (("fit", args.fit_prompts), ("eval", args.eval_prompts))}
    for name, sequences in split.items():
        if not sequences:
            parser.error(f"no sequence of `{args.data}` has a prompt in --{name}-prompts")

    draft, _ = load_model(args.draft, dtype=torch.float32)
    lm_head = draft.get_output_embeddings().weight.detach()  # [V, H]
    expected = (collection.manifest["draft"]["vocab_size"], collection.manifest["draft"]["hidden_size"])
    if lm_head.shape[1] != expected[1] or lm_head.shape[0] < expected[0]:
        parser.error(f"--draft has an lm_head of shape {tuple(lm_head.shape)}; the collection's draft has vocab_size "
                     f"{expected[0]} and hidden size {expected[1]}")
    wanted = sorted(split["fit"] + split["eval"])
    slices = collection.sequence_slices()
    margin = np.zeros(collection.hidden.shape[0])
    for s in wanted:
        margin[slices[s]] = runner_up_margin(collection.hidden[slices[s]], lm_head)
    data = {name: load_sequences(collection, head, sequences, margin) for name, sequences in split.items()}

    config, width = head.config, head.config.max_draft
    identity = np.array([1.0, 0.0])
    auc, as_trained = score(data["eval"], identity, (), config, cost)
    rows = [{"candidate": "head as trained", "weights": identity.tolist(), "threshold": config.threshold,
             "auc": auc, "speedup": as_trained.speedups[as_trained.thresholds.index(config.threshold)]}]
    for candidate, names in CANDIDATES.items():
        weights = fit_stack(data["fit"], names, width)
        threshold = choose_threshold([seq.labels for seq in data["fit"]],
                                     [seq.stacked_logprobs(weights, names) for seq in data["fit"]],
                                     config, cost).best_threshold
        auc, report = score(data["eval"], weights, names, config, cost)
        rows.append({"candidate": candidate, "weights": weights.round(4).tolist(), "threshold": threshold,
                     "auc": auc, "speedup": report.speedups[report.thresholds.index(threshold)]})
    k, fixed = as_trained.best_fixed
    result = {
        "data": args.data, "head": args.head, "cost": vars(cost),
        "fit_prompts": f"{args.fit_prompts.start}:{args.fit_prompts.stop}",
        "eval_prompts": f"{args.eval_prompts.start}:{args.eval_prompts.stop}",
        "sequences": {name: len(sequences) for name, sequences in split.items()},
        "oracle": as_trained.oracle_speedup, "best_fixed_k": k, "best_fixed": fixed, "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(result, indent=2))
    table = to_markdown(result)
    Path(f"{out}.md").write_text(table)
    print(table)


def to_markdown(result: dict) -> str:
    lines = [
        f"Expected greedy speed-up over autoregressive on prompts {result['eval_prompts']} of `{result['data']}` "
        f"({result['sequences']['eval']} sequences), stacks fit and thresholds chosen on prompts "
        f"{result['fit_prompts']} ({result['sequences']['fit']}); head `{result['head']}`; cost per drafted token "
        f"{result['cost']['draft']:.3f}, per head call {result['cost']['head']:.4f}.",
        "",
        "| inputs | AUC | threshold | speed-up | share of the oracle |",
        "|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(f"| {row['candidate']} | {row['auc']:.3f} | {row['threshold']:.3f} | {row['speedup']:.3f} | "
                     f"{row['speedup'] / result['oracle']:.0%} |")
    lines.append(f"\noracle stop {result['oracle']:.3f}; best fixed length ({result['best_fixed_k']}) "
                 f"{result['best_fixed']:.3f}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
