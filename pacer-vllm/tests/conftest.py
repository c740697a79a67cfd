"""vLLM on this CPU, offline: the V1 model runner (the one the plugin patches), a small KV cache, and callables over
`collective_rpc` (the tests read each step's draft lengths from the worker). Set before vLLM is imported."""

import os

os.environ.setdefault("VLLM_CPU_CI_ENV", "1")
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
