"""The generate(..., pacer_head=) route: bad input, patch/unpatch, the per-instance route, and the loud warning."""

import warnings

import pytest
import torch
from transformers.generation.utils import GenerationMixin

import pacer_hf
import pacer_hf.pair
from pacer_hf import generation
from pacer_hf.tiny_models import tiny_model, tiny_pair

from conftest import PROMPT, make_head


@pytest.fixture(scope="module")
def pair():
    return tiny_pair("llama", "noisy", seed=0)


def _generate(target, **kwargs):
    return target.generate(PROMPT, max_new_tokens=8, do_sample=False, **kwargs)


def test_without_pacer_head_generate_is_unchanged(pair):
    target, draft = pair
    expected = _generate(target)
    pacer_hf.unpatch_transformers()
    try:
        assert torch.equal(_generate(target, assistant_model=draft), expected)
        stock = _generate(target)
    finally:
        pacer_hf.patch_transformers()
    assert torch.equal(stock, expected)
    assert torch.equal(_generate(target, assistant_model=draft), expected)


def test_unknown_kwargs_are_still_rejected(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="not used by the model"):
        _generate(target, assistant_model=draft, pacer_head=make_head(draft), pacer_typo=1)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"assistant_model": None}, ValueError, "without `assistant_model`"),
        ({"prompt_lookup_num_tokens": 3}, ValueError, "prompt_lookup_num_tokens"),
        ({"assistant_early_exit": 1}, ValueError, "assistant_early_exit"),
        ({"num_beams": 2}, ValueError, "beam search"),
        ({"pacer_threshold": 1.5}, ValueError, "threshold"),
        ({"pacer_block_size": 0}, ValueError, "block_size"),
        ({"pacer_max_draft": 1, "pacer_block_size": 2}, ValueError, "max_draft"),
    ],
)
def test_bad_arguments_raise_clear_errors(pair, kwargs, error, message):
    target, draft = pair
    kwargs = {"assistant_model": draft, **kwargs}
    with pytest.raises(error, match=message):
        _generate(target, pacer_head=make_head(draft), **kwargs)
    assert generation._ACTIVE_CALL.get() is None  # nothing left behind


def test_pacer_settings_without_head_raise(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="without `pacer_head`"):
        _generate(target, assistant_model=draft, pacer_threshold=0.5)


def test_pacer_head_must_be_a_head(pair):
    target, draft = pair
    with pytest.raises(TypeError, match="PacerHead"):
        _generate(target, assistant_model=draft, pacer_head=torch.nn.Linear(2, 2))


def test_beam_search_from_generation_config_is_refused(pair):
    target, draft = pair
    from transformers import GenerationConfig

    with pytest.raises(ValueError, match="beam search"):
        target.generate(
            PROMPT, generation_config=GenerationConfig(num_beams=3, max_new_tokens=4), assistant_model=draft,
            pacer_phrases=False, pacer_head=make_head(draft),
        )


def test_batch_size_above_one_is_refused(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="only supported for batch_size = 1"):
        target.generate(PROMPT.repeat(2, 1), assistant_model=draft, pacer_phrases=False, pacer_head=make_head(draft), max_new_tokens=4)
    assert generation._ACTIVE_CALL.get() is None


def test_head_for_another_draft_is_refused(pair):
    target, draft = pair
    wider_draft = tiny_model("llama", seed=5, hidden_size=64)
    with pytest.raises(ValueError, match="hidden size 32.*hidden size 64"):
        _generate(target, assistant_model=wider_draft, pacer_head=make_head(draft))
    other_vocab = tiny_model("llama", seed=5, vocab_size=128)
    with pytest.raises(ValueError, match="vocabulary size"):
        _generate(other_vocab, assistant_model=other_vocab, pacer_head=make_head(draft))
    head_other_vocab = make_head(tiny_model("llama", seed=5, vocab_size=128))
    with pytest.raises(ValueError, match="trained for a draft with vocabulary size 128"):
        _generate(target, assistant_model=draft, pacer_head=head_other_vocab)


def test_instance_route_works_without_the_global_patch(pair):
    target, draft = pair
    expected = _generate(target)
    pacer_hf.unpatch_transformers()
    try:
        assert not pacer_hf.generation.is_transformers_patched()
        head = make_head(draft, "random")
        with pytest.raises(ValueError, match="pacer_head"):  # stock transformers rejects the kwarg
            _generate(target, assistant_model=draft, pacer_head=head)
        pacer_hf.enable_pacer(target)
        stats = pacer_hf.PacerStats()
        assert torch.equal(_generate(target, assistant_model=draft, pacer_head=head, pacer_stats=stats), expected)
        assert stats.rounds > 0
        pacer_hf.disable_pacer(target)
        assert "generate" not in target.__dict__
        with pytest.raises(ValueError, match="pacer_head"):
            _generate(target, assistant_model=draft, pacer_head=head)
    finally:
        pacer_hf.patch_transformers()
    assert GenerationMixin.generate is generation._patched_generate


