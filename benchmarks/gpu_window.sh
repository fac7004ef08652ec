#!/usr/bin/env bash
# One lent GPU window (at most ~12 minutes of device time), in one command: first the paper-size Weather runs under
# the HOT authors' protocol with the paper's full recipe (100 epochs, the best mean-validation-MAE checkpoint tested;
# `python benchmarks/campaign.py --plan protocols_paper`: HOT product, the spatial baseline, HOT sum, resumable run
# folders), then, in the time left, the paper-size training step against the GPU's matmul ceiling in fp32 and bf16
# (benchmarks/train_step.py) and the attention layer's time and peak memory. Every measurement and finished run is a
# line of ${OUT}/ledger.jsonl (append it to results/ledger.jsonl, then `python benchmarks/campaign.py --tables`).
# Everything is written under ${OUT:-runs/gpu_window}/; carry ${OUT}/campaign to the next window to resume its
# unfinished runs exactly.
#
#   OUT=runs/gpu_window MINUTES=12 bash benchmarks/gpu_window.sh
set -uo pipefail
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/gpu_window}
MINUTES=${MINUTES:-12}
mkdir -p "$OUT"
start=$(date +%s)
left() { echo $(( MINUTES * 60 - ($(date +%s) - start) )); }
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_window: no CUDA device')" || exit 1
"$PY" -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))" | tee "$OUT/device.txt"
budget=$(( $(left) - 150 ))   # the benchmarks below and the copy back
if [ "$budget" -gt 90 ]; then
    "$PY" benchmarks/campaign.py --device cuda --plan protocols_paper --budget-min "$(echo "$budget / 60" | bc -l)" \
        --out "$OUT/campaign" --ledger "$OUT/ledger.jsonl" --new-ledger 2>&1 | tee "$OUT/campaign.txt"
fi
timeout 60 "$PY" benchmarks/train_step.py --device cuda --reps 10 --cases weather weather_spatial etth1 adrenal \
    --modes default --ledger "$OUT/ledger.jsonl" 2>&1 | tee "$OUT/train_step_fp32.txt"
timeout 40 "$PY" benchmarks/train_step.py --device cuda --reps 10 --precision bf16 --cases weather adrenal \
    --no-paper --ledger "$OUT/ledger.jsonl" 2>&1 | tee "$OUT/train_step_bf16.txt"
timeout 30 "$PY" benchmarks/attention.py --device cuda --reps 5 --ledger "$OUT/ledger.jsonl" 2>&1 \
    | tee "$OUT/attention_fp32.txt"
# keep what resumes a run (last.ckpt, the best checkpoint, campaign.json, logs); not the exported copies
find "$OUT/campaign" -path '*/pretrained/*' -delete 2>/dev/null
echo "gpu_window: $(( $(date +%s) - start )) s, logs and ledger lines in $OUT"
