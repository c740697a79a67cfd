"""How `target.generate(..., assistant_model=draft, pacer_head=head)` reaches `PacerCandidateGenerator`, and back.

The route, in the order a call takes it:

1. `generate()` (transformers' own, wrapped by [`patch_transformers`] or, for one model, [`enable_pacer`]) calls
   [`_prepare_call`] before transformers sees the arguments:
   - `_pop_pacer_kwargs`: takes the `pacer_*` keyword arguments out (transformers would reject them);
   - `_bind_generate_arguments`: reads the transformers arguments PACER needs (draft, config, stopping criteria,
     tokenizers, the prompt);
   - `_check_call`: refuses what PACER cannot honour (beam search, prompt lookup, a head on the meta device, ...);
   - `check_pair_compatible`: the head, the draft and the target belong together;
   - `_phrase_pool`: planned rounds (the default) or the paper's loop (`pacer_phrases=False`);
   - `resolve_draft_vocab`: how much of its vocabulary the draft scores (`pacer_draft_vocab`);
   - `_call_config`: the one `PacerHeadConfig` of this call (the head's, with the per-call overrides);
   - `_warn_call`: what works but is probably not what the user wants (a head trained for the other decoding mode).
2. transformers runs its own `generate()`, whose assisted loop asks `_get_candidate_generator()`; for the model of
   the active call, [`_build_generator`] returns the call's generator (a `PhraseCandidateGenerator`, whose rounds a
   planner composes, by default; a `PacerCandidateGenerator`, the paper's loop, with `pacer_phrases=False`; or the
   `pacer_candidate_generator` the call named, which then takes `phrases=` and `costs=` with phrases on), with the
   call's stopping criteria; any other model gets transformers' own.
3. transformers verifies each round's candidates with its own code, and `generate()` returns its own output; the
   route fills in the call's total time and warns loudly if transformers never asked for a generator.

Why a context variable joins steps 1 and 2: transformers calls `_get_candidate_generator` from deep inside its
`generate()` with its own arguments only, so the head and the settings of the call cannot travel with them. Step 1
leaves the call in a `ContextVar` (one per thread and per asyncio task, so concurrent calls stay apart), set and reset
around exactly one `generate()`; step 2 reads it. Nothing else passes through it.

Pinned to transformers 5.23 (see pyproject.toml): both hooks are private API.
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

from transformers import GenerationConfig, StoppingCriteriaList
from transformers.generation.utils import GenerationMixin

from pacer_core.config import PacerHeadConfig
from pacer_core.head import EntropyRule, PacerHead
from pacer_core.pair import check_max_draft

from .candidate_generator import PacerCandidateGenerator
from .draft_vocabulary import resolve_draft_vocab
from .pair import check_pair_compatible
from .phrase_drafting import PhraseCandidateGenerator
from .phrases import PhrasePool
from .planner import costs_for
from .stats import PacerStats

# generate() keyword -> PacerHeadConfig field it overrides for one call
PER_CALL_OVERRIDES = {
    "pacer_threshold": "threshold",
    "pacer_block_size": "block_size",
    "pacer_max_draft": "max_draft",
    "pacer_score_mode": "score_mode",
}

_ORIGINAL_GENERATE = GenerationMixin.generate
_ORIGINAL_GET_CANDIDATE_GENERATOR = GenerationMixin._get_candidate_generator
_GENERATE_SIGNATURE = inspect.signature(_ORIGINAL_GENERATE)
_CANDIDATE_GENERATOR_SIGNATURE = inspect.signature(_ORIGINAL_GET_CANDIDATE_GENERATOR)


@dataclass
class PacerKwargs:
    """The `pacer_*` keyword arguments of one `generate()` call, as given."""

    head: Any = None
    phrases: Any = None
    stats: Any = None
    generator: Any = None
    draft_vocab: Any = "auto"
    overrides: dict[str, Any] = field(default_factory=dict)  # generate() keyword -> value

    def given(self) -> list[str]:
        """The names of the arguments that were passed, besides `pacer_head`."""
        extra = {"pacer_phrases": self.phrases, "pacer_stats": self.stats, "pacer_candidate_generator": self.generator,
                 "pacer_draft_vocab": None if self.draft_vocab == "auto" else True}
        return sorted(self.overrides) + sorted(name for name, value in extra.items() if value is not None)


@dataclass
class _PacerCall:
    """What one `generate(..., pacer_head=...)` call asked for, checked."""

    model: Any
    head: PacerHead
    config: PacerHeadConfig
    phrases: PhrasePool | None
    stats: PacerStats
    generator_factory: Callable[..., PacerCandidateGenerator]
    stopping_criteria: StoppingCriteriaList | None  # the user's `stopping_criteria=`
    tokenizer: Any  # the `tokenizer=` (stop strings, padded pairs)
    draft_vocab: int | None = None  # the draft scores ids below this and the sequence's (None: all of them)
    used: bool = False


_ACTIVE_CALL: ContextVar[_PacerCall | None] = ContextVar("pacer_hf_active_call", default=None)


# ---- step 1: the call -------------------------------------------------------------------------------------------


def _pop_pacer_kwargs(kwargs: dict) -> PacerKwargs:
    """Removes the `pacer_*` kwargs from `kwargs` (transformers would reject them)."""
    return PacerKwargs(
        head=kwargs.pop("pacer_head", None),
        phrases=kwargs.pop("pacer_phrases", None),
        stats=kwargs.pop("pacer_stats", None),
        generator=kwargs.pop("pacer_candidate_generator", None),
        draft_vocab=kwargs.pop("pacer_draft_vocab", "auto"),
        overrides={name: value for name in PER_CALL_OVERRIDES if (value := kwargs.pop(name, None)) is not None},
    )


@dataclass
class _GenerateArguments:
    """The transformers arguments of a `generate()` call that PACER reads."""

    draft: Any
    generation_config: GenerationConfig
    options: dict[str, Any]  # the kwargs transformers puts on the per-call config or passes on (do_sample, ...)
    custom_generate: Any
    stopping_criteria: StoppingCriteriaList | None
    has_input_ids: bool
    has_inputs_embeds: bool


def _bind_generate_arguments(model: Any, args: tuple, kwargs: dict) -> _GenerateArguments:
    arguments = _GENERATE_SIGNATURE.bind_partial(model, *args, **kwargs).arguments
    options = arguments.get("kwargs", {})
    return _GenerateArguments(
        draft=arguments.get("assistant_model"),
        generation_config=arguments.get("generation_config") or model.generation_config,
        options=options,
        custom_generate=arguments.get("custom_generate"),
        stopping_criteria=arguments.get("stopping_criteria"),
        has_input_ids=arguments.get("inputs") is not None or options.get("input_ids") is not None,
        has_inputs_embeds=options.get("inputs_embeds") is not None,
    )


def _setting(call: _GenerateArguments, name: str) -> Any:
    """A generation setting as this call has it: its kwarg, else its generation config's value."""
    return call.options[name] if name in call.options else getattr(call.generation_config, name, None)


