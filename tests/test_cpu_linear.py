"""Prepacked oneDNN linear layers: same outputs as the stock kernels to float rounding, PACER stays lossless on a
prepacked pair, and what cannot be prepacked is refused without touching the model."""

import gc
import weakref

import pytest
import torch
from torch import nn

from pacer_hf import PacerHeadConfig, PacerStats, prepack_linear_weights
from pacer_hf.pair import check_pair_compatible
from pacer_hf.cpu_linear import PrepackedLinear, prepack_supported
from pacer_hf.tiny_models import TINY_ARCHS, tiny_model, tiny_pair

from conftest import PROMPT, make_head

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_prepacked_model_matches_stock_logits(arch, dtype):
    if not prepack_supported(dtype):
        pytest.skip(f"this CPU cannot prepack {dtype} (see test_an_unsupported_bfloat16_cpu_is_refused_clearly)")
    stock = tiny_model(arch, seed=0).to(dtype)
    packed = tiny_model(arch, seed=0).to(dtype)
    linears = sum(type(m) is nn.Linear for m in packed.modules())
    assert prepack_linear_weights(packed) == linears > 0  # gpt2 keeps its Conv1D; its lm_head is a Linear
    assert not any(type(m) is nn.Linear for m in packed.modules())
    ids = torch.tensor([[0, 11, 42, 7, 23, 5, 9, 1]])
    with torch.no_grad():
        expected, got = stock(ids).logits.float(), packed(ids).logits.float()
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("head_kind", ["always", "random"])
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_pacer_on_a_prepacked_pair_equals_its_plain_greedy(arch, head_kind):
    target, draft = tiny_pair(arch, "noisy", seed=0)
    prepack_linear_weights(target, draft)
    plain = target.generate(PROMPT, max_new_tokens=21, do_sample=False)
    head = make_head(draft, head_kind, block_size=2, max_draft=8)
    stats = PacerStats()
    out = target.generate(PROMPT, assistant_model=draft, pacer_phrases=False, pacer_head=head, pacer_stats=stats, max_new_tokens=21,
                          do_sample=False)
    assert torch.equal(out, plain)
    assert stats.drafted_tokens > 0


def test_prepacked_draft_keeps_its_identity_for_heads():
    target, draft = tiny_pair("qwen2", "noisy", seed=0)
    config_before = PacerHeadConfig.for_draft(draft)
    prepack_linear_weights(draft)
    assert isinstance(draft.get_output_embeddings(), PrepackedLinear)
    assert PacerHeadConfig.for_draft(draft) == config_before  # sizes read off the lm_head's weight still hold
    check_pair_compatible(make_head(draft).config, draft, target)
    assert prepack_linear_weights(draft) == 0  # a second call finds nothing left to prepack


def test_tied_lm_head_keeps_the_embedding():
    model = tiny_model("gpt2", seed=0)  # gpt2 ties its lm_head to the token embedding
    embedding = model.get_input_embeddings().weight
    assert model.get_output_embeddings().weight is embedding
    before = embedding.detach().clone()
    prepack_linear_weights(model)
    assert model.get_input_embeddings().weight is embedding
    assert torch.equal(embedding, before)


def test_unsupported_layers_are_refused_and_nothing_changes():
    model = tiny_model("llama", seed=0).to(torch.float16)
    modules_before = [type(m) for m in model.modules()]
    with pytest.raises(ValueError, match="float32/bfloat16.*Nothing was changed"):
        prepack_linear_weights(model)
    assert [type(m) for m in model.modules()] == modules_before


def test_untied_dense_weights_are_released():
    model = tiny_model("qwen2", seed=0)
    dense = [weakref.ref(m.weight) for m in model.modules() if type(m) is nn.Linear]
    prepack_linear_weights(model)
    gc.collect()
    assert all(ref() is None for ref in dense)  # no second copy of the model stays behind


def test_one_unsupported_model_leaves_the_other_unchanged():
    good, bad = tiny_model("qwen2", seed=0), tiny_model("llama", seed=0).to(torch.float16)
    with pytest.raises(ValueError, match="Nothing was changed"):
        prepack_linear_weights(good, bad)
    assert not any(isinstance(m, PrepackedLinear) for m in good.modules())


@pytest.mark.skipif(prepack_supported(torch.bfloat16), reason="this CPU prepacks bfloat16")
def test_an_unsupported_bfloat16_cpu_is_refused_clearly():
    model = tiny_model("llama", seed=0).to(torch.bfloat16)
    with pytest.raises(ValueError, match="cannot prepack torch.bfloat16.*Nothing was changed"):
        prepack_linear_weights(model)
    assert not any(isinstance(m, PrepackedLinear) for m in model.modules())
