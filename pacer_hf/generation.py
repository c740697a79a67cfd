"""How `target.generate(..., assistant_model=draft, pacer_head=head)` reaches `PacerCandidateGenerator`.

One route, in two scopes: `generate()` pops the `pacer_*` keyword arguments into a context variable before
transformers validates its kwargs, and `_get_candidate_generator()` returns a `PacerCandidateGenerator` while that
variable is set. `patch_transformers()` installs both on `GenerationMixin` (what `import pacer_hf` does unless
`PACER_HF_NO_PATCH=1`); `enable_pacer(model)` binds them on one model instance only.

Per call, besides the head: `pacer_phrases`, the `PER_CALL_OVERRIDES`, `pacer_stats=PacerStats()` (filled in place;
safe when calls overlap, unlike `head.last_stats`) and `pacer_candidate_generator=` (a `PacerCandidateGenerator`
subclass, or a callable that builds one: the route for research loops such as the evaluation harness's oracle).

Pinned to transformers 5.23 (see pyproject.toml): both hooks are private API. If transformers stops calling
`_get_candidate_generator`, the call warns loudly instead of silently decoding with stock drafting.
"""

import dataclasses
import functools
import inspect
import time
import types
import warnings
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from transformers import GenerationConfig
from transformers.generation.utils import GenerationMixin

from pacer_core.config import PacerHeadConfig
from pacer_core.head import PacerHead
from pacer_core.pair import check_pair_compatible

from .candidate_generator import PacerCandidateGenerator
from .phrases import PhrasePool
from .stats import PacerStats

# generate() keyword -> PacerHeadConfig field it overrides for one call
PER_CALL_OVERRIDES = {
    "pacer_threshold": "threshold",
    "pacer_block_size": "block_size",
    "pacer_max_draft": "max_draft",
    "pacer_score_mode": "score_mode",
    "pacer_phrase_length": "phrase_length",
    "pacer_phrase_tail": "phrase_tail",
}
PHRASE_OVERRIDES = tuple(name for name, config_field in PER_CALL_OVERRIDES.items() if config_field.startswith("phrase_"))

_ORIGINAL_GENERATE = GenerationMixin.generate
_ORIGINAL_GET_CANDIDATE_GENERATOR = GenerationMixin._get_candidate_generator
_GENERATE_SIGNATURE = inspect.signature(_ORIGINAL_GENERATE)
_CANDIDATE_GENERATOR_SIGNATURE = inspect.signature(_ORIGINAL_GET_CANDIDATE_GENERATOR)


@dataclass
class _PacerCall:
    """What one `generate(..., pacer_head=...)` call asked for."""

    model: Any
    head: PacerHead
    config: PacerHeadConfig
    phrases: PhrasePool | None = None
    stats: PacerStats = field(default_factory=PacerStats)
    generator_factory: Callable[..., PacerCandidateGenerator] = PacerCandidateGenerator
    used: bool = False


_ACTIVE_CALL: ContextVar[_PacerCall | None] = ContextVar("pacer_hf_active_call", default=None)


