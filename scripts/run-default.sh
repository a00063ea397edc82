#!/usr/bin/env bash
# `make run`: prepare the embedded corpus (the King James Bible, from Debian's
# bible-kjv package, shipped as data/kjv.txt.gz) with the GPT-2 tokenizer,
# train a small GPT on it for a few minutes, then print a sample.
# Everything goes under runs/default/ (override with MS_RUN_DIR); options for
# the trainer can be appended through MS_TRAIN_ARGS, e.g.
#   MS_TRAIN_ARGS="--steps 50" make run
set -euo pipefail
bin=${1:-build/megascale}
root=$(cd "$(dirname "$0")/.." && pwd)
run=${MS_RUN_DIR:-$root/runs/default}
mkdir -p "$run/data"

if [[ ! -f "$run/data/kjv_train_000000.bin" || ! -f "$run/data/.gpt2" ]]; then
  rm -f "$run/data"/kjv_*.bin
  gzip -dc "$root/data/kjv.txt.gz" > "$run/data/kjv.txt"
  "$bin" data prepare --input "$run/data/kjv.txt" --tokenizer gpt2 --out "$run/data" \
    --name kjv --val-fraction 0.005
  rm -f "$run/data/kjv.txt"
  touch "$run/data/.gpt2"
fi

# 16M parameters (13M of them the GPT-2 vocabulary's embedding), 1,024
# tokens per step, as MS_RANKS (default 2) data-parallel processes under
# mpirun (MS_RANKS=1: one process): a few minutes on two cores.  A checkpoint
# every 50 steps: interrupt it (Ctrl-C) and run it again to continue.
ranks=${MS_RANKS:-2}
launch=()
layout=()
if [[ $ranks -gt 1 ]] && command -v mpirun > /dev/null; then
  launch=(mpirun --oversubscribe -np "$ranks")
  [[ $(id -u) -eq 0 ]] && launch+=(--allow-run-as-root)
  layout=(--dp "$ranks")
fi
rc=0
"${launch[@]}" "$bin" train "${layout[@]}" \
  --train-data "$run/data/kjv_train_*.bin" --val-data "$run/data/kjv_val_*.bin" \
  --vocab 50257 --layers 4 --dim 256 --heads 4 --seq-max 128 --seq 128 \
  --batch 8 --steps 300 --lr 2e-3 --warmup 20 --lr-schedule cosine \
  --val-every 100 --val-batches 4 --log-every 10 \
  --metrics "$run/metrics.jsonl" --save-weights "$run/model.safetensors" \
  --ckpt-dir "$run/ckpt" --ckpt-every 50 --resume auto \
  ${MS_TRAIN_ARGS:-} || rc=$?
if [[ $rc -ne 0 ]]; then
  echo "megascale: training stopped (exit $rc); the last checkpoint is in $run/ckpt:" \
    "run 'make run' again to continue from it" >&2
  exit "$rc"
fi

echo
echo "---- sample (megascale sample --weights $run/model.safetensors) ----"
"$bin" sample --weights "$run/model.safetensors" --prompt "And God said" --tokens 120 \
  --temperature 0.8 --top-k 40 --tokenizer gpt2

echo
echo "---- where the time went (megascale trace stragglers $run/trace) ----"
"$bin" trace stragglers "$run/trace" ||
  echo "(no summary; when this run resumed a finished one, as the warning above says," \
    "it trained no step: MS_TRAIN_ARGS=\"--steps N\" make run trains on to step N)"
echo "timeline of every rank: $bin trace merge $run/trace -o $run/trace.json (open it in ui.perfetto.dev)"
