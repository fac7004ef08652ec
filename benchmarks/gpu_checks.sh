#!/usr/bin/env bash
# Everything that needs a GPU, in one command (`make gpu-checks`): the accelerator tests (CUDA == CPU reference for the
# functional core and every model, bf16 autocast, a Lightning bf16-mixed fit), the two CUDA map_location tests, and
# the attention, triplet, Weaver and compile benchmarks measured on the device. Logs go to ${OUT:-runs/gpu_checks}/.
set -euo pipefail
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/gpu_checks}
mkdir -p "$OUT"
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_checks: no CUDA device')"
"$PY" -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))" | tee "$OUT/device.txt"
"$PY" -m pytest -q -rs tests/test_accelerator.py "tests/test_models.py::test_from_pretrained_map_location_places_whole_model" \
    2>&1 | tee "$OUT/tests.txt"
L=(--ledger "$OUT/ledger.jsonl")   # every measurement is a line of $OUT/ledger.jsonl (append it to results/)
"$PY" benchmarks/attention.py --device cuda --reps 5 "${L[@]}" 2>&1 | tee "$OUT/attention_fp32.txt"
"$PY" benchmarks/attention.py --device cuda --reps 5 --dtype bfloat16 "${L[@]}" 2>&1 | tee "$OUT/attention_bf16.txt"
"$PY" benchmarks/triplet.py --device cuda "${L[@]}" 2>&1 | tee "$OUT/triplet.txt"
"$PY" benchmarks/weaver.py --device cuda "${L[@]}" 2>&1 | tee "$OUT/weaver.txt"
"$PY" benchmarks/compile.py --device cuda "${L[@]}" 2>&1 | tee "$OUT/compile.txt"   # CompileModel on the device
echo "gpu_checks: logs in $OUT"
