"""`pipesim run zb-auto` and `zb-2p` (and `zb-v` with `--ilp`): their order searched for the simulated costs of
the model being run.

The registry orders zb-auto and zb-2p for unit costs. Before torchrun starts, each run naming them is
costed as `pipesim simulate` costs it (SimSetup: the run's model, layout and layer split on `--hardware`,
by default this CPU box's calibrated `local-cpu` preset under gloo and dgx-h100 under NCCL), the order is
searched (`SimSetup.tuned`: the heuristic, and the ILP with `--ilp S`) and handed to the workers in the
RunConfig (`orders`, the IR's action strings), so the executor runs exactly the Schedule the simulator
times. A user's `--model MODULE:FACTORY` keeps the registry's order (its costs need the factory called), so does a
run the cost model refuses (said on stderr); `--then` runs are ordered with the first run's --hardware and --ilp.
zb-v is searched only with `--ilp` (pipesim.cost.v_search), and keeps its handcrafted order, said on stderr,
where the searched one would receive on a link out of send order under NCCL.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace

import schedules
from executor.run_config import RunConfig, check_transport_order
from pipesim.cost.v_search import SEARCHED, V_SEARCHED
from pipesim.cost.zb_auto_costs import AUTO_SCHEDULES
from pipesim.errors import PipesimError
from pipesim.hardware.machine import Hardware
from pipesim.hardware.toml_io import load_hardware
from pipesim.sim.sim_setup import DEFAULT_HARDWARE, SimSetup

CPU_HARDWARE = "local-cpu"  # the calibrated preset of this kind of box (pipesim/presets/local-cpu.toml)


def order_hardware(cfg: RunConfig, name: str | None, world: int) -> Hardware:
    """The machine the order is searched for: `name`, or local-cpu under gloo and dgx-h100 under NCCL, with
    enough nodes for `world` ranks."""
    hw = load_hardware(name or (DEFAULT_HARDWARE if cfg.uses_nccl() else CPU_HARDWARE))
    need = math.ceil(world / hw.devices_per_node)
    return hw.with_nodes(need) if need > hw.num_nodes else hw


def _ordered(name: str, ilp_seconds: float | None) -> bool:
    """Whether `pipesim run` searches `name`'s order: zb-auto and zb-2p always, zb-v with --ilp."""
    return name in AUTO_SCHEDULES or (name in V_SEARCHED and ilp_seconds is not None)


def check_order_flags(cfgs: list[RunConfig], hardware: str | None, ilp_seconds: float | None) -> None:
    """Refuse --hardware and --ilp where no run of `cfgs` has an order they search (they would be ignored)."""
    names = {n for cfg in cfgs if cfg.factory is None for n in cfg.names}
    if ilp_seconds is not None and not names & set(SEARCHED):
        raise PipesimError(f"--ilp searches the order of {', '.join(SEARCHED)} only; this run has none of them")
    if hardware is not None and not any(_ordered(n, ilp_seconds) for n in names):
        raise PipesimError(f"--hardware costs the order of {', '.join(AUTO_SCHEDULES)} (and of "
                           f"{', '.join(V_SEARCHED)} with --ilp) only; this run has none to order")


def searched_orders(cfg: RunConfig, world: int, hardware: str | None = None,
                    ilp_seconds: float | None = None) -> RunConfig:
    """`cfg` with zb-auto / zb-2p's orders (zb-v's with `ilp_seconds`) searched for its simulated costs (unchanged
    when it names none)."""
    names = [n for n in cfg.names if _ordered(n, ilp_seconds)]
    if not names or cfg.factory is not None:
        return cfg
    job = cfg.job_for(world)
    setup = SimSetup(order_hardware(cfg, hardware, world), cfg.model, job=job, check_memory=False,
                     layer_split=cfg.layer_split, ilp_time_limit=ilp_seconds)
    orders = []
    for name in names:
        registry = schedules.build(name, job.pp, cfg.microbatches)
        try:
            tuned = setup.tuned(registry, setup.costs(registry))
        except PipesimError as exc:  # the cost model refuses what the executor runs (an MLP's full recompute)
            print(f"pipesim run: {name} keeps its unit-cost order: the cost model refuses this run ({exc})",
                  file=sys.stderr)
            continue
        if name in V_SEARCHED and tuned.programs != registry.programs:
            from pipesim.ir.schedule_check import validate  # local import: networkx kept out of `pipesim`'s start-up

            try:
                check_transport_order(validate(tuned), nccl=cfg.uses_nccl())
            except PipesimError as exc:
                print(f"pipesim run: {name} keeps its handcrafted order: the searched one {exc}", file=sys.stderr)
                continue
        orders.append((name, tuple(tuple(str(a) for a in prog) for prog in tuned.programs)))
    return replace(cfg, orders=tuple(orders))