def _check_call(pacer: PacerKwargs, call: _GenerateArguments) -> None:
    """Refuses, with the fix, what PACER cannot honour or what was passed wrongly."""
    head = pacer.head
    if not isinstance(head, PacerHead):
        raise TypeError(f"`pacer_head` must be a `pacer_hf.PacerHead`, got {type(head).__name__}.")
    if head.device.type == "meta":
        raise ValueError(
            "`pacer_head` is on the `meta` device: its weights were never loaded (built under `init_empty_weights` "
            "or `device_map`?). Load it with `PacerHead.from_pretrained(...)` or move it with `.to(draft.device)`."
        )
    if pacer.stats is not None and not isinstance(pacer.stats, PacerStats):
        raise TypeError(f"`pacer_stats` must be a `pacer_hf.PacerStats` to fill, got {type(pacer.stats).__name__}.")
    if pacer.stats is not None and (pacer.stats.draft_lengths or pacer.stats.total_time_s):
        raise ValueError("`pacer_stats` already holds another call's statistics; pass a fresh `PacerStats()` per call.")
    if pacer.generator is not None and not callable(pacer.generator):
        raise TypeError(
            "`pacer_candidate_generator` must be a `PacerCandidateGenerator` subclass or a callable that builds one "
            f"(e.g. a functools.partial), got {type(pacer.generator).__name__}."
        )
    if call.draft is None:
        raise ValueError(
            "`pacer_head` was passed to `generate()` without `assistant_model`: PACER stops the drafts of a draft "
            "model. Pass `assistant_model=<draft model>` too."
        )
    draft_device = getattr(call.draft, "device", head.device)
    if head.device != draft_device:
        raise ValueError(
            f"`pacer_head` is on {head.device} but the draft on {draft_device}: each head call would copy the draft's "
            f"hidden states across devices. Move the head with `head.to(draft.device)`."
        )
    if call.custom_generate is not None:
        raise ValueError("`pacer_head` cannot be combined with `custom_generate`.")
    if call.has_inputs_embeds and not call.has_input_ids:
        raise ValueError(
            "`inputs_embeds` without `input_ids` cannot be drafted from: the draft model reads token ids. Pass the "
            "prompt's `input_ids` (with `inputs_embeds`, or instead of it)."
        )
    for name in ("prompt_lookup_num_tokens", "assistant_early_exit"):
        if _setting(call, name):
            raise ValueError(
                f"`{name}` cannot be combined with `pacer_head`: both choose how candidates are drafted. Drop one "
                "(pacer-hf's phrase drafting, `pacer_phrases=True`, copies from the sequence as prompt lookup does)."
            )
    if (_setting(call, "num_beams") or 1) > 1:
        raise ValueError(
            f"`pacer_head` works with greedy decoding and sampling, not beam search (got num_beams="
            f"{_setting(call, 'num_beams')}). Use num_beams=1."
        )