def test_loud_warning_when_transformers_never_calls_the_hook(pair, monkeypatch):
    target, draft = pair
    # Simulate a transformers release that no longer builds candidate generators through our hook.
    monkeypatch.setattr(GenerationMixin, "_get_candidate_generator", generation._ORIGINAL_GET_CANDIDATE_GENERATOR)
    with pytest.warns(RuntimeWarning, match="WITHOUT PACER"):
        _generate(target, assistant_model=draft, pacer_head=make_head(draft))


def test_no_warning_on_the_normal_route(pair):
    target, draft = pair
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        _generate(target, assistant_model=draft, pacer_head=make_head(draft))


def test_stats_are_per_call_and_consistent(pair):
    target, draft = pair
    head = make_head(draft, "random", block_size=2, max_draft=8)
    first = pacer_hf.PacerStats()
    out = target.generate(PROMPT, assistant_model=draft, pacer_phrases=False, pacer_head=head, pacer_stats=first, max_new_tokens=30,
                          do_sample=False)
    assert first.new_tokens == out.shape[1] - PROMPT.shape[1] == 30
    assert first.head_calls >= first.head_stops > 0
    assert sum(first.draft_length_histogram.values()) == first.rounds == len(first.plans)
    assert first.draft_time_s > 0 and first.head_time_s > 0 and first.target_time_s > 0
    assert first.total_time_s >= first.draft_time_s + first.head_time_s
    assert [plan.accepted for plan in first.plans] == first.accepted_lengths
    assert "last_stats" not in vars(head)  # statistics live with the call, not on the head


def test_caller_stats_stay_apart_under_concurrent_calls(pair):
    """Two threads share one head; each call fills the `PacerStats` it passed, never the other's."""
    from concurrent.futures import ThreadPoolExecutor

    target, draft = pair
    head = make_head(draft, "random", block_size=2, max_draft=8)
    lengths = (7, 19, 11, 23)
    stats = [pacer_hf.PacerStats() for _ in lengths]

    def run(i: int) -> torch.Tensor:
        return target.generate(PROMPT, assistant_model=draft, pacer_phrases=False, pacer_head=head, pacer_stats=stats[i],
                               max_new_tokens=lengths[i], do_sample=False)

    with ThreadPoolExecutor(max_workers=2) as pool:
        outputs = list(pool.map(run, range(len(lengths))))
    for out, n, s in zip(outputs, lengths, stats):
        assert out.shape[1] - PROMPT.shape[1] == n == s.new_tokens


def test_pacer_stats_and_generator_arguments_are_checked(pair):
    target, draft = pair
    with pytest.raises(TypeError, match="`pacer_stats` must be a `pacer_hf.PacerStats`"):
        _generate(target, assistant_model=draft, pacer_head=make_head(draft), pacer_stats={})
    used = pacer_hf.PacerStats()
    _generate(target, assistant_model=draft, pacer_head=make_head(draft), pacer_stats=used)
    with pytest.raises(ValueError, match="already holds another call's statistics"):
        _generate(target, assistant_model=draft, pacer_head=make_head(draft), pacer_stats=used)
    with pytest.raises(TypeError, match="`pacer_candidate_generator` must be"):
        _generate(target, assistant_model=draft, pacer_head=make_head(draft), pacer_candidate_generator="oracle")
    with pytest.raises(TypeError, match="built a AssistedCandidateGenerator"):
        from transformers.generation.candidate_generator import AssistedCandidateGenerator

        _generate(target, assistant_model=draft, pacer_head=make_head(draft),
                  pacer_candidate_generator=lambda **kw: AssistedCandidateGenerator(
                      kw["input_ids"], kw["assistant_model"], kw["generation_config"], kw["model_kwargs"]))
    with pytest.raises(ValueError, match=r"\['pacer_candidate_generator', 'pacer_stats'\].*without `pacer_head`"):
        _generate(target, assistant_model=draft, pacer_stats=pacer_hf.PacerStats(),
                  pacer_candidate_generator=pacer_hf.PacerCandidateGenerator)
    assert generation._ACTIVE_CALL.get() is None


def test_an_empty_prompt_is_refused_with_the_fix(pair):
    target, draft = pair
    with pytest.raises(ValueError, match=r"prompt is empty.*BOS token"):
        target.generate(torch.zeros(1, 0, dtype=torch.long), assistant_model=draft, pacer_phrases=False, pacer_head=make_head(draft),
                        max_new_tokens=4)


def test_import_opt_out_leaves_transformers_untouched():
    import subprocess
    import sys

    code = (
        "import pacer_hf, pacer_hf.generation; from transformers.generation.utils import GenerationMixin; "
        "print(pacer_hf.generation.is_transformers_patched())"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={"PACER_HF_NO_PATCH": "1", "PATH": ""},
        check=True,
    )
    assert result.stdout.strip() == "False"


