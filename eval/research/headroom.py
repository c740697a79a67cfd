"""How much of a head's gap to the oracle stop other cheap inputs could close, measured before building them in.

A logistic stack re-reads a trained head's logit together with candidate inputs. It is fit (weighted BCE on greedy
labels, each round up to its first rejection, as training weighs it) on one prompt range of a collection, its
threshold is chosen there, and it is scored on other ranges with the expected-speed model. Candidate inputs:

- `history`: the acceptance rate of the sequence's last 32 positions before the round (smoothed towards 0.9). A
  generator knows it from its earlier rounds; the head never sees it, it reads one round.
- `margin`: log q(top-1) - log q(top-2) of the draft distribution at each drafted token. The collection stores
  log q(token), log q(top-1) and the entropy, so the runner-up is recomputed from the stored hidden states with the
  draft's lm_head.
- `target features`: the entropy, top-1 log-prob and top-1/top-2 margin of the target distribution the round's
  first token follows from (the bonus token's), known at round start from the previous verification. Needs a
  format-2 collection.
- `target hidden`: the target's post-norm hidden state that chose that token, through a learned projection to an
  offset and a slope over the round's positions (L2 chosen on a held-out quarter of the fit prompts).

A round starting at position t reads the target's state at t - 1 (the first round of a sequence reads zeros: no
verification has run yet). The `head, recalibrated` row stacks nothing (it only rescales and shifts the logit), so a
candidate is worth building into the head only by what it adds over that row. Every range must hold prompts the
head was not trained on.

    python -m eval.research.headroom --data runs/qwen-bf16-data-v2 --head hub_cards/pacer-qwen2.5-coder-0.5b-to-1.5b \
        --draft qwen2.5-coder-0.5b-instruct --fit-prompts 0:48 --eval-prompts sharegpt=48:80 qa=80:120 \
        --cost-ratio 0.394 --head-cost-ratio 0.0063 --out eval/results/headroom-qwen-target
"""

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pacer_hf import PacerHead, PacerHeadConfig
from pacer_hf.collection import load_collection
from pacer_hf.threshold import CostModel
from pacer_hf.models import load_model
from pacer_hf.rounds import RoundBatcher, calibration_metrics, round_starts, window_logprobs
from pacer_hf.threshold import ThresholdReport, choose_threshold

from pacer_hf.bench.flags import add_cost_flags, cost_model

HISTORY_WINDOW = 32
HISTORY_PRIOR = (0.9, 4.0)  # (rate, pseudo-count): the first rounds of a sequence read mostly the prior
TARGET_FEATURES = ("target_entropy", "target_top1", "target_margin")  # the collection's target_features columns
DRAFT_FEATURES = ("draft_logq", "draft_top1", "draft_entropy")  # the head's own features of each drafted token
L2_GRID = (1e-3, 1e-2, 1e-1, 1.0)  # per-example L2 weight on the hidden projection
# name: (scalar inputs, reads the target's hidden state, reads the head's logit)
CANDIDATES = {
    "head, recalibrated": ((), False, True),
    "+ history": (("history",), False, True),
    "+ margin": (("margin",), False, True),
    "+ target features": (TARGET_FEATURES, False, True),
    "+ target hidden": ((), True, True),
    "+ target features + hidden": (TARGET_FEATURES, True, True),
    "+ margin + target features + hidden": (("margin", *TARGET_FEATURES), True, True),
    # without the head: what the distribution features alone say (no draft hidden state to fit prompts with)
    "draft features only (no head)": (DRAFT_FEATURES, False, False),
    "draft + target features (no head)": (DRAFT_FEATURES + TARGET_FEATURES, False, False),
}


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


def round_start_state(values: np.ndarray) -> np.ndarray:
    """The target's state a round starting at each position t reads: `values[t - 1]`, zeros at t = 0: `(n, ...)`."""
    return np.concatenate([np.zeros_like(values[:1]), values[:-1]])