def _plans_rounds(factory: Any) -> bool:
    """Whether a `pacer_candidate_generator` (a class, or a `functools.partial` of one) plans rounds from a pool."""
    while isinstance(factory, functools.partial):
        factory = factory.func
    return isinstance(factory, type) and issubclass(factory, PhraseCandidateGenerator)


def _phrase_pool(value: Any, generator: Any) -> PhrasePool | None:
    """`pacer_phrases`: planned rounds with a fresh pool for this call (`True`, and the default), with a given
    `PhrasePool` (warm start), or none (`False`: every round is the paper's head-stopped draft). By default a call
    that names its own `pacer_candidate_generator` gets a pool only if that generator plans rounds."""
    if value is None:
        value = generator is None or _plans_rounds(generator)
    if value is False:
        return None
    if generator is not None and not _plans_rounds(generator):
        raise TypeError(
            "`pacer_phrases` plans rounds from a phrase pool, which needs a `pacer_candidate_generator` that plans "
            "them (a `pacer_hf.phrase_drafting.PhraseCandidateGenerator` subclass); pass `pacer_phrases=False` for "
            "a generator of the paper's loop."
        )
    if value is True:
        return PhrasePool()
    if isinstance(value, PhrasePool):
        return value
    raise TypeError(f"`pacer_phrases` must be True, False or a `pacer_hf.PhrasePool`, got {type(value).__name__}.")


def _call_config(head: PacerHead, overrides: dict[str, Any]) -> PacerHeadConfig:
    """The head's config with this call's overrides: the only config the call's generator reads."""
    try:
        config = dataclasses.replace(head.config, **{PER_CALL_OVERRIDES[k]: v for k, v in overrides.items()})
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"Invalid per-call PACER setting: {exc}") from exc
    check_max_draft(head, config.max_draft, "`pacer_max_draft`" if "pacer_max_draft" in overrides else "`max_draft`")
    return config


def _warn_call(head: PacerHead, call: _GenerateArguments) -> None:
    sampling = bool(_setting(call, "do_sample"))
    # A rule (the entropy stop) was never trained on labels of either mode.
    if not isinstance(head, EntropyRule) and head.config.decoding != ("sampling" if sampling else "greedy"):
        warnings.warn(
            f"`pacer_head` was trained on {head.config.decoding} acceptance labels, but this call "
            f"{'samples' if sampling else 'decodes greedily'}. The output stays exact; only the head's stops are "
            f"tuned for the other mode. Train a head with `pacer-hf train --decoding "
            f"{'sampling' if sampling else 'greedy'}` for this mode.",
            UserWarning,
            stacklevel=5,
        )