def _pop_pacer_call(model: Any, args: tuple, kwargs: dict) -> _PacerCall | None:
    """Removes the `pacer_*` kwargs (transformers would reject them) and validates the call they describe."""
    head = kwargs.pop("pacer_head", None)
    phrases = _phrase_pool(kwargs.pop("pacer_phrases", None))
    stats = kwargs.pop("pacer_stats", None)
    factory = kwargs.pop("pacer_candidate_generator", None)
    given = {name: value for name in PER_CALL_OVERRIDES if (value := kwargs.pop(name, None)) is not None}
    overrides = {PER_CALL_OVERRIDES[name]: value for name, value in given.items()}
    if head is None:
        extra = {"pacer_phrases": phrases, "pacer_stats": stats, "pacer_candidate_generator": factory}
        names = sorted(given) + sorted(name for name, value in extra.items() if value is not None)
        if names:
            raise ValueError(f"{names} were passed to `generate()` without `pacer_head`; pass a `pacer_head` too.")
        return None
    if stats is not None and not isinstance(stats, PacerStats):
        raise TypeError(f"`pacer_stats` must be a `pacer_hf.PacerStats` to fill, got {type(stats).__name__}.")
    if stats is not None and (stats.draft_lengths or stats.total_time_s):
        raise ValueError("`pacer_stats` already holds another call's statistics; pass a fresh `PacerStats()` per call.")
    if factory is not None and not callable(factory):
        raise TypeError(
            "`pacer_candidate_generator` must be a `PacerCandidateGenerator` subclass or a callable that builds one "
            f"(e.g. a functools.partial), got {type(factory).__name__}."
        )
    if phrases is None and any(name in given for name in PHRASE_OVERRIDES):
        names = sorted(name for name in given if name in PHRASE_OVERRIDES)
        raise ValueError(f"{names} set phrase drafting, which is off: pass `pacer_phrases=True` (or a `PhrasePool`) too.")
    if not isinstance(head, PacerHead):
        raise TypeError(f"`pacer_head` must be a `pacer_hf.PacerHead`, got {type(head).__name__}.")
    arguments = _GENERATE_SIGNATURE.bind_partial(model, *args, **kwargs).arguments
    extra = arguments.get("kwargs", {})
    draft = arguments.get("assistant_model")
    if draft is None:
        raise ValueError(
            "`pacer_head` was passed to `generate()` without `assistant_model`: PACER stops the drafts of a draft "
            "model. Pass `assistant_model=<draft model>` too."
        )
    if arguments.get("custom_generate") is not None:
        raise ValueError("`pacer_head` cannot be combined with `custom_generate`.")
    generation_config = arguments.get("generation_config") or model.generation_config
    _check_decoding_mode(generation_config, extra)
    sampling = bool(extra.get("do_sample", generation_config.do_sample))
    # A rule (the entropy stop) was never trained on labels of either mode.
    if head.config.architecture != "entropy" and head.config.decoding != ("sampling" if sampling else "greedy"):
        warnings.warn(
            f"`pacer_head` was trained on {head.config.decoding} acceptance labels, but this call "
            f"{'samples' if sampling else 'decodes greedily'}. The output stays exact; only the head's stops are "
            f"tuned for the other mode. Train a head with `pacer-hf train --decoding "
            f"{'sampling' if sampling else 'greedy'}` for this mode.",
            UserWarning,
            stacklevel=4,
        )
    check_pair_compatible(head.config, draft, model)
    try:
        config = dataclasses.replace(head.config, **overrides)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"Invalid per-call PACER setting: {exc}") from exc
    return _PacerCall(model=model, head=head, config=config, phrases=phrases,
                      stats=stats if stats is not None else PacerStats(),
                      generator_factory=factory if factory is not None else PacerCandidateGenerator)


def _phrase_pool(value: Any) -> PhrasePool | None:
    """`pacer_phrases`: `True` drafts with a fresh pool for this call, a `PhrasePool` with that pool (warm start)."""
    if value is None or value is False:
        return None
    if value is True:
        return PhrasePool()
    if isinstance(value, PhrasePool):
        return value
    raise TypeError(f"`pacer_phrases` must be True, False or a `pacer_hf.PhrasePool`, got {type(value).__name__}.")


def _check_decoding_mode(generation_config: GenerationConfig, kwargs: dict) -> None:
    """PACER replaces the draft-model candidate generator; refuse modes that never use one or use another."""

    def setting(name: str) -> Any:
        return kwargs[name] if name in kwargs else getattr(generation_config, name, None)

    for name in ("prompt_lookup_num_tokens", "assistant_early_exit"):
        if setting(name):
            raise ValueError(
                f"`{name}` cannot be combined with `pacer_head`: both choose how candidates are drafted. Drop one."
            )
    if (setting("num_beams") or 1) > 1:
        raise ValueError(
            f"`pacer_head` works with greedy decoding and sampling, not beam search (got num_beams="
            f"{setting('num_beams')}). Use num_beams=1."
        )


