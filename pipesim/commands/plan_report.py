"""`pipesim plan`'s output: the ranked table with the winner's exports, and the same as JSON (docs/planner.md)."""

from __future__ import annotations

from pipesim.plan.exports import command_line, exports_for, megatron_text, run_note
from pipesim.plan.ranking import why_lost
from pipesim.plan.search import PlanResult
from pipesim.plan.space import PlanRequest
from pipesim.plan.torchtitan_export import torchtitan_toml
from pipesim.units import format_bytes


def muon_name(req: PlanRequest) -> str | None:
    """The plan's --optimizer when it is Megatron-core's Muon (None: Adam)."""
    return req.job.muon.name if req.job.muon is not None else None


def exports_of(req: PlanRequest) -> tuple[str, ...]:
    """The projects the plan's winner is exported to (`exports_for`: its framework's, Megatron-LM's alone under
    Muon)."""
    return exports_for(req.framework, req.job.muon is not None)


def plan_json(result: PlanResult, top: int, argv: list[str], attention: str, run_argv: list[str],
              config: str | None = None) -> dict:
    """The plan as JSON; `config` the bundled config the model is, unchanged (torchtitan's export names it)."""
    best, req = result.best, result.request
    rows = [{**r.to_dict(), "why": why_lost(r, best)} for r in result.rows[:top]]
    c, exports = best.candidate, exports_of(req)
    return {"schema": "pipesim.plan/1", "gpus": req.gpus, "hardware": req.hardware.name,
            "device_memory": req.hardware.device.memory, "attention": attention, "counts": result.counts,
            "rows": rows,
            "winner": {"simulate_command": command_line(argv), "run_command": command_line(run_argv),
                       **({"run_note": note} if (note := run_note(c, req.model, muon_name(req))) else {}),
                       **({"megatron_args": megatron_text(c, req, attention).splitlines()}
                          if "megatron" in exports else {}),
                       **({"torchtitan_toml": torchtitan_toml(c, req, config)}
                          if "torchtitan" in exports else {})}}


def report(result: PlanResult, top: int, argv: list[str], attention: str, run_argv: list[str],
           config: str | None = None) -> str:
    """The ranked table, the counts, and the winner's exports (`config` as plan_json's)."""
    req, best = result.request, result.best
    k = result.counts
    lines = [f"plan: {req.gpus} GPUs of {req.hardware.name} ({format_bytes(req.hardware.device.memory)} each), "
             f"batch {req.model.batch} x seq {req.model.seq}",
             f"{k['enumerated']} candidates ({attention} attention), "
             + (f"{k['refused_by_model']} refused by the model's or the layer split's rules, "
                if k.get("refused_by_model") else "")
             + f"{k['over_memory_bound']} over memory by the "
             f"bound; of the {k['fits_memory_bound']} left, in the estimate's order: {k['refused_by_schedule']} "
             f"refused by their schedule, {k['over_memory']} over memory, {k['simulated']} simulated, "
             f"{k['not_simulated_cap']} not reached",
             f"{'#':>3} {'configuration':<56} {'step ms':>9} {'tok/s':>10} {'MFU':>6} {'TF/GPU':>7} "
             f"{'peak mem':>10} {'bubble':>7}" + (f" {'E[step] ms':>11}" if best.expected_step_time else "")
             + "  why not first"]
    for i, r in enumerate(result.rows[:top], 1):
        expected = f" {r.expected_step_time * 1e3:11.3f}" if best.expected_step_time else ""
        lines.append(f"{i:>3} {r.candidate.label():<56} {r.step_time * 1e3:9.3f} {r.tokens_per_s:10.0f} "
                     f"{r.mfu * 100:5.1f}% {r.tflops_per_gpu:7.1f} {format_bytes(r.peak_memory):>10} "
                     f"{r.bubble_fraction * 100:6.1f}%{expected}  {why_lost(r, best)}")
    c = best.candidate
    lines += ["", "winner as a pipesim command:", "  " + command_line(argv), "",
              "run it for real (NCCL; the same command on every node):", "  " + command_line(run_argv)]
    note, exports = run_note(c, req.model, muon_name(req)), exports_of(req)
    lines += ["  " + note] if note else []
    if "megatron" in exports:
        lines += ["", "Megatron-LM arguments:"]
        lines += ["  " + x for x in megatron_text(c, req, attention).splitlines()]
    if "torchtitan" in exports:
        lines += ["", "torchtitan job config:"]
        lines += [f"  {x}" if x else "" for x in torchtitan_toml(c, req, config).splitlines()]
    return "\n".join(lines)


__all__ = ["plan_json", "report"]
