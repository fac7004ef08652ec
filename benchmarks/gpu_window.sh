#!/usr/bin/env bash
# One lent GPU window (at most ~9 minutes), in one command: the device, the paper-size training step (hoformer vs the
# paper-equation layer, eager and compiled in each mode, fp32 and bf16: the compile mode is chosen from these
# numbers), the attention layer's time and peak memory, then the paper-scale campaign for the time that is left
# (resumable run folders). Every measurement and finished run is a line of ${OUT}/ledger.jsonl (append it to
# results/ledger.jsonl, then `python benchmarks/campaign.py --tables`). Everything is written under
# ${OUT:-runs/gpu_window}/; carry ${OUT}/campaign to the next window to resume its unfinished runs exactly.
#
#   OUT=runs/gpu_window MINUTES=9 bash benchmarks/gpu_window.sh
set -uo pipefail
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/gpu_window}
MINUTES=${MINUTES:-9}
mkdir -p "$OUT"
start=$(date +%s)
left() { echo $(( MINUTES * 60 - ($(date +%s) - start) )); }
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_window: no CUDA device')" || exit 1
"$PY" -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))" | tee "$OUT/device.txt"
timeout 150 "$PY" benchmarks/train_step.py --device cuda --reps 10 --cases etth1 weather adrenal \
    --modes default reduce-overhead --ledger "$OUT/ledger.jsonl" 2>&1 | tee "$OUT/train_step_fp32.txt"
timeout 90 "$PY" benchmarks/train_step.py --device cuda --reps 10 --precision bf16 --cases etth1 adrenal \
    --modes default reduce-overhead --ledger "$OUT/ledger.jsonl" 2>&1 | tee "$OUT/train_step_bf16.txt"
timeout 60 "$PY" benchmarks/attention.py --device cuda --reps 5 --ledger "$OUT/ledger.jsonl" 2>&1 \
    | tee "$OUT/attention_fp32.txt"
budget=$(( $(left) - 30 ))   # 30 s for the copy back
if [ "$budget" -gt 90 ]; then
    "$PY" benchmarks/campaign.py --device cuda --budget-min "$(echo "$budget / 60" | bc -l)" \
        --out "$OUT/campaign" --ledger "$OUT/ledger.jsonl" 2>&1 | tee "$OUT/campaign.txt"
fi
# keep what resumes a run (last.ckpt, the best checkpoint, campaign.json, logs); not the exported copies
find "$OUT/campaign" -path '*/pretrained/*' -delete 2>/dev/null
echo "gpu_window: $(( $(date +%s) - start )) s, logs and ledger lines in $OUT"