def _generate(generate_fn: Callable, model: Any, args: tuple, kwargs: dict) -> Any:
    call = _pop_pacer_call(model, args, kwargs)
    if call is None:
        return generate_fn(model, *args, **kwargs)
    token = _ACTIVE_CALL.set(call)
    start = time.perf_counter()
    try:
        output = generate_fn(model, *args, **kwargs)
    finally:
        _ACTIVE_CALL.reset(token)
    call.stats.total_time_s = time.perf_counter() - start
    call.head.last_stats = call.stats
    if not call.used:
        warnings.warn(
            "`pacer_head` was passed to `generate()`, but transformers never asked pacer-hf for a candidate "
            "generator, so this output was decoded WITHOUT PACER. This transformers version is probably not one "
            "pacer-hf supports (see pyproject.toml); please report it.",
            RuntimeWarning,
            stacklevel=3,
        )
    return output


def _get_candidate_generator(original_fn: Callable, model: Any, args: tuple, kwargs: dict) -> Any:
    call = _ACTIVE_CALL.get()
    if call is None or call.model is not model:
        return original_fn(model, *args, **kwargs)
    # Bind by name: the argument order of this private method changed between transformers releases.
    arguments = _CANDIDATE_GENERATOR_SIGNATURE.bind(model, *args, **kwargs).arguments
    call.used = True
    generator = call.generator_factory(
        input_ids=arguments["input_ids"],
        assistant_model=arguments["assistant_model"],
        generation_config=arguments["generation_config"],
        model_kwargs=arguments["model_kwargs"],
        inputs_tensor=arguments.get("inputs_tensor"),
        logits_processor=arguments.get("logits_processor"),
        pacer_head=call.head,
        config=call.config,
        stats=call.stats,
        phrases=call.phrases,
    )
    if not isinstance(generator, PacerCandidateGenerator):
        raise TypeError(
            f"`pacer_candidate_generator` built a {type(generator).__name__}; it must build a `PacerCandidateGenerator`."
        )
    return generator


@functools.wraps(_ORIGINAL_GENERATE)
def _patched_generate(self, *args, **kwargs):
    return _generate(_ORIGINAL_GENERATE, self, args, kwargs)


def _patched_get_candidate_generator(self, *args, **kwargs):
    return _get_candidate_generator(_ORIGINAL_GET_CANDIDATE_GENERATOR, self, args, kwargs)


def patch_transformers() -> None:
    """Makes every transformers model accept `generate(..., pacer_head=...)`. Idempotent; `import pacer_hf` calls it
    unless the environment sets `PACER_HF_NO_PATCH=1`. Without `pacer_head`, `generate()` behaves as before."""
    GenerationMixin.generate = _patched_generate
    GenerationMixin._get_candidate_generator = _patched_get_candidate_generator


def unpatch_transformers() -> None:
    """Restores transformers' own `generate()` and `_get_candidate_generator()`. Idempotent."""
    GenerationMixin.generate = _ORIGINAL_GENERATE
    GenerationMixin._get_candidate_generator = _ORIGINAL_GET_CANDIDATE_GENERATOR


def is_transformers_patched() -> bool:
    return GenerationMixin.generate is _patched_generate


def _instance_generate(self, *args, **kwargs):
    return _generate(type(self).generate, self, args, kwargs)


def _instance_get_candidate_generator(self, *args, **kwargs):
    return _get_candidate_generator(type(self)._get_candidate_generator, self, args, kwargs)


def enable_pacer(model: Any) -> Any:
    """Lets this one model accept `generate(..., pacer_head=...)`, without patching transformers' classes.

    For users who run with `PACER_HF_NO_PATCH=1`. The model's class is untouched (`isinstance`, `save_pretrained`
    and pickling behave as before); [`disable_pacer`] undoes it. Returns the model.
    """
    model.generate = types.MethodType(_instance_generate, model)
    model._get_candidate_generator = types.MethodType(_instance_get_candidate_generator, model)
    return model


def disable_pacer(model: Any) -> Any:
    """Undoes [`enable_pacer`] on `model`. Returns the model."""
    for name in ("generate", "_get_candidate_generator"):
        model.__dict__.pop(name, None)
    return model
