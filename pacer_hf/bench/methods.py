"""The decoding methods the harness compares: one function each, one `RunRecord` contract (as Spec-Bench's
`forward_func`).

Every method decodes one prompt with the same target, the same generation settings and batch size 1, and is
measured the same way: wall time with `time.perf_counter`, new tokens counted from ids, and target calls / draft
forwards counted by forward pre-hooks on the two models (a documented torch API, so no method is patched).
A round's draft length is the number of draft forwards between two target forwards: transformers' stock drafting
and pacer-hf's loop both spend exactly one draft forward per drafted token.
"""

import contextlib
import dataclasses
import functools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from pacer_hf import PacerCandidateGenerator, PacerHead, PacerHeadConfig, PacerStats
from pacer_hf.models import synchronize
from pacer_hf.stats import RoundRecord

@dataclass
class RunRecord:
    """What one method did on one prompt.

    Args:
        method (`str`): registered method name.
        tokens (`list[int]`): the new token ids (prompt excluded).
        wall_s (`float`): seconds in `generate()`, minus `excluded_s`.
        target_calls (`int`): target forwards (the prefill included).
        draft_forwards (`int`): draft forwards.
        draft_lengths (`list[int]`): draft forwards of each round (empty for autoregressive decoding).
        excluded_s (`float`): untimed work inside `generate()` (the oracle's probes), already subtracted.
        prefill_s (`float`, *optional*): seconds of the target's first forward, its prefill of the prompt: the same work
            for every method, which the report's decode speed-up leaves out (`None` in records written before it).
        head_s (`float`, *optional*): seconds in the stop rule's head calls (features + head forward), as
            `generate()` measures them in its `PacerStats`; `None` for methods outside pacer-hf's draft loop.
        phrases (`dict`, *optional*): phrase drafting's counts from the call's `PacerStats` (tokens offered to and
            confirmed by the draft, tokens copied without it and accepted, rounds of each kind, and `rounds`: each
            round as a row of `ROUND_FIELDS`, its seconds, the rates the planner weighed and the new tokens it
            expected; `draft_vocab`: the id limit the draft scored below, `None` for its whole vocabulary); `None`
            without phrases.
        stats (`PacerStats`, *optional*): the whole statistics of a pacer-hf call; not written to the records.
    """

    method: str
    tokens: list[int]
    wall_s: float
    target_calls: int
    draft_forwards: int
    draft_lengths: list[int] = field(default_factory=list)
    excluded_s: float = 0.0
    prefill_s: float | None = None
    head_s: float | None = None
    phrases: dict | None = None
    stats: PacerStats | None = field(default=None, repr=False)

    def to_json(self) -> dict:
        """The record as the harness writes it (without `stats`, which the derived fields summarize)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "stats"}


@dataclass
class Pair:
    """The models a benchmark runs, and its decoding settings.

    Args:
        target, draft: the models (same vocabulary).
        head (`PacerHead`, *optional*): the head of the `pacer` method.
        max_new_tokens (`int`): new tokens per prompt.
        do_sample (`bool`): greedy (`False`) or sampling at temperature 1 with no truncation (`True`).
        entropy_threshold (`float`): entropy (nats) above which the `entropy` method stops drafting.
        fixed_draft_lengths (`tuple[int, ...]`): the k of the `fixed-k` methods.
        pacer_thresholds (`tuple[float, ...]`): thresholds of extra `pacer@T` methods: the same head stopping at T
            instead of its own threshold (e.g. thresholds chosen under two cost models, compared in one run).
        prompt_lookup_lengths (`tuple[int, ...]`): the `prompt_lookup_num_tokens` of the `prompt-lookup-kN` methods
            (transformers' prompt lookup decoding, n-grams of up to 2 tokens as its default).
        other_heads (`dict[str, PacerHead]`): more heads to compare with `head` in the same run, each as the method
            `pacer-NAME` at its own threshold.
        tokenizers (`dict`): passed to every call with the draft: for a pair whose embedding rows differ, `tokenizer`
            and `assistant_tokenizer`, so that transformers' own methods run as universal assisted generation and
            pacer-hf checks the shared vocabulary (`Models.stock_tokenizers`); empty otherwise.
    """

    target: torch.nn.Module
    draft: torch.nn.Module
    head: PacerHead | None = None
    max_new_tokens: int = 128
    do_sample: bool = False
    entropy_threshold: float = 1.0
    fixed_draft_lengths: tuple[int, ...] = (2, 4, 6, 8)
    pacer_thresholds: tuple[float, ...] = ()
    prompt_lookup_lengths: tuple[int, ...] = (10,)
    other_heads: dict[str, PacerHead] = field(default_factory=dict)
    tokenizers: dict = field(default_factory=dict)

    def generation_kwargs(self) -> dict:
        sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if self.do_sample else {}
        return {"max_new_tokens": self.max_new_tokens, "do_sample": self.do_sample, **sampling}


class _ForwardLog:
    """Records the order of target ("T") and draft ("D") forwards through forward pre-hooks, and the seconds of the
    target's first forward (`prefill_s`)."""

    def __init__(self, target: torch.nn.Module, draft: torch.nn.Module):
        self.events: list[str] = []
        self.paused = False
        self.prefill_s: float | None = None
        self._device = target.device
        self._prefill_start: float | None = None
        self._handles = [
            target.register_forward_pre_hook(lambda *_: self._record("T")),
            target.register_forward_hook(lambda *_: self._end_prefill()),
            draft.register_forward_pre_hook(lambda *_: self._record("D")),
        ]

    def _record(self, event: str) -> None:
        if self.paused:
            return
        if event == "T" and self._prefill_start is None:
            synchronize(self._device)  # once per call: the queued work before the prefill is not the prefill's
            self._prefill_start = time.perf_counter()
        self.events.append(event)

    def _end_prefill(self) -> None:
        if self._prefill_start is not None and self.prefill_s is None:
            synchronize(self._device)
            self.prefill_s = time.perf_counter() - self._prefill_start

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        self.paused = True
        try:
            yield
        finally:
            self.paused = False

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()

    def draft_lengths(self) -> list[int]:
        """Draft forwards before each target forward, for the rounds of an assisted run."""
        lengths, run = [], 0
        for event in self.events:
            if event == "D":
                run += 1
            else:
                lengths.append(run)
                run = 0
        return lengths


@contextlib.contextmanager
def _draft_generation_config(draft: torch.nn.Module, **values) -> Iterator[None]:
    """Transformers reads its drafting settings from the draft's `generation_config` (and the `heuristic` schedule
    writes back into it): set them for one run and restore them after."""
    saved = {name: getattr(draft.generation_config, name) for name in values}
    for name, value in values.items():
        setattr(draft.generation_config, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(draft.generation_config, name, value)


def _timed(pair: Pair, method: str, ids: torch.Tensor, log: _ForwardLog | None = None, **generate_kwargs) -> RunRecord:
    log = log if log is not None else _ForwardLog(pair.target, pair.draft)
    stats = generate_kwargs.setdefault("pacer_stats", PacerStats()) if "pacer_head" in generate_kwargs else None
    if "assistant_model" in generate_kwargs:
        generate_kwargs.update(pair.tokenizers)
    try:
        synchronize(pair.target.device)
        start = time.perf_counter()
        out = pair.target.generate(ids, **pair.generation_kwargs(), **generate_kwargs)
        synchronize(pair.target.device)  # an accelerator's queued work belongs to this method's time
        wall = time.perf_counter() - start
    finally:
        log.remove()
    return RunRecord(
        method=method,
        tokens=out[0, ids.shape[1]:].tolist(),
        wall_s=wall,
        target_calls=log.events.count("T"),
        draft_forwards=log.events.count("D"),
        draft_lengths=log.draft_lengths() if "assistant_model" in generate_kwargs else [],
        prefill_s=log.prefill_s,
        head_s=stats.head_time_s if stats is not None else None,
        phrases={
            "offered": stats.phrase_tokens_offered, "confirmed": stats.phrase_tokens_confirmed,
            "copied": sum(stats.copied_lengths), "copied_accepted": stats.copied_tokens_accepted,
            "round_kinds": stats.round_kinds, "draft_vocab": stats.draft_vocab,
            "rounds": [_round_row(plan) for plan in stats.plans],
        } if generate_kwargs.get("pacer_phrases") else None,
        stats=stats,
    )


ROUND_FIELDS = ("kind", "sent", "drafted", "accepted", "seconds", "step_rate", "copy_rate", "draft_rate", "expected")


def _round_row(plan: RoundRecord) -> list:
    """One planned round as a compact row of `ROUND_FIELDS` (rates in new tokens per second; `None` where the planner
    did not weigh that option; `expected`: the new tokens it expected, against `accepted` + 1), so a run's records
    show why each call chose what it did and how far its expectations held."""
    rates = plan.rates or {}
    timings = (plan.seconds, *(rates.get(option) for option in ("step", "copy", "draft")))
    rounded = [None if x is None else round(x, 4) for x in (*timings, plan.expected)]
    return [plan.kind, plan.sent, plan.drafted, plan.accepted, *rounded]


def autoregressive(pair: Pair, ids: torch.Tensor) -> RunRecord:
    return _timed(pair, "autoregressive", ids)


def fixed(k: int) -> Callable[[Pair, torch.Tensor], RunRecord]:
    """transformers' stock drafting of exactly k tokens per round (confidence stop and its ROC re-fit off)."""

    def run(pair: Pair, ids: torch.Tensor) -> RunRecord:
        with _draft_generation_config(
            pair.draft, num_assistant_tokens=k, num_assistant_tokens_schedule="constant",
            assistant_confidence_threshold=0.0,
        ):
            return _timed(pair, f"fixed-k{k}", ids, assistant_model=pair.draft)

    return run


def prompt_lookup(num_tokens: int) -> Callable[[Pair, torch.Tensor], RunRecord]:
    """transformers' prompt lookup decoding: up to `num_tokens` tokens copied from the prompt and output after the
    latest match of the last 1-2 tokens, no draft model."""

    def run(pair: Pair, ids: torch.Tensor) -> RunRecord:
        return _timed(pair, f"prompt-lookup-k{num_tokens}", ids, prompt_lookup_num_tokens=num_tokens)

    return run


def heuristic(pair: Pair, ids: torch.Tensor) -> RunRecord:
    """transformers' `heuristic` schedule (+2 after a fully accepted round, -1 otherwise) from 5 tokens, no
    confidence stop; reset for every prompt because transformers persists the schedule into the draft's config."""
    with _draft_generation_config(
        pair.draft, num_assistant_tokens=5, num_assistant_tokens_schedule="heuristic",
        assistant_confidence_threshold=0.0,
    ):
        return _timed(pair, "heuristic", ids, assistant_model=pair.draft)


def confidence(pair: Pair, ids: torch.Tensor) -> RunRecord:
    """transformers' defaults: up to 20 tokens, stop when the draft's token probability < 0.4, threshold re-fitted
    online from an ROC curve (needs scikit-learn)."""
    with _draft_generation_config(
        pair.draft, num_assistant_tokens=20, num_assistant_tokens_schedule="constant",
        assistant_confidence_threshold=0.4,
    ):
        return _timed(pair, "confidence", ids, assistant_model=pair.draft)


def _rule_head_config(pair: Pair, **overrides) -> PacerHeadConfig:
    return PacerHeadConfig.for_draft(
        pair.draft, decoding="sampling" if pair.do_sample else "greedy",
        **{"block_size": 1, "threshold": 0.5, "score_mode": "block", **overrides},  # PacerHeadConfig's max_draft
    )


def entropy(pair: Pair, ids: torch.Tensor) -> RunRecord:
    """The training-free entropy stop, `PacerHead.entropy_stop`, in pacer-hf's draft loop (the paper's round, every
    round drafts: `pacer_phrases=False`)."""
    head = PacerHead.entropy_stop(pair.draft, pair.entropy_threshold)
    return _timed(pair, "entropy", ids, assistant_model=pair.draft, pacer_head=head, pacer_phrases=False)


def planned(name: str = "entropy+phrases", generator: Callable | None = None,
            **options: Any) -> Callable[[Pair, torch.Tensor], RunRecord]:
    """The entropy stop with planned rounds (a fresh pool per prompt; `generate()`'s default): each round copies,
    drafts or steps, as the round planner finds faster. The README's recommended call, as method `name`; `generator`:
    the `pacer_candidate_generator` to plan with instead of generate()'s own (`eval.research.planner_ab` runs an
    earlier commit's planner through it); `options`: more `generate()` arguments (`eval.research.draft_vocab` passes
    `pacer_draft_vocab`)."""

    def run(pair: Pair, ids: torch.Tensor) -> RunRecord:
        head = PacerHead.entropy_stop(pair.draft, pair.entropy_threshold)
        chosen = {"pacer_candidate_generator": generator} if generator is not None else {}
        return _timed(pair, name, ids, assistant_model=pair.draft, pacer_head=head, pacer_phrases=True, **chosen,
                      **options)

    return run


entropy_phrases = planned()


def pacer_at(threshold: float | None) -> Callable[[Pair, torch.Tensor], RunRecord]:
    """The `--head` at its own threshold (`None`: method `pacer`), or stopping at `threshold` instead (method
    `pacer@T`, through the per-call `pacer_threshold` of generate())."""
    name = "pacer" if threshold is None else f"pacer@{threshold:g}"

    def run(pair: Pair, ids: torch.Tensor) -> RunRecord:
        if pair.head is None:
            raise ValueError(f"The `{name}` method needs a head: pass `--head` (a folder or Hub id).")
        return _timed(pair, name, ids, assistant_model=pair.draft, pacer_head=pair.head, pacer_threshold=threshold,
                      pacer_phrases=False)

    return run


pacer = pacer_at(None)


def other_head(name: str) -> Callable[[Pair, torch.Tensor], RunRecord]:
    """The head `pair.other_heads[name]` at its own threshold: method `pacer-NAME`."""

    def run(pair: Pair, ids: torch.Tensor) -> RunRecord:
        return _timed(pair, f"pacer-{name}", ids, assistant_model=pair.draft, pacer_head=pair.other_heads[name],
                      pacer_phrases=False)

    return run


def pacer_phrases(pair: Pair, ids: torch.Tensor) -> RunRecord:
    """The `--head` with phrase drafting (`pacer_phrases=True`): a fresh phrase pool for each prompt."""
    if pair.head is None:
        raise ValueError("The `pacer+phrases` method needs a head: pass `--head` (a folder or Hub id).")
    return _timed(pair, "pacer+phrases", ids, assistant_model=pair.draft, pacer_head=pair.head, pacer_phrases=True)


@dataclass
class OracleProbe:
    """What the oracle's generator probes with: the target, the forward log its probes must not count, and the
    probe time to exclude from the wall time."""

    target: torch.nn.Module
    forward_log: _ForwardLog
    time_s: float = 0.0


class OracleCandidateGenerator(PacerCandidateGenerator):
    """Drafts exactly the tokens the target will accept: the ceiling of any stopping rule with this draft.

    `_max_new_tokens` first probes, untimed and uncounted: it drafts up to the cap, runs the target on those tokens with
    the target's own cache (rolled back afterwards) and applies the target's logits processors, as the real verify
    does, to learn the accepted length a. Then it drafts exactly a tokens for real. Greedy only. Exact in float32;
    in bfloat16 the probe's and the verify's batch shapes differ, so a near-tie can rarely flip.

    Reaches `generate()` through `pacer_candidate_generator=functools.partial(OracleCandidateGenerator, probe=...)`.
    """

    requires_model_outputs = True  # gives get_candidates the target's model_kwargs, hence its cache
    model_kwargs_overrides: dict = {}

    def __init__(self, *args, probe: OracleProbe, **kwargs):
        super().__init__(*args, **kwargs)
        self.probe = probe

    def _max_new_tokens(self, input_ids: torch.Tensor, model_kwargs: dict | None = None, **kwargs) -> int:
        if self.do_sample:
            raise ValueError("The oracle stop is defined for greedy decoding only.")
        cap = min(super()._max_new_tokens(input_ids), self.main_model_max_length - input_ids.shape[1] - 1)
        if cap <= 0:
            return 0
        start = time.perf_counter()
        with self.probe.forward_log.pause():
            accepted = self._probe_accepted_length(input_ids, cap, model_kwargs)
        self.probe.time_s += time.perf_counter() - start
        return accepted

    def _probe_accepted_length(self, input_ids: torch.Tensor, cap: int, model_kwargs: dict) -> int:
        """Drafts `cap` tokens and lets the target judge them, then rolls both caches back."""
        tokens = self._draft_blocks(input_ids, cap).tokens  # block_size = max_draft: no head call
        sequence = torch.cat([input_ids, tokens], dim=-1)  # [1, L + k]
        cache = model_kwargs["past_key_values"]
        num_cached = cache.get_seq_length()
        logits = self.probe.target(input_ids=sequence[:, num_cached:], past_key_values=cache, use_cache=True).logits
        cache.crop(-(sequence.shape[1] - num_cached))  # roll the target back exactly
        logits = logits[:, -(tokens.shape[1] + 1):-1].float()  # [1, k, V]: target logits at each draft position
        length = input_ids.shape[1]
        for i in range(tokens.shape[1]):
            scores = self._processors(sequence[:, : length + i], logits[:, i])
            if scores.argmax(-1).item() != tokens[0, i].item():
                return i
        return tokens.shape[1]


def oracle(pair: Pair, ids: torch.Tensor) -> RunRecord:
    log = _ForwardLog(pair.target, pair.draft)
    probe = OracleProbe(pair.target, log)
    config = _rule_head_config(pair, threshold=0.0)
    head = PacerHead(dataclasses.replace(config, block_size=config.max_draft))  # no head call: the probe decides
    record = _timed(pair, "oracle", ids, log=log, assistant_model=pair.draft, pacer_head=head,
                    pacer_candidate_generator=functools.partial(OracleCandidateGenerator, probe=probe))
    record.wall_s -= probe.time_s
    record.excluded_s = probe.time_s
    return record


def registry(pair: Pair) -> dict[str, Callable[[Pair, torch.Tensor], RunRecord]]:
    """All methods by name, in the order reports list them."""
    methods = {"autoregressive": autoregressive}
    methods.update({f"fixed-k{k}": fixed(k) for k in pair.fixed_draft_lengths})
    methods.update({"heuristic": heuristic, "confidence": confidence})
    methods.update({f"prompt-lookup-k{n}": prompt_lookup(n) for n in pair.prompt_lookup_lengths})
    methods["entropy"] = entropy
    methods["entropy+phrases"] = entropy_phrases
    if pair.head is not None:
        methods["pacer"] = pacer
        methods["pacer+phrases"] = pacer_phrases
        methods.update({f"pacer@{t:g}": pacer_at(t) for t in pair.pacer_thresholds})
    methods.update({f"pacer-{name}": other_head(name) for name in pair.other_heads})
    if not pair.do_sample:
        methods["oracle"] = oracle
    return methods
