#!/usr/bin/env bash
# The paper's tables on SmolLM2-135M-Instruct (issue 27): every sweep at scale smollm2, in the
# order the tables need them, then the tables. Resumable: re-running skips finished jobs (a
# killed job resumes from its last checkpoint), and a cell two ablations share is trained once.
#   bash benchmarks/smollm2_tables.sh                 # all of it (about 7 hours on a 2-core CPU)
#   SWEEPS="depth loss" bash benchmarks/smollm2_tables.sh
#   WAIT_PID=1234 bash benchmarks/smollm2_tables.sh   # start when process 1234 (a running sweep) has ended
# To keep every cell on one version of the code while you work on the checkout, run it from a
# worktree of a fixed commit, on this checkout's artifacts:
#   git worktree add ../sweep-code HEAD --detach && cd ../sweep-code && \
#     DFLASH_ARTIFACTS=$OLDPWD/artifacts PYTHONPATH=$PWD PY=$OLDPWD/.venv/bin/python bash benchmarks/smollm2_tables.sh
set -u
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
SWEEPS=${SWEEPS:-"block_size main depth target_features loss anchors target_context"}
if [ -n "${WAIT_PID:-}" ]; then
  while kill -0 "$WAIT_PID" 2>/dev/null; do sleep 20; done
fi
for sweep in $SWEEPS; do
  echo "=== $(date -u +%FT%TZ) sweep $sweep"
  "$PY" -m dflash.sweep "$sweep" --scale smollm2 || echo "sweep $sweep: some jobs failed (see their error.json)"
done
echo "=== $(date -u +%FT%TZ) tables"
"$PY" -m dflash.tables out_dir="${DFLASH_ARTIFACTS:-artifacts}/tables/smollm2"
