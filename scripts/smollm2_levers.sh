#!/usr/bin/env bash
# Sample-efficiency levers on SmolLM2-135M-Instruct, each at the same step budget, from the
# disk cache of experiments/smollm2.yaml (filled once; every lever reads it):
#   scripts/smollm2_levers.sh [NAME ...]      # default: every lever below, in order
# Each lever trains `python -m dflash.train experiment=smollm2` with its overrides
# (validation tau_sim every 50 steps) into artifacts/runs/lever-NAME, then evaluates the
# exported drafter on 10 HumanEval prompts (measured tau, speedup) into .../eval.
# Resumable: a finished stage is skipped, a killed training resumes from its last checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
STEPS=${STEPS:-250}

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
)
ORDER=(random_lr1e-3 init_lr1e-3 init_lr3e-4 init_anchors256 init_b16 init_depth1 init_b4 init_depth2 init_kl)
[ $# -gt 0 ] && ORDER=("$@")

for name in "${ORDER[@]}"; do
  overrides=${LEVERS[$name]:-$EXTRA}
  run=artifacts/runs/lever-$name
  if [ ! -f "$run/drafter/model.safetensors" ]; then
    echo "=== $(date -u +%H:%M:%S) train $name: $overrides"
    # shellcheck disable=SC2086
    $PY -m dflash.train experiment=smollm2 run_name=lever-$name trainer.max_steps=$STEPS \
      trainer.val_check_interval=50 checkpoint.every_n_train_steps=50 eval.after_train=false logger=csv $overrides
  fi
  if [ ! -f "$run/eval/results.json" ]; then
    echo "=== $(date -u +%H:%M:%S) evaluate $name"
    $PY -m dflash.evaluate target=smollm2_135m drafter.path=$run/drafter benchmark=humaneval \
      benchmark.prompt_format=paper benchmark.max_samples=10 decoding.max_new_tokens=128 \
      hf_generate=false cpu_threads=2 hydra.run.dir=$run/eval
  fi
done
echo "=== $(date -u +%H:%M:%S) done"
