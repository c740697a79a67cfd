"""`PacerHead`: the stop head's interface and Hub I/O, and its two kinds, `NeuralHead` and `EntropyRule`.

Notation used in shapes: B = batch, k = draft positions of the round so far, H = draft hidden size,
V = vocabulary, F = number of distribution features, D = head width.
"""

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from huggingface_hub import ModelCard, PyTorchModelHubMixin, hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError, HFValidationError, LocalEntryNotFoundError, RepositoryNotFoundError,
)
from huggingface_hub.utils import validate_repo_id
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from ._version import __version__
from .files import recover_folder, save_folder_atomic
from .config import PacerHeadConfig
from .features import ENTROPY_FEATURE, NUM_DISTRIBUTION_FEATURES
from .model_card import build_model_card

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
CARD_NAME = "README.md"
# Initial classifier bias: sigmoid(10) = 0.99995, so an untrained head predicts "accept" everywhere and drafting
# continues to `max_draft` (plain fixed-length drafting) for any threshold below 0.999.
CONTINUE_LOGIT = 10.0
# The entropy rule's acceptance logit per nat below its threshold: a step, 0.1 nat from the threshold already
# sigmoid(+-5) = 0.993 / 0.007, so with `block_size=1`, `score_mode="block"` and `threshold=0.5` a round stops right
# after the first token whose draft entropy exceeds the threshold.
ENTROPY_LOGIT_SCALE = 50.0
# The drafting settings under which the entropy rule stops exactly at the first token above its threshold.
ENTROPY_RULE_SETTINGS = {"architecture": "entropy", "block_size": 1, "score_mode": "block", "threshold": 0.5}


def _check_hub_id(name: str) -> None:
    """Refuses, before any network access, a name that can be neither a local folder nor a head's Hub repo. Heads live
    in `namespace/name` repos; a bare name (a mistyped relative folder, usually) would otherwise cost many seconds of
    Hub retries before failing."""
    try:
        validate_repo_id(name)
        valid = name.count("/") == 1
    except HFValidationError:
        valid = False
    if not valid:
        raise ValueError(
            f"`{name}` is neither an existing local folder nor a Hub repo id (`org/name`). Pass the folder that "
            "`pacer-hf train` or `save_pretrained` wrote, or a Hub id."
        )


def _check_config_file(name: str, kwargs: dict[str, Any]) -> None:
    """Refuses a `config.json` that is JSON but not an object (the mixin would fail with an `AttributeError`)."""
    if os.path.isdir(name):
        path = os.path.join(name, CONFIG_NAME)
        if not os.path.isfile(path):
            return  # `_from_pretrained` names the missing file
    else:
        hub_kwargs = ("revision", "cache_dir", "force_download", "token", "local_files_only")
        try:
            path = hf_hub_download(repo_id=name, filename=CONFIG_NAME,
                                   **{k: kwargs[k] for k in hub_kwargs if k in kwargs})
        except EntryNotFoundError:
            return
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(
            f"The `{CONFIG_NAME}` of PACER head `{name}` holds a JSON {type(data).__name__}, not an object of "
            "`PacerHeadConfig` fields: it is not a head config. Re-download or re-save the head."
        )


def _check_kind(head: nn.Module, config: PacerHeadConfig, architectures: tuple[str, ...]) -> None:
    if config.architecture not in architectures:
        raise ValueError(f"A `{type(head).__name__}` has architecture {architectures}, got a config for "
                         f"{config.architecture!r}; build heads with `PacerHead(config)`, which picks the kind.")


