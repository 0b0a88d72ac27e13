"""Seconds to simulate the largest published configurations (issue 14's bound: the 16,384-GPU Llama 3 405B
run under 1 s, the 3072-GPU 1T run under 3 s on the 2-core dev machine). Prints; asserts nothing.

    .venv/bin/python bench/bench_large_configs.py
"""

from __future__ import annotations

import shlex
import time

from pipesim.cli import build_parser
from pipesim.commands.common import load_schedule
from pipesim.commands.setup_args import setup_from_args

SPLIT = "0," + ",".join(["1"] * 126) + ",0"
CONFIGS = {
    "Llama 3 405B, 16,384 H100s (tp 8, pp 16 x 8 chunks, dp 128)": (
        "simulate interleaved-1f1b --model-config llama3-405b --seq 8192 --batch 2048 --microbatch-size 1 --tp 8 "
        f"--stages 16 --virtual 8 --sequence-parallel --hardware dgx-h100 --layer-split {SPLIT} --dp 128 "
        "--nodes 2048 --zero 2"),
    "NAR21 1T, 3072 A100s (tp 8, pp 64, dp 6, 512 microbatches)": (
        "simulate 1f1b --model gpt --hidden 25600 --layers 128 --heads 160 --seq 2048 --vocab 51200 --batch 3072 "
        "--microbatch-size 1 --tp 8 --stages 64 --dp 6 --dtype float16 --hardware dgx-a100 --nodes 384 "
        "--attention eager --recompute full"),
}


def time_config(argv: list[str], repeats: int = 3) -> float:
    """Best of `repeats`: costs, memory check and simulation (what `pipesim simulate` does past start-up)."""
    best = float("inf")
    for _ in range(repeats):
        args = build_parser().parse_args(argv)
        start = time.perf_counter()
        setup = setup_from_args(args)
        args.microbatches = setup.microbatches(args.microbatches, args.microbatch_size)
        setup.evaluate(load_schedule(args, validate=False))
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    for label, cmd in CONFIGS.items():
        print(f"{time_config(shlex.split(cmd)):7.3f} s  {label}")


if __name__ == "__main__":
    main()
