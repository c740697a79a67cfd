"""The `vllm.general_plugins` entry point: vLLM calls `register()` in every process it starts, before it builds a
model runner, so that `speculative_config={"method": "draft_model", ...}` gets [`PacerDraftModelProposer`].

Without `additional_config={"pacer_head": ...}` that proposer is vLLM's own, so installing pacer-vllm changes nothing
else.
"""


def register() -> None:
    # The runner looks the class up in its module's globals when it builds the drafter (V1 model runner; vLLM 0.32
    # on CPU needs `VLLM_USE_V2_MODEL_RUNNER=0`, see the README).
    from vllm.v1.worker import gpu_model_runner

    from .proposer import PacerDraftModelProposer

    gpu_model_runner.DraftModelProposer = PacerDraftModelProposer
