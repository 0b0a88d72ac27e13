"""The GEMM a stage's tensor-parallel collective hides behind: Megatron's async backward (beside its GEMM, NCCL's
channels taking SMs) and Transformer Engine's userbuffers (inside its GEMM), each GEMM timed on the figures its dtype
and FP8 recipe run at. The cost model's step from a stage's kernel seconds to its collectives' overlap."""

from __future__ import annotations

from pipesim.comm.overlap_interference import HidingGemm, hiding_gemm
from pipesim.comm.tp_collective import TpCollective
from pipesim.comm.ub_overlap import UbConfig, ub_gemm
from pipesim.cost.device_profiles import gemm_timing
from pipesim.cost.kernel_costs import StageSeconds, overlap_gemm
from pipesim.cost.stage_work import Work
from pipesim.hardware.machine import Hardware
from pipesim.kernel_switches import KernelSwitches


def _hiding(name: str | None, timed: StageSeconds, dtype: str, hw: Hardware, recipe: str | None) -> HidingGemm | None:
    """The stage's GEMM `name` as a HidingGemm (an FP8 GEMM re-timed on `recipe`'s figures), None if it has none."""
    shape = timed.shapes.get(name) if name else None
    if shape is None:
        return None
    gemm_dtype, profile = gemm_timing(shape, dtype, hw.device.family, hw.device.kernels, recipe)
    return hiding_gemm(name, timed.gemms, timed.shapes, gemm_dtype, profile)


def with_overlap(backward: tuple[TpCollective, ...], overlaps: list[str], timed: StageSeconds, dtype: str,
                  hw: Hardware, recipe: str | None) -> tuple[TpCollective, ...]:
    """Megatron's async tensor-parallel backward: each collective that overlaps a GEMM runs beside it (its
    HidingGemm: that GEMM's seconds and shape); the simulator exposes what the GEMM, slowed by the SMs NCCL's
    channels hold, does not cover (pipesim.comm.overlap_interference). The rest stay blocking."""
    return tuple(c._replace(beside=_hiding(overlap_gemm(overlaps[n]), timed, dtype, hw, recipe))
                 for n, c in enumerate(backward))


def on_userbuffers(colls: tuple[TpCollective, ...], whats: list[str], ub: UbConfig, timed: StageSeconds, dtype: str,
                    hw: Hardware, recipe: str | None) -> tuple[TpCollective, ...]:
    """`--tp-comm-overlap`: each dense linear's sp collective (`whats[n]` names it) inside its own GEMM by its
    userbuffers method (pipesim.comm.ub_overlap); the others as they were."""
    out: list[TpCollective] = []
    for n, c in enumerate(colls):
        named = ub_gemm(whats[n])
        gemm = _hiding(named[1], timed, dtype, hw, recipe) if named else None
        out.append(c._replace(beside=gemm, ub=ub.method(named[0])) if gemm is not None else c)
    return tuple(out)


def stage_tp_collectives(s: int, work: Work, timed: StageSeconds | None, recipe: str | None, kernels: KernelSwitches,
                         dtype: str, hw: Hardware) -> dict[tuple[int, str], tuple[TpCollective, ...]]:
    """(stage, action) -> the tp collectives of stage `s` (or of a part of it: its bf16 layers under
    --first-last-layers-bf16, whose GEMMs `timed` and `recipe` None give), each carrying the GEMM it hides behind on
    the kernel path: in the forward, userbuffers' (--tp-comm-overlap); in a fused backward (B) Megatron's async ones
    beside the wgrad GEMMs, and userbuffers'; split, each blocks in I (the first stage: in W, its whole backward)."""
    out: dict[tuple[int, str], tuple[TpCollective, ...]] = {}
    ub = kernels.ub if timed is not None else None  # userbuffers: the kernel path's GEMMs carry them
    forward, backward_colls = work.collectives["F"], work.collectives["I"]
    if forward:
        out[(s, "F")] = tuple(TpCollective(c.kind, round(c.nbytes)) for c in forward)
        if ub is not None:
            out[(s, "F")] = on_userbuffers(out[(s, "F")], [c.what for c in forward], ub, timed, dtype, hw, recipe)
    if backward_colls:
        backward = tuple(TpCollective(c.kind, round(c.nbytes)) for c in backward_colls)
        out[(s, "W" if s == 0 else "I")] = out[(s, "B")] = backward
        if timed is not None and kernels.tp_comm_overlap:  # a fused backward: each wgrad GEMM after its dgrad
            fused_b = with_overlap(backward, [c.overlaps for c in backward_colls], timed, dtype, hw, recipe)
            if ub is not None:
                fused_b = on_userbuffers(fused_b, [c.what for c in backward_colls], ub, timed, dtype, hw, recipe)
            out[(s, "B")] = fused_b
            if s == 0:
                out[(0, "W")] = fused_b
    return out


__all__ = ["on_userbuffers", "stage_tp_collectives", "with_overlap"]