class _CausalSelfAttention(nn.Module):
    def __init__(self, width: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        # q, k, v: [B, heads, k, D / heads]
        q, k, v = self.qkv(x).view(batch, length, 3, self.num_heads, width // self.num_heads).permute(2, 0, 3, 1, 4)
        # causal: the score of position i may depend only on tokens drafted up to i (stopping-time rule)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(batch, length, width))


class PacerHead(
    nn.Module,
    PyTorchModelHubMixin,
    library_name="pacer-hf",
    paper_url="https://arxiv.org/abs/2602.01274",
    docs_url="https://huggingface.co/docs/transformers/generation_strategies#speculative-decoding",
    license="apache-2.0",
    tags=["speculative-decoding", "pacer"],
):
    """A PACER stop head (arXiv 2602.01274): for each drafted token of a round, the log-odds that the target accepts
    it given that all earlier tokens of the round were accepted.

    Two kinds behind this one interface, chosen by `config.architecture`; `PacerHead(config)` and
    `PacerHead.from_pretrained(...)` build the kind the config names:
    - [`NeuralHead`] (`"attention"`, the reference: one causal self-attention block over the round's positions, then
      an MLP; `"mlp"`: the per-token ablation), trained with `pacer-hf train`. Its inputs per drafted position: the
      draft's post-norm last hidden state (the input of its `lm_head`) and [`draft_distribution_features`] of the
      processed draft distribution.
    - [`EntropyRule`] (`"entropy"`): a training-free rule with no weights ([`PacerHead.entropy_stop`]); for greedy
      decoding on the Qwen2.5-Coder pair it stops as well as the trained heads or better (docs/qwen-head.md).

    A head folder is `config.json` (a [`PacerHeadConfig`]) and `model.safetensors` (empty for a rule); nothing is
    pickled.

    Example:

    ```python
    >>> import pacer_hf
    >>> from pacer_hf import PacerHead, PacerHeadConfig, PacerStats
    >>> head = PacerHead(PacerHeadConfig.for_draft(draft))  # untrained: drafts to max_draft, like a fixed length
    >>> head.save_pretrained("my-head")
    >>> head = PacerHead.from_pretrained("my-head")  # or a Hub id
    >>> stats = PacerStats()
    >>> out = target.generate(**inputs, assistant_model=draft, pacer_head=head, pacer_stats=stats, max_new_tokens=64)
    ```

    See also transformers' assisted generation:
    https://huggingface.co/docs/transformers/generation_strategies#speculative-decoding
    """

    def __new__(cls, config: PacerHeadConfig, *args, **kwargs):
        # `PacerHead(config)` builds the kind the config names; a subclass builds itself.
        if cls is PacerHead:
            cls = EntropyRule if getattr(config, "architecture", None) == "entropy" else NeuralHead
        return super().__new__(cls, config, *args, **kwargs)

    def __init__(self, config: PacerHeadConfig):
        super().__init__()
        if not isinstance(config, PacerHeadConfig):
            raise TypeError(f"`config` must be a `PacerHeadConfig`, got {type(config).__name__}.")
        self.config = config

    def forward(self, hidden_states: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Acceptance logits for the drafted positions of one round.

        Args:
            hidden_states (`torch.FloatTensor` of shape `(batch_size, num_draft_tokens, draft_hidden_size)`):
                The draft's post-norm last hidden state at the position that produced each drafted token.
            features (`torch.FloatTensor` of shape `(batch_size, num_draft_tokens, 3)`):
                [`draft_distribution_features`] of each drafted token.

        Returns:
            `torch.FloatTensor` of shape `(batch_size, num_draft_tokens)`: log-odds that the target accepts each
            token given that the earlier tokens of the round were accepted.
        """
        raise NotImplementedError

    @classmethod
    def entropy_stop(cls, draft: nn.Module, entropy_threshold: float | None = None, **settings: Any) -> "EntropyRule":
        """The training-free entropy rule as a head: drafting stops right after the first token whose processed draft
        distribution has an entropy above `entropy_threshold` nats, or at `max_draft`.

        ```python
        >>> head = PacerHead.entropy_stop(draft)  # 1.0 nats, chosen for Qwen2.5-Coder 0.5B -> 1.5B
        >>> out = target.generate(**inputs, assistant_model=draft, pacer_head=head, max_new_tokens=64)
        ```

        Args:
            draft (`nn.Module`): the draft model (sizes the config, for the same pair check as a trained head; the
                rule is placed on its device).
            entropy_threshold (`float`, *optional*): nats; defaults to `PacerHeadConfig`'s.
            settings: other [`PacerHeadConfig`] fields (`max_draft`, `decoding`, ...).
        """
        rule = dict(ENTROPY_RULE_SETTINGS)
        if entropy_threshold is not None:
            rule["entropy_threshold"] = entropy_threshold
        head = PacerHead(PacerHeadConfig.for_draft(draft, **{**rule, **settings})).eval()
        weight = next(draft.parameters(), None)
        return head.to(weight.device) if weight is not None else head  # where the draft's features are

    def num_parameters(self) -> int:
        """Number of parameters (0 for a rule), like transformers' `PreTrainedModel.num_parameters()`."""
        return sum(p.numel() for p in self.parameters())

    @property
    def device(self) -> torch.device:
        """Where the head's inputs go."""
        return self._anchor.device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the head's inputs."""
        return self._anchor.dtype

    @property
    def _anchor(self) -> torch.Tensor:
        """A tensor that `.to()` moves with the head: it gives the head's device and dtype."""
        raise NotImplementedError

    # ---- saving and loading -------------------------------------------------------------------------------

    def save_pretrained(
        self,
        save_directory: str | Path,
        *,
        config: PacerHeadConfig | None = None,
        repo_id: str | None = None,
        push_to_hub: bool = False,
        model_card_kwargs: dict[str, Any] | None = None,
        extra_files: Mapping[str, bytes] | None = None,
        **push_to_hub_kwargs,
    ) -> str | None:
        """Saves `config.json`, `model.safetensors`, a model card and `extra_files` to `save_directory`, all of them
        or none ([`save_folder_atomic`]): after a kill or a full disk at any step the folder holds the old head or the
        new one, never new weights beside an old config. Works where `save_directory` is a mount point.

        Args:
            save_directory (`str` or `Path`): the head folder, created if needed.
            config ([`PacerHeadConfig`], *optional*): the config to save instead of `self.config`.
            repo_id (`str`, *optional*): with `push_to_hub`, the Hub repo (default: the folder's name).
            push_to_hub (`bool`): also upload the head ([`PyTorchModelHubMixin.push_to_hub`]).
            model_card_kwargs (`dict`, *optional*): passed to [`generate_model_card`]. An existing `README.md` is never
                replaced (it may be a card the user edited).
            extra_files (`Mapping[str, bytes]`, *optional*): more files saved with the head in the same commit (the
                training metrics and plot of `pacer-hf train`).
        """
        save_directory = Path(save_directory)
        config = dataclasses.replace(config or self.config, pacer_hf_version=__version__)

        def write(staging: Path) -> None:
            PyTorchModelHubMixin.save_pretrained(self, staging, config=config.to_dict(),
                                                 model_card_kwargs=model_card_kwargs)
            for name, data in (extra_files or {}).items():
                (staging / name).write_bytes(data)

        save_folder_atomic(save_directory, write, keep_existing=(CARD_NAME,))
        if push_to_hub:
            return self.push_to_hub(
                repo_id or save_directory.name, config=config.to_dict(), model_card_kwargs=model_card_kwargs,
                **push_to_hub_kwargs,
            )
        return None

    def generate_model_card(
        self,
        *,
        card: ModelCard | None = None,
        repo_id: str | None = None,
        datasets: Sequence[str] = (),
        speedups: Mapping[str, float] | None = None,
        metrics: Mapping[str, Any] | None = None,
    ) -> ModelCard:
        """The head's model card, rendered from pacer-hf's template (`pacer_core/templates/pacer_head_card.md`).

        Its YAML front matter carries `library_name: pacer-hf`, `base_model: <draft>` with
        `base_model_relation: adapter` (when the draft is a Hub id), `draft_model`, `target_model`, the tags,
        `datasets`, the license and, given `speedups`, a `model-index`. Passing an existing `card` updates only its
        metadata and keeps its text; doing so again changes nothing (idempotent, like PEFT's
        `create_or_update_model_card`).

        Args:
            card (`ModelCard`, *optional*): a card to update instead of rendering the template.
            repo_id (`str`, *optional*): the Hub repo the head goes to, shown in the usage example.
            datasets (`Sequence[str]`): Hub dataset ids of the training prompts.
            speedups (`Mapping[str, float]`, *optional*): measured speed-up per prompt set (`pacer-hf bench`).
            metrics (`Mapping[str, Any]`, *optional*): the `training_metrics.json` of `pacer-hf train`.

        Returns:
            `huggingface_hub.ModelCard`.
        """
        return build_model_card(
            self.config, self.num_parameters(), self._hub_mixin_info.model_card_data, card=card, repo_id=repo_id,
            datasets=datasets, speedups=speedups, metrics=metrics,
        )

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path, **kwargs) -> "PacerHead":
        """Loads a head from a local folder or a Hub repo (`config.json` + `model.safetensors`).

        Accepts the keyword arguments of `huggingface_hub.ModelHubMixin.from_pretrained` (`revision`, `cache_dir`,
        `local_files_only`, `token`, ...) and `map_location`. Raises `ValueError` for a missing, corrupt or
        mismatching `config.json` or weights file.
        """
        if Path(pretrained_model_name_or_path).is_dir():
            recover_folder(pretrained_model_name_or_path)  # finish or discard a save a kill interrupted
        else:
            _check_hub_id(str(pretrained_model_name_or_path))
        try:
            _check_config_file(str(pretrained_model_name_or_path), kwargs)
            return super().from_pretrained(pretrained_model_name_or_path, **kwargs)
        except (RepositoryNotFoundError, LocalEntryNotFoundError) as exc:
            raise OSError(
                f"There is no local folder `{pretrained_model_name_or_path}`, and its Hub repo could not be read: "
                + ("the Hub has no such repo (or it is private: pass `token=`)."
                   if isinstance(exc, RepositoryNotFoundError) else
                   "it is not in the local cache and the Hub is unreachable (offline?).")
                + " Check the folder path or the repo id."
            ) from exc
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"The `config.json` of PACER head `{pretrained_model_name_or_path}` is not valid JSON ({exc}). "
                "Re-download or re-save the head."
            ) from exc

    @classmethod
    def _decode_arg(cls, expected_type: Any, value: Any) -> Any:
        # The mixin decodes dataclass configs by dropping unknown keys silently; ours warns on unknown keys and
        # names missing ones.
        if expected_type is PacerHeadConfig:
            return PacerHeadConfig.from_dict(value)
        return super()._decode_arg(expected_type, value)

    @classmethod
    def _from_pretrained(
        cls,
        *,
        model_id: str,
        revision: str | None,
        cache_dir: str | Path | None,
        force_download: bool,
        local_files_only: bool,
        token: str | bool | None,
        config: PacerHeadConfig | None = None,
        map_location: str = "cpu",
    ) -> "PacerHead":
        if config is None:
            raise ValueError(
                f"No `{CONFIG_NAME}` found for PACER head `{model_id}`: a head cannot be loaded without its config."
            )
        if os.path.isdir(model_id):
            weights_file = os.path.join(model_id, WEIGHTS_NAME)
            if not os.path.isfile(weights_file):
                raise ValueError(f"No `{WEIGHTS_NAME}` in PACER head folder `{model_id}`.")
        else:
            try:
                weights_file = hf_hub_download(
                    repo_id=model_id, filename=WEIGHTS_NAME, revision=revision, cache_dir=cache_dir,
                    force_download=force_download, local_files_only=local_files_only, token=token,
                )
            except EntryNotFoundError as exc:
                raise ValueError(f"No `{WEIGHTS_NAME}` in PACER head repo `{model_id}`.") from exc
        try:
            state_dict = load_file(weights_file, device=str(map_location))
        except (SafetensorError, OSError) as exc:
            raise ValueError(
                f"The weights file `{weights_file}` of PACER head `{model_id}` is corrupt or truncated ({exc}). "
                "Re-download or re-save the head."
            ) from exc
        head = cls(config)
        try:
            head.load_state_dict(state_dict, strict=True)
        except RuntimeError as exc:
            raise ValueError(
                f"The weights in `{weights_file}` do not match the architecture in its `{CONFIG_NAME}` "
                f"({config.architecture}, draft_hidden_size={config.draft_hidden_size}, "
                f"head_hidden_size={config.head_hidden_size}): {exc}"
            ) from exc
        return head.to(map_location).eval()


class NeuralHead(PacerHead):
    """The trained PACER head: the draft's hidden state and distribution features of each drafted position, a causal
    self-attention block over the round's positions (`"attention"`, the reference) or none (`"mlp"`), then an MLP and
    a classifier. An untrained head predicts "accept" everywhere (see `CONTINUE_LOGIT`), so it drafts to `max_draft`
    like fixed-length drafting. Build it with `PacerHead(config)`."""

    def __init__(self, config: PacerHeadConfig):
        super().__init__(config)
        _check_kind(self, config, ("attention", "mlp"))
        width = config.head_hidden_size
        self.hidden_norm = nn.LayerNorm(config.draft_hidden_size)
        self.hidden_proj = nn.Linear(config.draft_hidden_size, width)
        self.feature_proj = nn.Linear(NUM_DISTRIBUTION_FEATURES, width)
        self.position_embedding = nn.Embedding(config.max_draft, width)
        if config.architecture == "attention":
            self.attn_norm = nn.LayerNorm(width)
            self.attn = _CausalSelfAttention(width, config.num_attention_heads)
        self.mlp_norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.out_norm = nn.LayerNorm(width)
        self.classifier = nn.Linear(width, 1)
        nn.init.zeros_(self.classifier.weight)
        nn.init.constant_(self.classifier.bias, CONTINUE_LOGIT)

    @property
    def max_positions(self) -> int:
        """Positions of the head's position table: the most drafted tokens of a round it can score."""
        return self.position_embedding.num_embeddings

    def forward(self, hidden_states: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(hidden_states.shape[1], device=hidden_states.device)  # [k]
        x = self.hidden_proj(self.hidden_norm(hidden_states)) + self.feature_proj(features)  # [B, k, D]
        x = x + self.position_embedding(positions)
        if self.config.architecture == "attention":
            x = x + self.attn(self.attn_norm(x))
        x = x + self.mlp(self.mlp_norm(x))
        return self.classifier(self.out_norm(x)).squeeze(-1)  # [B, k]

    @property
    def _anchor(self) -> torch.Tensor:
        return self.classifier.bias


class EntropyRule(PacerHead):
    """The training-free entropy stop (AdaEDL/SVIP style) as a head with no weights: a token passes when the entropy
    of the draft distribution it was drawn from is at most `config.entropy_threshold` nats. Build it with
    [`PacerHead.entropy_stop`] (its drafting settings make it stop right after the first token above the
    threshold)."""

    def __init__(self, config: PacerHeadConfig):
        super().__init__(config)
        _check_kind(self, config, ("entropy",))
        # Not saved (the config holds it); a buffer so that `.to()` gives the rule the head's device and dtype.
        self.register_buffer("entropy_threshold", torch.tensor(config.entropy_threshold), persistent=False)

    def forward(self, hidden_states: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return ENTROPY_LOGIT_SCALE * (self.entropy_threshold - features[..., ENTROPY_FEATURE])  # [B, k]

    @property
    def _anchor(self) -> torch.Tensor:
        return self.entropy_threshold