@dataclasses.dataclass
class ScoredSequence:
    """One sequence's greedy labels `(n,)`, head logits of a round starting at each position `(n, W)`, candidate
    inputs per round position `{name: (n, W)}` and, optionally, the target hidden state each round start reads
    `(n, H_target)`."""

    labels: np.ndarray
    logits: np.ndarray
    inputs: dict[str, np.ndarray]
    round_hidden: np.ndarray | None = None

    def round_examples(self, names: tuple[str, ...], width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Stack inputs `(E, 1 + len(names))`, labels `(E,)` and `(round start, offset)` pairs `(E, 2)` of the
        positions a round reaches: each round of an always-pass drafter up to and including its first rejection."""
        rows, labels, where = [], [], []
        for t in round_starts(self.labels, width):
            for w in range(min(width, self.labels.shape[0] - t)):
                rows.append([self.logits[t, w], *(self.inputs[name][t, w] for name in names)])
                labels.append(self.labels[t + w])
                where.append((t, w))
                if self.labels[t + w] == 0:
                    break
        return (np.asarray(rows).reshape(-1, 1 + len(names)), np.asarray(labels),
                np.asarray(where, dtype=np.int64).reshape(-1, 2))


@dataclasses.dataclass
class Stack:
    """`z = weights · [logit, inputs...] + bias (+ hidden · projection[:, 0] + hidden · projection[:, 1] · w / W)`,
    with the hidden state standardized by the fit set's `mean` and `std`."""

    names: tuple[str, ...]
    weights: np.ndarray  # (1 + len(names),)
    bias: float
    projection: np.ndarray | None = None  # (H_target, 2)
    mean: np.ndarray | None = None
    std: np.ndarray | None = None
    l2: float | None = None

    def hidden_term(self, hidden: np.ndarray, offsets: np.ndarray, width: int) -> np.ndarray:
        """The hidden state's contribution for rows of `hidden` `(E, H)` at round offsets `offsets` `(E, ...)`."""
        projected = ((hidden - self.mean) / self.std) @ self.projection  # (E, 2)
        shape = (-1,) + (1,) * (offsets.ndim - 1)
        return projected[:, 0].reshape(shape) + projected[:, 1].reshape(shape) * offsets / width

    def logprobs(self, seq: ScoredSequence, width: int) -> np.ndarray:
        """log sigmoid of the stack for a round starting at every position of `seq`: `(n, W)`."""
        z = self.weights[0] * seq.logits + self.bias
        for w, name in zip(self.weights[1:], self.names):
            z = z + w * seq.inputs[name]
        if self.projection is not None:
            z = z + self.hidden_term(seq.round_hidden, np.arange(width)[None, :], width)
        return -np.logaddexp(0.0, -z)


def load_sequences(collection, head: PacerHead, sequences: list[int], margin: np.ndarray) -> list[ScoredSequence]:
    """Labels, head logits and candidate inputs of `sequences`."""
    batcher = RoundBatcher(collection, dataclasses.replace(head.config, decoding="greedy"))
    width, slices, out = head.config.max_draft, collection.sequence_slices(), []
    for s in sequences:
        span = slices[s]
        labels = collection.greedy_label[span].double().numpy()
        n = labels.shape[0]
        logprobs = np.minimum(window_logprobs(head, batcher, span), -1e-12)  # [n, W]
        position = np.minimum(np.arange(n)[:, None] + np.arange(width)[None, :], n - 1)  # [n, W]; past n unused
        history = acceptance_history(labels)
        inputs = {
            "history": np.repeat(np.log(history / (1 - history))[:, None], width, axis=1),  # known at round start
            "margin": margin[span][position],
        }
        draft_features = collection.features[span].double().numpy()[position]  # [n, W, 3]
        for j, name in enumerate(DRAFT_FEATURES):
            inputs[name] = draft_features[..., j]
        round_hidden = None
        if collection.target_hidden is not None:
            features = round_start_state(collection.target_features[span].double().numpy())  # [n, 3]
            for j, name in enumerate(TARGET_FEATURES):
                inputs[name] = np.repeat(features[:, j : j + 1], width, axis=1)  # known at round start
            round_hidden = round_start_state(collection.target_hidden[span].float().numpy())  # [n, H_target]
        out.append(ScoredSequence(labels, logprobs - np.log(-np.expm1(logprobs)), inputs, round_hidden))
    return out


def _examples(sequences: list[ScoredSequence], names: tuple[str, ...], width: int, hidden: bool, head: bool = True):
    parts = [seq.round_examples(names, width) for seq in sequences]
    x = np.concatenate([p[0] for p in parts])  # [E, 1 + d]
    if not head:
        x[:, 0] = 0.0  # the stack does not read the head's logit
    y = np.concatenate([p[1] for p in parts])  # [E]
    offsets = np.concatenate([p[2][:, 1] for p in parts])  # [E]
    h = np.concatenate([seq.round_hidden[p[2][:, 0]] for seq, p in zip(sequences, parts)]) if hidden else None
    return x, y, offsets, h


def _fit(x, y, offsets, h, width: int, l2: float) -> tuple[np.ndarray, float, np.ndarray | None]:
    """L-BFGS on the BCE (+ `l2` · |projection|² when `h` is given); starts from the head as it is."""
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    weights = torch.zeros(x.shape[1] + 1, dtype=torch.float64)
    weights.data[0] = 1.0
    params = [weights.requires_grad_(True)]
    if h is not None:
        ht = torch.from_numpy(h).double()  # [E, H], standardized
        scale = torch.from_numpy(offsets / width).double()  # [E]
        projection = torch.zeros(h.shape[1], 2, dtype=torch.float64, requires_grad=True)
        params.append(projection)
    optimizer = torch.optim.LBFGS(params, max_iter=300, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        z = xt @ weights[:-1] + weights[-1]
        penalty = 0.0
        if h is not None:
            p = ht @ projection  # [E, 2]
            z = z + p[:, 0] + p[:, 1] * scale
            penalty = l2 * projection.pow(2).sum()
        loss = F.binary_cross_entropy_with_logits(z, yt) + penalty
        loss.backward()
        return loss

    optimizer.step(closure)
    w = weights.detach().numpy()
    return w[:-1], float(w[-1]), projection.detach().numpy() if h is not None else None


def fit_stack(
    sequences: list[ScoredSequence], names: tuple[str, ...], width: int, hidden: bool = False, head: bool = True
) -> Stack:
    """Fits the stack on `sequences`. With `hidden`, the L2 weight is the one of `L2_GRID` with the lowest log-loss
    on the last quarter of `sequences` when fit on the rest; the stack is then refit on all of them. Without `head`
    the stack ignores the head's logit (its weight is 0)."""
    if not hidden:
        weights, bias, _ = _fit(*_examples(sequences, names, width, False, head), width, 0.0)
        if not head:
            weights[0] = 0.0
        return Stack(names, weights, bias)
    x, y, offsets, h = _examples(sequences, names, width, True)
    mean, std = h.mean(axis=0), h.std(axis=0) + 1e-6
    cut = max(1, len(sequences) * 3 // 4)
    inner, held = _examples(sequences[:cut], names, width, True), _examples(sequences[cut:], names, width, True)
    losses = {}
    for l2 in L2_GRID:
        weights, bias, projection = _fit(*inner[:3], (inner[3] - mean) / std, width, l2)
        stack = Stack(names, weights, bias, projection, mean, std, l2)
        z = held[0] @ weights + bias + stack.hidden_term(held[3], held[2], width)
        losses[l2] = float(np.mean(np.logaddexp(0.0, -z) * held[1] + np.logaddexp(0.0, z) * (1 - held[1])))
    l2 = min(losses, key=losses.get)
    weights, bias, projection = _fit(x, y, offsets, (h - mean) / std, width, l2)
    return Stack(names, weights, bias, projection, mean, std, l2)


def score(
    sequences: list[ScoredSequence], stack: Stack, config: PacerHeadConfig, cost: CostModel, threshold: float
) -> dict[str, float]:
    """AUC of the stack on the positions rounds reach, and the expected speed-up on `sequences` at `threshold`
    (the one chosen on the fit prompts), beside the oracle stop and the best fixed length under the same model."""
    width = config.max_draft
    x, y, offsets, h = _examples(sequences, stack.names, width, stack.projection is not None)
    z = x @ stack.weights + stack.bias + (stack.hidden_term(h, offsets, width) if h is not None else 0.0)
    auc = calibration_metrics(1 / (1 + np.exp(-z)), y, np.ones_like(y))["auc"]
    report = choose_threshold([seq.labels for seq in sequences], [stack.logprobs(seq, width) for seq in sequences],
                              config, cost)
    k, fixed = report.best_fixed
    return {"auc": auc, "speedup": report.speedups[report.thresholds.index(threshold)],
            "oracle": report.oracle_speedup, "best_fixed_k": k, "best_fixed": fixed}


def best_threshold(sequences: list[ScoredSequence], stack: Stack, config: PacerHeadConfig, cost: CostModel) -> float:
    """The threshold of the highest expected speed-up on `sequences`."""
    report: ThresholdReport = choose_threshold(
        [seq.labels for seq in sequences], [stack.logprobs(seq, config.max_draft) for seq in sequences], config, cost
    )
    return report.best_threshold


def named_range(text: str) -> tuple[str, range]:
    """`NAME=START:STOP` (or `START:STOP`, named after itself) -> `(name, range)`."""
    name, _, span = text.rpartition("=")
    start, _, stop = span.partition(":")
    try:
        prompts = range(int(start), int(stop))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected [NAME=]START:STOP prompt indices, got {text!r}") from None
    if not prompts:
        raise argparse.ArgumentTypeError(f"the prompt range {text!r} is empty")
    return name or span, prompts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a collection written by `pacer-hf collect`")
    parser.add_argument("--head", required=True, help="a trained head (folder or Hub id)")
    parser.add_argument("--draft", required=True, help="the collection's draft model, for its lm_head (pinned "
                        "name, Hub id or local path)")
    parser.add_argument("--fit-prompts", type=named_range, required=True, help="START:STOP prompt indices to fit on")
    parser.add_argument("--eval-prompts", type=named_range, nargs="+", required=True,
                        help="[NAME=]START:STOP prompt indices to score, each reported as its own set")
    add_cost_flags(parser)
    parser.add_argument("--out", required=True, help="output prefix: writes OUT.json and OUT.md")
    args = parser.parse_args(argv)
    ranges = {"fit": args.fit_prompts[1], **{name: prompts for name, prompts in args.eval_prompts}}
    if len(ranges) != 1 + len(args.eval_prompts):
        parser.error("every --eval-prompts range needs its own name (and none may be called `fit`)")
    for name, prompts in ranges.items():
        for other, others in ranges.items():
            if name < other and set(prompts) & set(others):
                parser.error(f"the prompt ranges `{name}` and `{other}` overlap")
    cost = cost_model(args)
    collection = load_collection(args.data)
    head = PacerHead.from_pretrained(args.head).eval()
    prompt_of = collection.prompt_index.tolist()
    split = {name: [s for s, p in enumerate(prompt_of) if p in prompts] for name, prompts in ranges.items()}
    for name, sequences in split.items():
        if not sequences:
            parser.error(f"no sequence of `{args.data}` has a prompt in the range `{name}`")
    candidates = CANDIDATES
    if collection.target_hidden is None:
        print(f"`{args.data}` is a format-1 collection without the target's state: its candidates are skipped.")
        candidates = {k: v for k, v in CANDIDATES.items() if not v[1] and not set(v[0]) & set(TARGET_FEATURES)}

    draft, _ = load_model(args.draft, dtype=torch.float32)
    lm_head = draft.get_output_embeddings().weight.detach()  # [V, H]
    expected = (collection.manifest["draft"]["vocab_size"], collection.manifest["draft"]["hidden_size"])
    if lm_head.shape[1] != expected[1] or lm_head.shape[0] < expected[0]:
        parser.error(f"--draft has an lm_head of shape {tuple(lm_head.shape)}; the collection's draft has vocab_size "
                     f"{expected[0]} and hidden size {expected[1]}")
    slices = collection.sequence_slices()
    margin = np.zeros(collection.hidden.shape[0])
    for s in sorted(s for sequences in split.values() for s in sequences):
        margin[slices[s]] = runner_up_margin(collection.hidden[slices[s]], lm_head)
    data = {name: load_sequences(collection, head, sequences, margin) for name, sequences in split.items()}
    eval_sets = [name for name, _ in args.eval_prompts]

    config = head.config
    as_trained = Stack((), np.array([1.0]), 0.0)
    rows = [{"candidate": "head as trained", "threshold": config.threshold,
             **{name: score(data[name], as_trained, config, cost, config.threshold) for name in eval_sets}}]
    for candidate, (names, hidden, use_head) in candidates.items():
        stack = fit_stack(data["fit"], names, config.max_draft, hidden, use_head)
        threshold = best_threshold(data["fit"], stack, config, cost)
        rows.append({"candidate": candidate, "threshold": threshold, "l2": stack.l2,
                     "weights": stack.weights.round(4).tolist(), "bias": round(stack.bias, 4),
                     **{name: score(data[name], stack, config, cost, threshold) for name in eval_sets}})
    result = {
        "data": args.data, "head": args.head, "cost": vars(cost),
        "ranges": {name: f"{r.start}:{r.stop}" for name, r in ranges.items()},
        "sequences": {name: len(sequences) for name, sequences in split.items()},
        "eval_sets": eval_sets, "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(result, indent=2))
    table = to_markdown(result)
    Path(f"{out}.md").write_text(table)
    print(table)


def to_markdown(result: dict) -> str:
    sets = result["eval_sets"]
    described = ", ".join(f"`{name}` = prompts {result['ranges'][name]} ({result['sequences'][name]} sequences)"
                          for name in sets)
    lines = [
        f"Expected greedy speed-up over autoregressive on {described} of `{result['data']}`; stacks fit and "
        f"thresholds chosen on prompts {result['ranges']['fit']} ({result['sequences']['fit']} sequences); head "
        f"`{result['head']}`; cost per drafted token {result['cost']['draft']:.3f}, per head call "
        f"{result['cost']['head']:.4f}. Share = speed-up / oracle stop's.",
        "",
        "| inputs | threshold | " + " | ".join(f"{name} AUC | {name} speed-up | {name} share" for name in sets) + " |",
        "|---|---|" + "---|---|---|" * len(sets),
    ]
    for row in result["rows"]:
        cells = [f"{row[n]['auc']:.3f} | {row[n]['speedup']:.3f} | {row[n]['speedup'] / row[n]['oracle']:.0%}"
                 for n in sets]
        lines.append(f"| {row['candidate']} | {row['threshold']:.3f} | " + " | ".join(cells) + " |")
    first = result["rows"][0]
    lines.append("")
    lines += [f"`{n}`: oracle stop {first[n]['oracle']:.3f}; best fixed length ({first[n]['best_fixed_k']}) "
              f"{first[n]['best_fixed']:.3f}" for n in sets]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
