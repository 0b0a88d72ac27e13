#!/usr/bin/env bash
# GPU calibration for a GPU owner: one command, under 5 minutes on an H100/H200, writes a hardware file
# in the presets' format (docs/calibration.md, "A CUDA GPU"; the figures: docs/gpu_model.md).
#
#   bash bench/gpu_calibrate.sh                   # gpu_calibration/hardware.toml (+ hardware.measurements.csv)
#   bash bench/gpu_calibrate.sh out/h200 H200     # output folder, device family (default: from the GPU's name)
#   PYTHON=.venv/bin/python bash bench/gpu_calibrate.sh
#
# It runs `pipesim calibrate --gpu`: on GPU 0, 128 GEMMs (bf16 and fp16, m, n, k each in 256..8192) and 64 FP8
# ones where the GPU has FP8 tensor cores (torch._scaled_mm), a 1 GiB HBM copy, softmax / dropout / layer norm /
# GeLU (the memory-bound kernels), 20 s of back-to-back 8192^3 GEMMs per precision (the sustained clock),
# empty-kernel launches,
# torch's scaled_dot_product_attention forward/backward
# (about a minute and a half before the FP8 GEMMs and their 20 s were added; with them not yet timed on a GPU,
# the 290 s timeout below bounds it); with more than one GPU, NCCL all_reduce, all_gather, reduce_scatter and send_recv
# over all of them under torchrun (8 KiB to 256 MiB, under a minute). Then, as a check, it simulates
# a GPT pipeline on the new file.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=${1:-gpu_calibration}
FAMILY=${2:-}
mkdir -p "$OUT"
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_calibrate.sh: no CUDA device visible to $PY (torch.cuda.is_available() is False)" >&2
    exit 2
fi
ARGS=(-o "$OUT/hardware.toml" --gpu)
if [ -n "$FAMILY" ]; then ARGS+=(--family "$FAMILY"); fi
timeout 290 "$PY" -m pipesim calibrate "${ARGS[@]}"
"$PY" -m pipesim simulate 1f1b -p 4 -m 8 --model gpt --hardware "$OUT/hardware.toml" | head -3
