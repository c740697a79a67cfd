"""`PacerHeadConfig`: what a PACER head is, how it drafts, and which draft/target pair it belongs to."""

import dataclasses
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

from ._version import __version__

ARCHITECTURES = ("attention", "mlp", "entropy")
SCORE_MODES = ("round", "block")
DECODING_MODES = ("greedy", "sampling")
# Keys that earlier versions wrote and this one no longer reads (phrase drafting's settings moved to pacer-hf's
# per-call options): dropped on load without a warning.
RETIRED_KEYS = ("phrase_length", "phrase_tail")


def model_sizes(model: Any) -> tuple[int, int]:
    """`(vocab_size, hidden_size)` of a transformers model as a head sees them: the text config's vocabulary and the
    width of the lm_head's input (the post-norm hidden state the head reads). The one place pacer-hf reads them."""
    return model.config.get_text_config().vocab_size, model.get_output_embeddings().weight.shape[1]


def _check_int(name: str, value: Any, low: int, why: str | None = None) -> None:
    """`TypeError` unless `value` is an int (not a bool); `ValueError` unless it is >= `low`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an integer, got {value!r} ({type(value).__name__}).")
    if value < low:
        raise ValueError(f"`{name}` must be >= {why or low}, got {value}.")


def _check_number(name: str, value: Any, low: float, high: float, open_low: bool = False) -> float:
    """`TypeError` unless `value` is a real number (not a bool); `ValueError` outside `[low, high]` (or
    `(low, high]`). Returns it as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"`{name}` must be a number, got {value!r} ({type(value).__name__}).")
    if not (low < value if open_low else low <= value) or not value <= high:
        bounds = f"{'(' if open_low else '['}{low:g}, {high:g}]"
        raise ValueError(f"`{name}` must be in {bounds}, got {value}.")
    return float(value)


