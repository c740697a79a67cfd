#!/usr/bin/env bash
# Collects data for, trains and compares the PACER heads of Qwen2.5-Coder 0.5B -> 1.5B on this machine, then stages
# the chosen head as a ready-to-push Hub folder in hub_cards/. Run it alone (benchmarks and cost measurements share
# the CPU). Every step resumes or refuses to overwrite: delete $RUNS to retrain.
#
#   bash eval/qwen_head.sh                      # 112 training prompts (~45 min of collection on 2 cores)
#   MAX_PROMPTS=400 bash eval/qwen_head.sh      # more data: the collection resumes and grows with ShareGPT prompts
#
# Training prompts: HumanEval 100-163 and ShareGPT 1000+ (the harness evaluates on HumanEval 0-19, ShareGPT 0-19).
set -euo pipefail
export OMP_WAIT_POLICY=PASSIVE
DATA=${DATA:-runs/qwen-bf16-data}
RUNS=${RUNS:-runs/qwen-heads}
MAX_PROMPTS=${MAX_PROMPTS:-112}
MAIN=${MAIN:-attention-block1}   # the head that is staged, chosen on the validation prompts (eval/results/ablations-*)
DRAFT=qwen2.5-coder-0.5b-instruct
TARGET=qwen2.5-coder-1.5b-instruct
HUB_DIR=hub_cards/pacer-qwen2.5-coder-0.5b-to-1.5b

pacer-hf collect --draft "$DRAFT" --target "$TARGET" --prompts humaneval:100:64 sharegpt:1000:2000 \
    --max-prompts "$MAX_PROMPTS" --output-dir "$DATA" --max-new-tokens 128 --shard-size 16

# The first head of each decoding mode measures the pair's costs inside generate() on this machine (a sampled draft
# token costs more than a greedy one); the other greedy heads reuse them, so that they differ only in the head.
[ -f "$RUNS/attention-block1/config.json" ] ||
    pacer-hf train "$DATA" "$RUNS/attention-block1" --draft "$DRAFT" --target "$TARGET" --block-size 1
[ -f "$RUNS/attention-block1-sampling/config.json" ] ||
    pacer-hf train "$DATA" "$RUNS/attention-block1-sampling" --draft "$DRAFT" --target "$TARGET" --block-size 1 \
        --decoding sampling
cost() {  # the cost (draft, head or verify) that the run in $1 was trained with
    python -c "import json, sys; print(json.load(open(sys.argv[1]))['threshold']['cost'][sys.argv[2]])" \
        "$RUNS/$1/training_metrics.json" "$2"
}
COST=(--cost-ratio "$(cost attention-block1 draft)" --head-cost-ratio "$(cost attention-block1 head)"
      --verify-cost-ratio "$(cost attention-block1 verify)")
while read -r name options; do
    [ -f "$RUNS/$name/config.json" ] || pacer-hf train "$DATA" "$RUNS/$name" "${COST[@]}" $options
done <<'RUNS'
attention-block2 --block-size 2
attention-block4 --block-size 4
mlp-block1 --architecture mlp --block-size 1
RUNS
python -m eval.research.ablations --data "$DATA" "${COST[@]}" --out eval/results/ablations-qwen-bf16 \
    --sampling-cost-ratio "$(cost attention-block1-sampling draft)" \
    --sampling-head-cost-ratio "$(cost attention-block1-sampling head)" \
    --runs "$RUNS/attention-block1" "$RUNS/attention-block2" "$RUNS/attention-block4" "$RUNS/mlp-block1" \
    "$RUNS/attention-block1-sampling"

# The greedy head (the demo's) and the sampling-trained head, each as a ready-to-push folder.
DATASETS=(--dataset openai/openai_humaneval --dataset anon8231489123/ShareGPT_Vicuna_unfiltered)
pacer-hf push "$RUNS/$MAIN" pacer-hf/pacer-qwen2.5-coder-0.5b-to-1.5b --stage "$HUB_DIR" "${DATASETS[@]}"
pacer-hf push "$RUNS/attention-block1-sampling" pacer-hf/pacer-qwen2.5-coder-0.5b-to-1.5b-sampling \
    --stage "$HUB_DIR-sampling" "${DATASETS[@]}"
# After `pacer-hf bench` (README, "Benchmarks"; `--sample` for the sampling head), the measured speed-ups go into each
# card's model-index and text, e.g.
#   pacer-hf push "$RUNS/$MAIN" pacer-hf/pacer-qwen2.5-coder-0.5b-to-1.5b --stage "$HUB_DIR" "${DATASETS[@]}" \
#       --speedup humaneval=<x> --speedup sharegpt=<y>
