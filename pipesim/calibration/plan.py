"""The runs a calibration measures, and how one of them is simulated.

A run is a plain dict (it crosses to the torchrun worker `pipesim.calibration.runs` as JSON): its id,
schedule, ranks, microbatches, virtual stages, model and step counts. `simulate_run` predicts it
exactly as `pipesim simulate --hardware` would, for the fit's refinements and the validation alike.
"""

from __future__ import annotations

import schedules
from pipesim.hardware.machine import Hardware
from pipesim.model.config import ModelConfig
from pipesim.sim.sim_setup import SimSetup

LECTURE_MLP = {"kind": "mlp", "hidden": 1024, "layers": 8, "batch": 64}
QUICK_MLP = {"kind": "mlp", "hidden": 512, "layers": 4, "batch": 32}
SMALL_GPT = {"kind": "gpt", "hidden": 128, "layers": 8, "heads": 4, "seq": 32, "vocab": 256, "batch": 8}
STEPS, WARMUP = 8, 2  # steps of a measured run, and how many of them lead in untimed (the report cites them)


def run_spec(run_id: str, schedule: str, m: int, model: dict, *, p: int = 2, v: int | None = None,
             steps: int = STEPS, warmup: int = WARMUP) -> dict:
    """One entry of a measurement plan (see `pipesim.calibration.runs`); p ranks."""
    return {"id": run_id, "schedule": schedule, "p": p, "microbatches": m, "virtual": v, "model": model,
            "steps": steps, "warmup": warmup}


def simulate_run(hw: Hardware, run: dict):
    """Simulate one planned run on `hw` exactly as `pipesim simulate --hardware` would; a SimResult."""
    sched = schedules.build(run["schedule"], run["p"], run["microbatches"], run.get("virtual"))
    return SimSetup(hardware=hw, model=ModelConfig(**run["model"]), comm=True, check_memory=False).run(sched)


def calibration_plan(quick: bool = False) -> list[dict]:
    """The runs the fit uses: 2 ranks (fused and split backward, two microbatch sizes, MLP widths, the GPT)
    and one run with more ranks than this machine's 2 cores."""
    if quick:
        return [run_spec("fit-1f1b-m2", "1f1b", 2, QUICK_MLP, steps=3, warmup=1),
                run_spec("fit-zb-h1-m4", "zb-h1", 4, QUICK_MLP, steps=3, warmup=1)]
    half = {**LECTURE_MLP, "hidden": 512}
    return [run_spec("fit-mlp-gpipe-m4", "gpipe", 4, LECTURE_MLP),
            run_spec("fit-mlp-1f1b-m8", "1f1b", 8, LECTURE_MLP),
            run_spec("fit-mlp-zb-h1-m8", "zb-h1", 8, LECTURE_MLP),
            run_spec("fit-mlp512-1f1b-m4", "1f1b", 4, half),
            run_spec("fit-mlp512-zb-h1-m4", "zb-h1", 4, half),
            run_spec("fit-gpt-1f1b-m4", "1f1b", 4, SMALL_GPT),
            run_spec("fit-gpt-zb-h1-m4", "zb-h1", 4, SMALL_GPT),
            run_spec("fit-mlp-p4-1f1b-m8", "1f1b", 8, LECTURE_MLP, p=4)]  # more ranks than cores


__all__ = ["LECTURE_MLP", "QUICK_MLP", "SMALL_GPT", "STEPS", "WARMUP", "calibration_plan", "run_spec", "simulate_run"]
