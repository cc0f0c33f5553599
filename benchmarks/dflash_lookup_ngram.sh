# dflash_lookup at n = 2 (beside prompt lookup alone at the same width) and n = 4, on a demo
# run's drafter and held-out prompts, per family; results.json under OUT/ngram<n>_<family>/.
#   bash benchmarks/dflash_lookup_ngram.sh ARTIFACTS RUN_DIR HELDOUT_DIR OUT
# e.g. ARTIFACTS=/tmp/demo_amd6/artifacts RUN_DIR=$ARTIFACTS/runs/demo-smollm2-eea0d224ca
#      HELDOUT_DIR=$ARTIFACTS/demo/smollm2-data-c4ed81d327-demo (run from the repository root)
set -e
artifacts=$1 run_dir=$2 heldout=$3 out=$4
for n in 2 4; do
  methods='methods=[dflash_lookup]'
  [ "$n" = 2 ] && methods='methods=[dflash_lookup,ngram]'
  for family in chat math humaneval; do
    if [ "$family" = humaneval ]; then
      prompts="benchmark=humaneval benchmark.prompt_format=paper benchmark.max_samples=16"
    else
      prompts="benchmark=jsonl benchmark.path=$heldout/heldout_$family.jsonl benchmark.prompt_format=raw"
    fi
    # shellcheck disable=SC2086
    .venv/bin/python -m dflash.evaluate target=smollm2_135m drafter.path="$run_dir/drafter" $prompts "$methods" \
      dflash_lookup.ngram=$n ngram.num_draft_tokens=2 decoding.max_new_tokens=128 hf_generate=false cpu_threads=2 \
      paths.artifacts="$artifacts" hydra.run.dir="$out/ngram${n}_$family"
  done
done