def _prepare_call(model: Any, args: tuple, kwargs: dict) -> _PacerCall | None:
    """Step 1: the `pacer_*` kwargs out of `kwargs`, checked, as the call they describe (None without `pacer_head`)."""
    pacer = _pop_pacer_kwargs(kwargs)
    if pacer.head is None:
        if pacer.given():
            raise ValueError(f"{pacer.given()} were passed to `generate()` without `pacer_head`; pass a `pacer_head` too.")
        return None
    call = _bind_generate_arguments(model, args, kwargs)
    _check_call(pacer, call)
    phrases = _phrase_pool(pacer.phrases, pacer.generator)
    tokenizer = call.options.get("tokenizer")
    check_pair_compatible(pacer.head.config, call.draft, model, tokenizer, call.options.get("assistant_tokenizer"))
    config = _call_config(pacer.head, pacer.overrides)
    _warn_call(pacer.head, call)
    return _PacerCall(
        model=model, head=pacer.head, config=config, phrases=phrases,
        stats=pacer.stats if pacer.stats is not None else PacerStats(),
        generator_factory=pacer.generator if pacer.generator is not None else (
            PhraseCandidateGenerator if phrases is not None else PacerCandidateGenerator),
        stopping_criteria=call.stopping_criteria, tokenizer=tokenizer,
        draft_vocab=resolve_draft_vocab(pacer.draft_vocab, call.draft),
    )


def _generate(generate_fn: Callable, model: Any, args: tuple, kwargs: dict) -> Any:
    call = _prepare_call(model, args, kwargs)
    if call is None:
        return generate_fn(model, *args, **kwargs)
    if call.phrases is not None:
        call.phrases.acquire(call)  # a pool follows one call's sequence at a time
    token = _ACTIVE_CALL.set(call)
    start = time.perf_counter()
    try:
        output = generate_fn(model, *args, **kwargs)
    finally:
        _ACTIVE_CALL.reset(token)
        if call.phrases is not None:
            call.phrases.release(call)
    call.stats.total_time_s = time.perf_counter() - start
    if not call.used:
        warnings.warn(
            "`pacer_head` was passed to `generate()`, but transformers never asked pacer-hf for a candidate "
            "generator, so this output was decoded WITHOUT PACER. This transformers version is probably not one "
            "pacer-hf supports (see pyproject.toml); please report it.",
            RuntimeWarning,
            stacklevel=3,
        )
    return output


# ---- step 2: the generator --------------------------------------------------------------------------------------


def _build_generator(call: _PacerCall, model: Any, arguments: dict[str, Any]) -> PacerCandidateGenerator:
    """The call's candidate generator, from the arguments transformers passed to `_get_candidate_generator`."""
    # The call's stopping criteria as generate() builds them for its own loop (same config, same user criteria), for
    # the generator to check every candidate prefix against: transformers checks them only once per round.
    stopping_criteria = model._get_stopping_criteria(
        generation_config=arguments["generation_config"],
        stopping_criteria=call.stopping_criteria if call.stopping_criteria is not None else StoppingCriteriaList(),
        tokenizer=call.tokenizer,
    )
    # With phrases, the rounds are planned from the pair's costs, remembered across the calls of this process.
    draft = arguments["assistant_model"]
    sources = {} if call.phrases is None else {"phrases": call.phrases,
                                               "costs": costs_for(model, draft, call.draft_vocab)}
    generator = call.generator_factory(
        input_ids=arguments["input_ids"],
        assistant_model=draft,
        generation_config=arguments["generation_config"],
        model_kwargs=arguments["model_kwargs"],
        inputs_tensor=arguments.get("inputs_tensor"),
        logits_processor=arguments.get("logits_processor"),
        pacer_head=call.head,
        config=call.config,
        stats=call.stats,
        stopping_criteria=stopping_criteria,
        target_vocab_size=model.config.get_text_config().vocab_size,
        draft_vocab=call.draft_vocab,
        **sources,
    )
    if not isinstance(generator, PacerCandidateGenerator):
        raise TypeError(
            f"`pacer_candidate_generator` built a {type(generator).__name__}; it must build a `PacerCandidateGenerator`."
        )
    return generator


def _get_candidate_generator(original_fn: Callable, model: Any, args: tuple, kwargs: dict) -> Any:
    call = _ACTIVE_CALL.get()
    if call is None or call.model is not model:
        return original_fn(model, *args, **kwargs)
    call.used = True
    # Bind by name: the argument order of this private method changed between transformers releases.
    return _build_generator(call, model, _CANDIDATE_GENERATOR_SIGNATURE.bind(model, *args, **kwargs).arguments)


# ---- installing the route ---------------------------------------------------------------------------------------


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
    """Whether [`patch_transformers`] is in effect."""
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
