#!/usr/bin/env bash
# GPU calibration of pipesim's kernel model (docs/gpu_model.md), for a GPU owner: under 5 minutes.
#
#   bash bench/gpu_calibrate.sh                 # writes gpu_calibration/{measurements.csv,profile.toml}
#   bash bench/gpu_calibrate.sh out/h100 H100   # output folder, device family (default: from the GPU name)
#   PYTHON=.venv/bin/python bash bench/gpu_calibrate.sh
#
# One GPU: GEMMs (bf16 and fp16, m, n, k in 256..8192), a 1 GiB HBM copy, kernel launches and
# torch's scaled_dot_product_attention forward/backward (bench/gpu_calibrate.py, about a minute).
# More than one GPU: first NCCL all_reduce, all_gather, reduce_scatter and send_recv over all of
# them (`pipesim bench collectives`, 8 KiB to 256 MiB), merged into the same measurements file.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=${1:-gpu_calibration}
FAMILY=${2:-}
mkdir -p "$OUT"
NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
if [ "$NGPU" -lt 1 ]; then
    echo "gpu_calibrate.sh: no CUDA device; for the CPU path run: $PY bench/gpu_calibrate.py --out $OUT --cpu-fallback" >&2
    exit 2
fi
ARGS=(--out "$OUT")
if [ -n "$FAMILY" ]; then ARGS+=(--family "$FAMILY"); fi
if [ "$NGPU" -gt 1 ]; then
    timeout 180 "$PY" -m pipesim bench collectives --nproc "$NGPU" \
        --ops all_reduce,all_gather,reduce_scatter,send_recv --sizes 8K,1M,64M,256M --iters 20 \
        --json "$OUT/collectives.json"
    ARGS+=(--collectives-json "$OUT/collectives.json")
fi
timeout 240 "$PY" bench/gpu_calibrate.py "${ARGS[@]}"
