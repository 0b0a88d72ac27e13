"""pipesim's kernel model beside bench/gpu_layers.py's records: per case, per phase and per kind of kernel.

  python bench/gpu_layers_compare.py LAYERS.csv [--hardware FILE_OR_PRESET ...]

For each hardware (default: the shipped H200 profile, hgx-h200) it prints, per case, the model's seconds of the F,
I and W kernel lists (fused, Megatron's) against the records: each kernel alone (summed), the phase back to back,
and for the GPT cases the real blocks: the eager torch block and the Megatron-layout block against the unfused lists
(F; I + W), the torch.compile block against the fused ones. Error = model / measured - 1
(negative: the model is too fast). Then the same by kind of kernel over all cases. No torch needed.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from gpu_layer_configs import CASES, DTYPE, LayerCase

from pipesim.cost.device_profiles import profile_of
from pipesim.cost.kernel_costs import kernel_seconds
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.model.kernel_types import FlashAttention, Gemm, Kernel


def kind_of(k: Kernel) -> str:
    if isinstance(k, Gemm):
        return "GEMM" if k.batch == 1 else "batched GEMM"
    return "flash attention" if isinstance(k, FlashAttention) else "memory-bound"


def read(path: Path) -> dict[str, list[dict]]:
    """The records by case label."""
    out: dict[str, list[dict]] = defaultdict(list)
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            row["seconds"] = float(row["seconds"])
            out[row["case"]].append(row)
    return out


def _err(model: float, measured: float) -> str:
    return f"{model / measured - 1:+6.1%}" if measured > 0 else "   n/a"


def compare_case(case: LayerCase, rows: list[dict], profile, by_kind: dict) -> list[str]:
    """One case's lines; adds (model, measured) seconds per kind of kernel to `by_kind`."""
    alone = {(r["phase"], r["kernel"]): r["seconds"] for r in rows if r["mode"] == "alone"}
    seen = {}  # first phase each kernel name was timed in (a kernel recurs across the fused/unfused lists)
    for r in rows:
        if r["mode"] == "alone":
            seen.setdefault(r["kernel"], r["phase"])
    seq = {(r["mode"], r["phase"]): r["seconds"] for r in rows if r["mode"] != "alone"}
    lines = []
    model_sums: dict[tuple[bool, str], float] = {}
    for fused in (True, False):
        pk = case.kernels(fused)
        for phase in "FIW":
            ks = getattr(pk, phase)
            pairs = [(kernel_seconds(k, DTYPE, profile), alone[(seen[k.name], k.name)]) for k in ks]  # model, alone
            model, measured = sum(m for m, _ in pairs), sum(a for _, a in pairs)
            model_sums[(fused, phase)] = model
            if fused:
                for k, (m, a) in zip(ks, pairs):
                    acc = by_kind[kind_of(k)]
                    acc[0] += m
                    acc[1] += a
                    acc[2].append(m / a - 1)
            mode = "sequence-fused" if fused else "sequence-unfused"
            back = seq.get((mode, phase), 0.0)
            lines.append(f"  {'fused  ' if fused else 'unfused'} {phase}: model {model * 1e3:8.3f} ms | kernels alone "
                         f"{measured * 1e3:8.3f} ms ({_err(model, measured)}) | back to back {back * 1e3:8.3f} ms "
                         f"({_err(model, back)})")
    blocks = (("eager", "eager torch block", False), ("megatron", "Megatron-layout block", False),
              ("compiled", "torch.compile block", True))
    for mode, label, fused in blocks:  # each block beside the model's list of its kernels (one per op, or fused)
        if (mode, "F") in seq:
            name = "fused" if fused else "unfused"
            f = model_sums[(fused, "F")]
            b = model_sums[(fused, "I")] + model_sums[(fused, "W")]
            ef, eb = seq[(mode, "F")], seq[(mode, "B")]
            lines.append(f"  {label + ':':22s} F {ef * 1e3:8.3f} ms (model {name} {_err(f, ef)}) | "
                         f"B {eb * 1e3:8.3f} ms (model {name} I+W {_err(b, eb)})")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("layers", type=Path, help="layers.csv of bench/gpu_layers.py")
    ap.add_argument("--hardware", nargs="+", default=["hgx-h200"], help="presets or hardware files to compare")
    args = ap.parse_args(argv)
    try:
        records = read(args.layers)
        for spec in args.hardware:
            hw = load_hardware(spec)
            profile = profile_of(hw.device.family, hw.device.kernels)
            bound = profile.memory_bound_rate / profile.hbm_bandwidth
            print(f"## {hw.name}: {hw.device.family} profile, matmul {profile.matmul_efficiency:.3f}, memory "
                  f"{profile.memory_efficiency:.3f} (memory-bound kernels {bound:.3f}), flash "
                  f"{profile.flash_forward_efficiency:.3f}/{profile.flash_backward_efficiency:.3f}, overhead "
                  f"{profile.kernel_overhead * 1e6:.2f} us")
            by_kind: dict[str, list] = defaultdict(lambda: [0.0, 0.0, []])
            for case in CASES:
                if case.label in records:
                    print(case.label)
                    print("\n".join(compare_case(case, records[case.label], profile, by_kind)))
            print("by kind of kernel (fused lists, all cases): model / measured alone - 1")
            for kind, (model, measured, errs) in sorted(by_kind.items()):
                print(f"  {kind:16s} total {_err(model, measured)}  per kernel median {statistics.median(errs):+.1%}"
                      f"  [{min(errs):+.1%}, {max(errs):+.1%}]  ({len(errs)} kernels)")
    except (PipesimError, OSError, KeyError, ValueError) as exc:
        print(f"gpu_layers_compare.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
