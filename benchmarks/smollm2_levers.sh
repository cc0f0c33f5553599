#!/usr/bin/env bash
# Sample-efficiency levers on SmolLM2-135M-Instruct, from the disk cache of
# dflash/conf/experiment/smollm2.yaml (filled once; every lever reads it):
#   benchmarks/smollm2_levers.sh [NAME ...]          # default: every lever below, in order
#   MINUTES=9 benchmarks/smollm2_levers.sh NAME      # equal CPU minutes (trainer.max_minutes)
#   STEPS=250 benchmarks/smollm2_levers.sh NAME      # equal steps (the first two levers ran so)
#   EVAL=0 ...                                    # validation tau_sim only, no HumanEval run
# Each lever trains `python -m dflash.train experiment=smollm2` with its overrides
# (validation tau_sim every 50 steps) into artifacts/runs/lever-NAME, then evaluates the
# exported drafter on 10 HumanEval prompts (measured tau, speedup) into .../eval.
# Resumable: a finished stage is skipped, a killed training resumes from its last checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ -n "${MINUTES:-}" ]; then
  BUDGET="trainer.max_steps=-1 trainer.max_epochs=null trainer.max_minutes=$MINUTES"
else
  BUDGET="trainer.max_steps=${STEPS:-250}"
fi

declare -A LEVERS=(
  [random_lr1e-3]="training.learning_rate=1e-3"
  [init_lr1e-3]="drafter.init_from_target=true training.learning_rate=1e-3"
  [init_lr3e-4]="drafter.init_from_target=true training.learning_rate=3e-4"
  [init_anchors256]="drafter.init_from_target=true training.learning_rate=1e-3 training.num_anchors=256"
  [init_b16]="drafter.init_from_target=true training.learning_rate=1e-3 drafter.block_size=16"
  [init_b4]="drafter.init_from_target=true training.learning_rate=1e-3 drafter.block_size=4"
  [init_depth1]="drafter.init_from_target=true training.learning_rate=1e-3 drafter.num_layers=1"
  [init_depth2]="drafter.init_from_target=true training.learning_rate=1e-3 drafter.num_layers=2"
  [init_kl]="drafter.init_from_target=true training.learning_rate=1e-3 training.loss=kl"
  [init_vocab8k]="drafter.init_from_target=true training.learning_rate=1e-3 training.draft_vocab_size=8192"
  [init_bf16]="drafter.init_from_target=true training.learning_rate=1e-3 trainer.precision=bf16-mixed"
  [init_vocab8k_anchors256]="drafter.init_from_target=true training.learning_rate=1e-3 training.draft_vocab_size=8192 training.num_anchors=256"
  [init_vocab8k_bf16]="drafter.init_from_target=true training.learning_rate=1e-3 training.draft_vocab_size=8192 trainer.precision=bf16-mixed"
  [init_vocab8k_b16]="drafter.init_from_target=true training.learning_rate=1e-3 training.draft_vocab_size=8192 drafter.block_size=16"
  [init_vocab8k_b4]="drafter.init_from_target=true training.learning_rate=1e-3 training.draft_vocab_size=8192 drafter.block_size=4"
  [init_vocab8k_b3]="drafter.init_from_target=true training.learning_rate=1e-3 training.draft_vocab_size=8192 drafter.block_size=3"
  [init_vocab8k_depth1]="drafter.init_from_target=true training.learning_rate=1e-3 training.draft_vocab_size=8192 drafter.num_layers=1"
  [init_vocab8k_lr3e-3]="drafter.init_from_target=true training.learning_rate=3e-3 training.draft_vocab_size=8192"
)
ORDER=(random_lr1e-3 init_lr1e-3 init_lr3e-4 init_vocab8k init_bf16 init_anchors256 init_vocab8k_anchors256 init_b16 init_depth1 init_b4 init_depth2 init_kl)
[ $# -gt 0 ] && ORDER=("$@")

for name in "${ORDER[@]}"; do
  overrides=${LEVERS[$name]:-$EXTRA}
  run=artifacts/runs/lever-$name
  if [ ! -f "$run/drafter/model.safetensors" ]; then
    echo "=== $(date -u +%H:%M:%S) train $name: $overrides"
    # shellcheck disable=SC2086
    $PY -m dflash.train experiment=smollm2 run_name=lever-$name $BUDGET \
      trainer.val_check_interval=50 checkpoint.every_n_train_steps=50 eval.after_train=false logger=csv $overrides
  fi
  if [ "${EVAL:-1}" = 1 ] && [ ! -f "$run/eval/results.json" ]; then
    echo "=== $(date -u +%H:%M:%S) evaluate $name"
    $PY -m dflash.evaluate target=smollm2_135m drafter.path=$run/drafter benchmark=humaneval \
      benchmark.prompt_format=paper benchmark.max_samples=10 decoding.max_new_tokens=128 \
      hf_generate=false cpu_threads=2 hydra.run.dir=$run/eval
  fi
done
echo "=== $(date -u +%H:%M:%S) done"