def test_a_head_on_the_meta_device_is_refused(pair):
    target, draft = pair
    with torch.device("meta"):
        head = make_head(draft)
    with pytest.raises(ValueError, match="`meta` device.*from_pretrained"):
        _generate(target, assistant_model=draft, pacer_head=head)


def test_inputs_embeds_without_input_ids_is_refused_with_the_fix(pair):
    target, draft = pair
    embeds = target.get_input_embeddings()(PROMPT)
    with pytest.raises(ValueError, match="`inputs_embeds` without `input_ids`.*draft model reads token ids"):
        target.generate(inputs_embeds=embeds, assistant_model=draft, pacer_phrases=False, pacer_head=make_head(draft), max_new_tokens=4)


def test_max_draft_beyond_the_heads_position_table_is_refused(pair):
    target, draft = pair
    head = make_head(draft, "random", block_size=2, max_draft=8)
    with pytest.raises(ValueError, match="`pacer_max_draft` is 32.*at most 8 draft tokens"):
        _generate(target, assistant_model=draft, pacer_head=head, pacer_max_draft=32)
    rule = make_head(draft, "entropy", block_size=1, max_draft=8)  # a rule has no table: any length
    _generate(target, assistant_model=draft, pacer_head=rule, pacer_max_draft=32)


def test_a_head_for_another_draft_of_the_same_sizes_warns_and_can_be_silenced(pair):
    import copy

    target, draft = pair
    other = copy.deepcopy(draft)  # another fine-tune of the same base: its norms moved
    other.config._name_or_path = "tiny-llama-other-fine-tune"
    with torch.no_grad():
        other.model.norm.weight.mul_(1.05)
    head = make_head(draft, draft_fingerprint=pacer_hf.pair.draft_fingerprint(draft))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _generate(target, assistant_model=draft, pacer_head=head)  # its own draft: no warning
    with pytest.warns(pacer_hf.DraftMismatchWarning, match=f"{draft.config._name_or_path}.*{other.config._name_or_path}"):
        out = _generate(target, assistant_model=other, pacer_head=head)
    assert torch.equal(out, _generate(target))  # still exact
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", pacer_hf.DraftMismatchWarning)
        _generate(target, assistant_model=other, pacer_head=head)


def test_the_fingerprint_ignores_dtype_and_prepacking_but_not_another_fine_tune(pair):
    import copy

    from pacer_hf.pair import draft_fingerprint

    target, draft = pair
    base = draft_fingerprint(draft)
    assert draft_fingerprint(copy.deepcopy(draft).to(torch.bfloat16)) == base
    packed = copy.deepcopy(draft)
    pacer_hf.prepack_linear_weights(packed)
    assert draft_fingerprint(packed) == base
    tuned = copy.deepcopy(draft)
    with torch.no_grad():
        next(p for p in tuned.parameters() if p.dim() == 1).add_(0.01)
    assert draft_fingerprint(tuned) != base
    assert draft_fingerprint(tiny_model("gpt2", seed=0)) != base  # same widths, another architecture


def test_head_trained_for_the_other_decoding_mode_warns(pair):
    target, draft = pair
    greedy_head = make_head(draft)
    with pytest.warns(UserWarning, match="trained on greedy acceptance labels, but this call samples"):
        target.generate(PROMPT, max_new_tokens=4, do_sample=True, assistant_model=draft, pacer_phrases=False, pacer_head=greedy_head)
    sampling_head = make_head(draft, decoding="sampling")
    with pytest.warns(UserWarning, match="trained on sampling acceptance labels, but this call decodes greedily"):
        _generate(target, assistant_model=draft, pacer_head=sampling_head)


def test_a_stopping_criterion_that_reads_scores_is_refused_under_output_scores(pair):
    """Candidates are checked against the stopping criteria before the target scores them, so a criterion that reads
    `scores` cannot be given the target's: refused with the fix, never answered with something else."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class StopOnConfidentScore(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return scores[-1].softmax(-1).max(-1).values > 0.99

    class StopOnToken(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == 7

    target, draft = pair
    head = make_head(draft, "always")
    # the paper's loop drafts every round; planned rounds may choose plain target steps (timed), which check nothing
    with pytest.raises(ValueError, match="reads `scores`.*Use a criterion that reads only `input_ids`"):
        _generate(target, assistant_model=draft, pacer_head=head, pacer_phrases=False, return_dict_in_generate=True,
                  output_scores=True, stopping_criteria=StoppingCriteriaList([StopOnConfidentScore()]))
    out = _generate(target, assistant_model=draft, pacer_head=head, return_dict_in_generate=True, output_scores=True,
                    stopping_criteria=StoppingCriteriaList([StopOnToken()]))  # one that reads only ids: fine
    plain = _generate(target, return_dict_in_generate=True, output_scores=True,
                      stopping_criteria=StoppingCriteriaList([StopOnToken()]))
    assert torch.equal(out.sequences, plain.sequences)
