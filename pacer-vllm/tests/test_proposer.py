"""PACER heads inside vLLM's draft-model speculative decoding, on tiny random Llama and Qwen2 pairs saved to a
temporary folder (vLLM's CPU attention needs head size >= 32), token-id prompts, no tokenizer, no network.

Each engine takes ~15 s to start on 2 cores, so one engine per (architecture, head) serves every check of it.
"""

import gc

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from vllm import LLM, SamplingParams

from pacer_core import PacerHead, PacerHeadConfig, draft_distribution_features
from pacer_core.stop_rule import StopRule
from pacer_vllm import load_pacer_head, recent_draft_lengths

VOCAB, HIDDEN, K, BLOCK = 256, 128, 8, 2
PROMPTS = [[0, 5, 9, 33, 7], [0, 100, 3], [0, 17, 200, 4, 4, 9], [0, 64], [0, 250, 251, 9, 10, 11, 12]]
GREEDY = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
ENGINE = dict(skip_tokenizer_init=True, dtype="float32", max_model_len=256, enforce_eager=True,
              disable_log_stats=False, seed=0)
ARCHITECTURES = {  # model class, config class, key/value heads
    "llama": (LlamaForCausalLM, LlamaConfig, 4),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config, 2),
}


def _save_pair(arch: str, folder) -> tuple[str, str]:
    """A 2-layer target and its draft: the target with noise on every weight, so some drafts are accepted."""
    model_cls, config_cls, kv_heads = ARCHITECTURES[arch]
    config = config_cls(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=512,
                        bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    torch.manual_seed(0)
    target = model_cls(config).eval()
    target.save_pretrained(folder / "target")
    with torch.no_grad():
        for p in target.parameters():
            p.add_(torch.randn_like(p) * 0.5 * p.std())
    target.save_pretrained(folder / "draft")
    return str(folder / "target"), str(folder / "draft")


def _median_threshold(head: PacerHead, arch: str, draft_folder: str) -> float:
    """A threshold at the median pass score of the head's first blocks on random text: about half the blocks stop,
    so a batch holds requests that stop and requests that go on."""
    draft = ARCHITECTURES[arch][0].from_pretrained(draft_folder)
    torch.manual_seed(1)
    ids = torch.randint(2, VOCAB, (64, 12))
    with torch.no_grad():
        out = draft(ids, output_hidden_states=True)
        logits = out.logits[:, -BLOCK - 1:-1]  # [64, BLOCK, V]
        features = draft_distribution_features(logits, logits.argmax(-1))
        scores = StopRule(head, head.config).log_pass_scores(out.hidden_states[-1][:, -BLOCK - 1:-1], features)  # [64]
    return float(scores.median().exp())


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def pair(request, tmp_path_factory):
    """Target, draft, a random head, and the target's own greedy output under vLLM without speculation."""
    folder = tmp_path_factory.mktemp(request.param)
    target, draft = _save_pair(request.param, folder / request.param)
    torch.manual_seed(2)
    head = PacerHead(PacerHeadConfig(vocab_size=VOCAB, draft_hidden_size=HIDDEN, block_size=BLOCK, max_draft=K,
                                     score_mode="block"))
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(std=0.3)
    head.save_pretrained(folder / "head")
    llm = LLM(model=target, **ENGINE)
    plain = [list(o.outputs[0].token_ids) for o in llm.generate(_prompts(), GREEDY)]
    _close(llm)
    return {"arch": request.param, "target": target, "draft": draft, "head": str(folder / "head"), "plain": plain,
            "median_threshold": _median_threshold(head, request.param, draft)}


def _prompts() -> list[dict]:
    return [{"prompt_token_ids": p} for p in PROMPTS]


def _close(llm: LLM) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def _run(pair: dict, **additional) -> dict:
    llm = LLM(model=pair["target"], **ENGINE, additional_config={"pacer_head": pair["head"], **additional},
              speculative_config={"method": "draft_model", "model": pair["draft"], "num_speculative_tokens": K})
    outputs = [list(o.outputs[0].token_ids) for o in llm.generate(_prompts(), GREEDY)]
    metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    lengths = llm.collective_rpc(recent_draft_lengths)[0]
    first_rounds = []  # then each prompt alone: the length of its first round
    for prompt in _prompts():
        steps_before = len(llm.collective_rpc(recent_draft_lengths)[0])
        llm.generate([prompt], GREEDY)
        first_rounds.append(llm.collective_rpc(recent_draft_lengths)[0][steps_before][0])
    _close(llm)
    return {"outputs": outputs, "lengths": lengths, "first_rounds": first_rounds, "drafts": metrics["vllm:spec_decode_num_drafts"],
            "draft_tokens": metrics["vllm:spec_decode_num_draft_tokens"],
            "accepted": metrics["vllm:spec_decode_num_accepted_tokens"]}


@pytest.mark.parametrize("kind", ["always_pass", "never_pass", "random_stops"])
def test_greedy_output_equals_vllm_without_speculation(pair, kind):
    threshold = {"always_pass": 0.0, "never_pass": 1.0, "random_stops": pair["median_threshold"]}[kind]
    run = _run(pair, pacer_threshold=threshold)
    assert run["outputs"] == pair["plain"]
    assert run["drafts"] > 0 and run["accepted"] > 0  # the draft really drafted, and some drafts were accepted
    mean_draft = run["draft_tokens"] / run["drafts"]  # vLLM's own count
    flat = [n for step in run["lengths"] for n in step]
    # what the head let through is what vLLM verified, less each request's last draft (proposed after its last token)
    assert 0 <= len(flat) - run["drafts"] <= len(PROMPTS) and 0 <= sum(flat) - run["draft_tokens"] <= len(PROMPTS) * K
    if kind == "always_pass":  # threshold 0: never stops, every draft is num_speculative_tokens long
        assert mean_draft == K
    elif kind == "never_pass":  # threshold 1: every round stops after its first block
        assert mean_draft == BLOCK
    else:
        assert BLOCK < mean_draft < K
        assert all(n % BLOCK == 0 for n in flat)  # stops only at block boundaries
        # at least one step where requests of one batch stopped at different lengths
        assert any(len(set(step)) > 1 for step in run["lengths"] if len(step) > 1)
        # each prompt's first round stops where pacer-hf's draft loop would
        assert run["first_rounds"] == _first_round_lengths(pair, threshold)


def _first_round_lengths(pair: dict, threshold: float) -> list[int]:
    """Where pacer-hf's loop (`PacerCandidateGenerator._draft_blocks`) stops each prompt's first round: the draft
    continues from the prompt and the target's first token, and the `StopRule` is asked after every full block with
    the transformers draft's post-norm hidden states and features."""
    head = PacerHead.from_pretrained(pair["head"]).eval()
    config = PacerHeadConfig.from_dict({**head.config.to_dict(), "threshold": threshold, "max_draft": K})
    draft = ARCHITECTURES[pair["arch"]][0].from_pretrained(pair["draft"]).eval()
    lengths = []
    for prompt, plain in zip(PROMPTS, pair["plain"]):
        ids, hidden, features, length = torch.tensor([prompt + plain[:1]]), [], [], K
        with torch.no_grad():
            for drafted in range(1, K + 1):
                out = draft(ids, output_hidden_states=True)
                logits, token = out.logits[:, -1], out.logits[:, -1].argmax(-1)  # [1, V], [1]
                hidden.append(out.hidden_states[-1][:, -1])
                features.append(draft_distribution_features(logits, token))
                ids = torch.cat([ids, token[:, None]], dim=1)
                if drafted % BLOCK == 0 and StopRule(head, config).says_stop(torch.stack(hidden, 1), torch.stack(features, 1)):
                    length = drafted
                    break
        lengths.append(length)
    return lengths


def test_the_entropy_rule_runs_without_weights(pair):
    llm = LLM(model=pair["target"], **ENGINE, additional_config={"pacer_head": "entropy"},
              speculative_config={"method": "draft_model", "model": pair["draft"], "num_speculative_tokens": K})
    outputs = [list(o.outputs[0].token_ids) for o in llm.generate(_prompts(), GREEDY)]
    _close(llm)
    assert outputs == pair["plain"]


def test_a_head_for_another_draft_is_refused_with_pacer_hfs_message(tmp_path):
    PacerHead(PacerHeadConfig(vocab_size=VOCAB, draft_hidden_size=64, draft_name_or_path="org/other-draft")
              ).save_pretrained(tmp_path / "head")
    with pytest.raises(ValueError, match=r"trained for a draft with hidden size 64 \(org/other-draft\), got a draft "
                                         r"with hidden size 128 \(the draft model my/draft\)"):
        load_pacer_head({"pacer_head": str(tmp_path / "head")}, VOCAB, HIDDEN, "my/draft", K)


def test_settings_are_checked(tmp_path):
    PacerHead(PacerHeadConfig(vocab_size=VOCAB, draft_hidden_size=HIDDEN)).save_pretrained(tmp_path / "head")
    good = {"pacer_head": str(tmp_path / "head")}
    head, config = load_pacer_head({**good, "pacer_threshold": 0.25, "pacer_block_size": 2}, VOCAB, HIDDEN, "d", K)
    assert (config.threshold, config.block_size, config.max_draft) == (0.25, 2, K)
    assert head.config.threshold != 0.25  # overrides apply to this engine, not to the loaded head
    with pytest.raises(ValueError, match="Unknown pacer-vllm settings.*pacer_treshold"):
        load_pacer_head({**good, "pacer_treshold": 0.2}, VOCAB, HIDDEN, "d", K)
    with pytest.raises(ValueError, match="`threshold` must be in"):
        load_pacer_head({**good, "pacer_threshold": 2.0}, VOCAB, HIDDEN, "d", K)
    with pytest.raises(ValueError, match="`max_draft` must be >= `block_size`"):
        load_pacer_head(good, VOCAB, HIDDEN, "d", 2)  # num_speculative_tokens below the head's block size
    with pytest.raises(TypeError, match="must be a Hub id, a folder or 'entropy'"):
        load_pacer_head({"pacer_head": 3}, VOCAB, HIDDEN, "d", K)
    entropy, _ = load_pacer_head({"pacer_head": "entropy"}, VOCAB, HIDDEN, "d", K)
    assert entropy.config.architecture == "entropy" and entropy.num_parameters() == 0


def test_sampling_with_probabilistic_drafts_keeps_each_requests_probability_rows(pair):
    """Cut drafts of different lengths in one batch, each with its own draft-probability rows (the runner reads the
    first len(draft) rows of a request): vLLM's rejection sampler must accept the shapes and every request must
    finish with all its tokens."""
    llm = LLM(model=pair["target"], **ENGINE,
              additional_config={"pacer_head": pair["head"], "pacer_threshold": pair["median_threshold"]},
              speculative_config={"method": "draft_model", "model": pair["draft"], "num_speculative_tokens": K,
                                  "draft_sample_method": "probabilistic"})
    params = SamplingParams(max_tokens=40, temperature=1.0, ignore_eos=True, seed=0)
    outputs = [list(o.outputs[0].token_ids) for o in llm.generate(_prompts(), params)]
    lengths = llm.collective_rpc(recent_draft_lengths)[0]
    _close(llm)
    assert [len(o) for o in outputs] == [40] * len(PROMPTS)
    assert outputs != pair["plain"]  # really sampled
    assert any(len(set(step)) > 1 for step in lengths if len(step) > 1)


def _save_tokenizer(folder, size: int) -> None:
    """A word-level tokenizer of `size` tokens ("<unk>", "t1", ...), the same for target and draft."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, **{f"t{i}": i for i in range(1, size)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>").save_pretrained(folder)


def test_a_padded_pair_runs_with_vllms_heterogeneous_vocab_and_keeps_greedy_output(tmp_path, capfd):
    """One tokenizer, other embedding rows (as Qwen2.5-0.5B for Qwen2.5-7B): vLLM needs `use_heterogeneous_vocab`
    for it; the head then reads the draft's distribution over the shared tokens. Two tokenizers are refused."""
    model_cls, config_cls, kv_heads = ARCHITECTURES["qwen2"]
    target_folder, draft_folder = _save_pair("qwen2", tmp_path)
    draft = model_cls.from_pretrained(draft_folder)
    draft.resize_token_embeddings(VOCAB + 16, mean_resizing=False)  # 16 padding rows the target lacks
    draft.save_pretrained(draft_folder)
    for folder in (target_folder, draft_folder):
        _save_tokenizer(folder, VOCAB)
    engine = {**ENGINE, "skip_tokenizer_init": False}
    llm = LLM(model=target_folder, **engine)
    plain = [list(o.outputs[0].token_ids) for o in llm.generate(_prompts(), GREEDY)]
    _close(llm)
    speculative = {"method": "draft_model", "model": draft_folder, "num_speculative_tokens": K,
                   "use_heterogeneous_vocab": True}
    llm = LLM(model=target_folder, **engine, additional_config={"pacer_head": "entropy"},
              speculative_config=speculative)
    outputs = [list(o.outputs[0].token_ids) for o in llm.generate(_prompts(), GREEDY)]
    metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    _close(llm)
    assert outputs == plain and metrics["vllm:spec_decode_num_drafts"] > 0
    _save_tokenizer(draft_folder, VOCAB - 8)  # another tokenizer
    # The refusal is raised where vLLM builds the proposer, in its worker process: vLLM's engine then fails to start
    # ("See root cause above"), and the worker's log holds our message with its fix.
    capfd.readouterr()
    with pytest.raises(Exception, match="Engine core initialization failed"):
        LLM(model=target_folder, **engine, additional_config={"pacer_head": "entropy"},
            speculative_config=speculative)
    assert "share one tokenizer" in "".join(capfd.readouterr())
