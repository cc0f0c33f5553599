#!/bin/bash
# The device run of 2026-11-27: CUDA graphs (gpu_check section e), the step-cost bench on a
# random-weight SmolLM2-135M (its real weights, 98 MB as GGUF, cannot travel), then the rest of
# `make gpu-check` (SKIP_AD=1 leaves it out). Run from the repository root on the GPU machine,
# carrying .whl (the transformers 5.24.0 and omegaconf 2.3.1 wheels: the machine has no registry)
# and .gpu (hydra and antlr4 copied from the CPU venv, pure Python; SmolLM2's config.json and
# tokenizer files from artifacts/targets/smollm2_135m); reports land in $OUT. The page
# docs/results/gpu-2026-11-27-h100/README.md says which call gave which report. About 5 minutes
# on an H100, plus the machine's start.
#
# Prepare on the CPU machine first (the folders are ignored by git, carried by the device tool):
#   printf '/.whl/\n/.gpu/\n' >> .git/info/exclude
#   python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl transformers==5.24.0 omegaconf==2.3.1
#   mkdir -p .gpu/site .gpu/smollm2 && cp -r .venv/lib/python3.11/site-packages/{antlr4,hydra} .gpu/site/
#   cp artifacts/targets/smollm2_135m/{config.json,tokenizer.json,tokenizer_config.json,chat_template.jinja,generation_config.json} .gpu/smollm2/
# then run `bash benchmarks/gpu_graphs_h100.sh 2>&1 | tee $OUT/log.txt` with carry [".whl", ".gpu"].
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
cp -r .gpu/site/antlr4 .gpu/site/hydra /tmp/site/
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >"$OUT/nvidia-smi.txt" 2>&1
stamp() { echo "[run $(date -u +%H:%M:%S)] $*"; }
stamp "gpu_check e"
python3 scripts/gpu_check.py --sections e --out "$OUT/graphs.md"
stamp "bench"
python3 benchmarks/random_weight_target.py .gpu/smollm2 /tmp/smollm2_random bfloat16
for engine in graphs fast; do
  python3 -m dflash.bench --target /tmp/smollm2_random --device cuda --dtype bfloat16 --engine "$engine" --batch 0 \
    --out "$OUT/bench-bf16-$engine.md" 2>&1 | grep -v "^Loading weights"
done
if [ -z "${SKIP_AD:-}" ]; then
  stamp "gpu_check a-d"
  python3 scripts/gpu_check.py --sections abcd --out "$OUT/gpu-check.md"
fi
stamp "generation"
python3 -m dflash.bench --target /tmp/smollm2_random --device cuda --dtype bfloat16 --engine graphs --widths 1 \
  --batch 64 --out "$OUT/bench-bf16-generation.md" 2>&1 | grep -v "^Loading weights"
stamp done
