"""Sampling through vLLM with a PACER head keeps the target's distribution: a chi-square test of the first two
speculated tokens against the exact distribution enumerated from the target (transformers, float32), for a pair of
one vocabulary with probabilistic drafts and for a padded pair (the draft with more embedding rows, one tokenizer),
which vLLM runs with greedy drafts only (`use_heterogeneous_vocab` does not support probabilistic ones).

The first generated token comes from the target's prefill; the head's stops act on the tokens after it, so the test
reads tokens 2 and 3. The head is the entropy rule at the draft's median entropy, so rounds stop at mixed lengths.
"""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers import Qwen2Config, Qwen2ForCausalLM
from vllm import LLM, SamplingParams

from pacer_core import PacerHead, PacerHeadConfig
from pacer_core.head import ENTROPY_RULE_SETTINGS
from test_proposer import ENGINE, _close, _save_tokenizer

VOCAB, PADDED_ROWS, HIDDEN, K = 32, 48, 128, 4
PROMPT = [0, 5, 9, 3]
NUM_SAMPLES = 2000
TEMPERATURE = 1.0


def _save(folder, rows: int | None = None, noise: float = 0.0) -> str:
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, bos_token_id=0,
                         eos_token_id=1, tie_word_embeddings=False, initializer_range=0.1)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * noise * p.std())
    if rows is not None:
        model.resize_token_embeddings(rows, mean_resizing=False)
    model.save_pretrained(folder)
    _save_tokenizer(folder, VOCAB)
    return str(folder)


def _exact_joint(target_folder: str) -> np.ndarray:
    """p(token 2, token 3) after PROMPT, summed over token 1: `[V * V]`."""
    model = Qwen2ForCausalLM.from_pretrained(target_folder).eval()
    with torch.no_grad():
        def next_probs(ids: torch.Tensor) -> torch.Tensor:  # [B, L] -> [B, V]
            return (model(ids).logits[:, -1].double() / TEMPERATURE).softmax(-1)

        prompt = torch.tensor([PROMPT])
        p1 = next_probs(prompt)[0]  # [V]
        ones = torch.cat([prompt.repeat(VOCAB, 1), torch.arange(VOCAB)[:, None]], 1)  # [V, L + 1]
        p2 = next_probs(ones)  # [V(t1), V(t2)]
        twos = torch.cat([ones.repeat_interleave(VOCAB, 0), torch.arange(VOCAB).repeat(VOCAB)[:, None]], 1)
        p3 = next_probs(twos).view(VOCAB, VOCAB, VOCAB)  # [t1, t2, t3]
        joint = (p1[:, None, None] * p2[:, :, None] * p3).sum(0)  # [t2, t3]
    return joint.flatten().numpy()


def _median_entropy(draft_folder: str) -> float:
    """The draft's median next-token entropy on random contexts, in nats: the rule stops about half the rounds."""
    draft = Qwen2ForCausalLM.from_pretrained(draft_folder).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        logits = draft(torch.randint(2, VOCAB, (64, 6))).logits[:, -1, :VOCAB].float()  # [64, V]
    entropy = -(logits.log_softmax(-1).exp() * logits.log_softmax(-1)).sum(-1)
    return float(entropy.median())


def _pvalue(counts: np.ndarray, joint: np.ndarray) -> float:
    expected = joint / joint.sum() * counts.sum()
    dense = expected >= 5  # chi-square needs expected counts >= 5: pool the rare cells into one
    return chisquare(np.append(counts[dense], counts[~dense].sum()),
                     np.append(expected[dense], expected[~dense].sum())).pvalue


@pytest.mark.parametrize("padded", [False, True], ids=["one-vocabulary", "padded-pair"])
def test_sampling_keeps_the_targets_distribution(tmp_path, padded):
    target = _save(tmp_path / "target")
    draft = _save(tmp_path / "draft", rows=PADDED_ROWS if padded else None, noise=0.3)
    speculative = {"method": "draft_model", "model": draft, "num_speculative_tokens": K}
    speculative.update({"use_heterogeneous_vocab": True} if padded else {"draft_sample_method": "probabilistic"})
    rule = PacerHead(PacerHeadConfig(vocab_size=PADDED_ROWS if padded else VOCAB, draft_hidden_size=HIDDEN,
                                     **{**ENTROPY_RULE_SETTINGS, "entropy_threshold": _median_entropy(draft)}))
    rule.save_pretrained(tmp_path / "rule")
    llm = LLM(model=target, **{**ENGINE, "skip_tokenizer_init": False}, speculative_config=speculative,
              additional_config={"pacer_head": str(tmp_path / "rule")})
    params = [SamplingParams(max_tokens=3, temperature=TEMPERATURE, ignore_eos=True, seed=i) for i in range(NUM_SAMPLES)]
    outputs = llm.generate([{"prompt_token_ids": PROMPT}] * NUM_SAMPLES, params, use_tqdm=False)
    metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    _close(llm)
    counts = np.zeros(VOCAB * VOCAB)
    for output in outputs:
        _, second, third = output.outputs[0].token_ids
        counts[second * VOCAB + third] += 1
    assert metrics["vllm:spec_decode_num_drafts"] > 0 and metrics["vllm:spec_decode_num_accepted_tokens"] > 0
    assert _pvalue(counts, _exact_joint(target)) > 1e-3