@dataclass
class PacerHeadConfig:
    """Configuration of a [`PacerHead`]; round-trips to the head's `config.json`.

    This dataclass is the only source of defaults in pacer-hf: functions take a config (or `None`), never a
    re-typed default. Like PEFT's `PeftConfig`, it records what the head belongs to, so that attaching it to
    another draft model is an error instead of a silent wrong answer.

    Args:
        vocab_size (`int`):
            Vocabulary size of the draft model (`config.vocab_size`, its embedding rows) the head was built for.
        draft_hidden_size (`int`):
            Width of the draft model's last (post-norm) hidden state, the head's main input.
        draft_name_or_path (`str`, *optional*):
            Hub id or path of the draft model.
        draft_revision (`str`, *optional*):
            Revision (commit) of the draft model when known.
        target_name_or_path (`str`, *optional*):
            Hub id or path of the target model the acceptance labels came from.
        target_revision (`str`, *optional*):
            Revision (commit) of the target model when known.
        target_vocab_size (`int`, *optional*):
            Vocabulary size (embedding rows) of the target, when known. It differs from `vocab_size` for pairs that
            share one tokenizer but pad their embeddings differently (Qwen2.5-0.5B's 151,936 rows, 7B's 152,064).
        draft_fingerprint (`str`, *optional*):
            A hash of the draft's architecture and of the parameters that quantization and dtype casts leave alone
            (its norms and biases), from [`draft_fingerprint`]: `generate()` warns when the head meets a draft of the
            same sizes with another fingerprint (another fine-tune of the same base, say).
        architecture (`str`, defaults to `"attention"`):
            `"attention"`: one causal self-attention block over the round's positions, then an MLP (reference).
            `"mlp"`: a per-token MLP (ablation).
            `"entropy"`: no weights, a rule: a token passes when the entropy of the draft distribution it was drawn
            from is at most `entropy_threshold` (AdaEDL/SVIP style). Nothing to train; see [`PacerHead.entropy_stop`].
        head_hidden_size (`int`, defaults to 128):
            Width of the head's residual stream.
        num_attention_heads (`int`, defaults to 4):
            Attention heads of the `"attention"` architecture.
        block_size (`int`, defaults to 4):
            Draft tokens per block; the head runs once after each full block.
        threshold (`float`, defaults to 0.5):
            Drafting stops when the pass score falls below it. 0 never stops, 1 stops after the first block.
            `pacer-hf train` picks it from validation data and the pair's measured cost ratio.
        max_draft (`int`, defaults to 16):
            Most draft tokens per round; also the size of the head's position table.
        score_mode (`str`, defaults to `"round"`):
            `"round"`: pass score = product of the predicted acceptance probabilities of the whole round so far
            (the probability that the next block is reached at all). `"block"`: product over the last block only.
        decoding (`str`, defaults to `"greedy"`):
            The decoding mode whose acceptance labels the head was trained on (`"greedy"` or `"sampling"`).
        entropy_threshold (`float`, defaults to 1.0):
            Nats; the `"entropy"` architecture's rule (ignored by the others). 1.0 was chosen for Qwen2.5-Coder
            0.5B -> 1.5B on prompts disjoint from every evaluation set (`python -m eval.research.tune_entropy`).
        temperature (`float`, defaults to 1.0):
            Sampling temperature of the soft acceptance labels a `"sampling"` head was trained on (ignored for
            `"greedy"`); `pacer-hf train` copies it from the collected data.
        pacer_hf_version (`str`):
            Version of pacer-hf that wrote the config; stamped automatically.
    """

    vocab_size: int = field(metadata={"help": "Vocabulary size of the draft model."})
    draft_hidden_size: int = field(metadata={"help": "Width of the draft's post-norm last hidden state."})
    draft_name_or_path: str | None = field(default=None, metadata={"help": "Hub id or path of the draft."})
    draft_revision: str | None = field(default=None, metadata={"help": "Revision of the draft, when known."})
    target_name_or_path: str | None = field(default=None, metadata={"help": "Hub id or path of the target."})
    target_revision: str | None = field(default=None, metadata={"help": "Revision of the target, when known."})
    target_vocab_size: int | None = field(default=None, metadata={"help": "Embedding rows of the target."})
    draft_fingerprint: str | None = field(default=None, metadata={"help": "Hash of the draft's identity."})
    architecture: str = field(default="attention", metadata={"help": f"One of {ARCHITECTURES}."})
    head_hidden_size: int = field(default=128, metadata={"help": "Width of the head's residual stream."})
    num_attention_heads: int = field(default=4, metadata={"help": "Heads of the attention block."})
    block_size: int = field(default=4, metadata={"help": "Draft tokens per head call."})
    threshold: float = field(default=0.5, metadata={"help": "Stop drafting when the pass score falls below this."})
    max_draft: int = field(default=16, metadata={"help": "Most draft tokens per round."})
    score_mode: str = field(default="round", metadata={"help": f"One of {SCORE_MODES}."})
    decoding: str = field(default="greedy", metadata={"help": f"One of {DECODING_MODES}."})
    entropy_threshold: float = field(default=1.0, metadata={"help": "Nats; the entropy rule's threshold."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of a sampling head's labels."})
    pacer_hf_version: str = field(default=__version__, metadata={"help": "pacer-hf version that wrote it."})

    def __post_init__(self) -> None:
        for name, low in (("vocab_size", 1), ("draft_hidden_size", 1), ("head_hidden_size", 1),
                          ("num_attention_heads", 1), ("block_size", 1)):
            _check_int(name, getattr(self, name), low)
        if self.target_vocab_size is not None:
            _check_int("target_vocab_size", self.target_vocab_size, 1)
        _check_int("max_draft", self.max_draft, self.block_size, why=f"`block_size` ({self.block_size}): a round "
                   "drafts at least one block")
        self.threshold = _check_number("threshold", self.threshold, 0.0, 1.0)
        self.temperature = _check_number("temperature", self.temperature, 0.0, math.inf, open_low=True)
        self.entropy_threshold = _check_number("entropy_threshold", self.entropy_threshold, 0.0, math.inf)
        for name, allowed in (
            ("architecture", ARCHITECTURES),
            ("score_mode", SCORE_MODES),
            ("decoding", DECODING_MODES),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"`{name}` must be one of {allowed}, got {getattr(self, name)!r}.")
        if self.architecture == "attention" and self.head_hidden_size % self.num_attention_heads:
            raise ValueError(
                f"`head_hidden_size` ({self.head_hidden_size}) must be divisible by `num_attention_heads` "
                f"({self.num_attention_heads})."
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def for_draft(cls, draft: Any, **settings: Any) -> "PacerHeadConfig":
        """A config sized for `draft` ([`model_sizes`]), with the other fields from `settings`."""
        vocab_size, hidden_size = model_sizes(draft)
        return cls(vocab_size=vocab_size, draft_hidden_size=hidden_size, **settings)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PacerHeadConfig":
        """Builds a config from a `config.json` dict: unknown keys warn once, missing required keys raise."""
        if not isinstance(data, dict):
            raise TypeError(f"A PACER head config must be a JSON object, got {type(data).__name__}.")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known - set(RETIRED_KEYS))
        if unknown:
            saved_by = data.get("pacer_hf_version", "unknown")
            advice = (
                "It was written by this same version, so the keys were added by hand or by another fork"
                if saved_by == __version__ else
                f"It was probably saved by a newer pacer-hf (version {saved_by}); upgrade pacer-hf"
            )
            warnings.warn(
                f"The PACER head config has keys this pacer-hf ({__version__}) does not know: {unknown}. {advice}. "
                "The keys are ignored.",
                UserWarning,
                stacklevel=2,
            )
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
        missing = [name for name in required if name not in data]
        if missing:
            raise ValueError(f"The PACER head config is missing required keys {missing}; it is not a valid head config.")
        return cls(**{k: v for k, v in data.items() if k in known})
