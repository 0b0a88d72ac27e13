"""One accelerator's kernels, timed from their shapes: GEMMs, memory-bound ops and flash attention.

`profile` reads a device family's figures (SMs, tiles, peaks, achievable fractions, each with its
source) from pipesim/presets/gemm/devices.toml; `gemm` times a matrix multiply with a roofline and
tile/wave quantisation; `kernels` times memory-bound kernels and flash attention; `reference`
compares the GEMM model with OpenXLA's measured H100 table; `measured` reads and summarises what
`pipesim calibrate --gpu` records on a GPU. See docs/gpu_model.md.
"""
