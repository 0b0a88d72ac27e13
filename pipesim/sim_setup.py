"""What to simulate a schedule against: hardware, a model or hand-given costs, dp/tp, links on/off.

One object turns a model or hand-given costs into a simulation, so `pipesim simulate` and
`pipesim sweep` (their flags: pipesim.commands.setup_args) and the calibration agree on defaults: a
model is costed on `dgx-h100` unless told otherwise; `--cost` alone means abstract seconds with no
links, like the closed forms.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipesim.analysis import inflight_by_stage
from pipesim.costs import CostTable
from pipesim.errors import PipesimError
from pipesim.hardware import Hardware
from pipesim.ir import Schedule
from pipesim.model.config import ModelConfig
from pipesim.model_costs import ParallelCosts, check_fits_memory, model_costs, uniform_costs
from pipesim.parallel_dims import ParallelDims
from pipesim.sim_result import SimResult
from pipesim.simulator import check_devices, simulate

DEFAULT_HARDWARE = "dgx-h100"


@dataclass(frozen=True)
class SimSetup:
    """Everything but the schedule; `run(schedule)` gives a SimResult."""

    hardware: Hardware | None = None  # None: cost mode without links
    model: ModelConfig | None = None  # costed with pipesim.model_costs when given
    cost: dict[str, float] | None = None  # parse_cost_spec output (seconds of F, I, W) when given
    boundary_bytes: int = 0  # bytes per P2P message in cost mode
    activation_bytes: int = 0  # bytes stashed per in-flight microbatch in cost mode
    comm: bool = True  # model links (False: transfers take no time)
    dp: int = 1
    tp: int = 1
    check_memory: bool = True  # refuse a model that does not fit device memory
    layer_split: tuple[int, ...] | None = None  # layers per stage (uneven splits); None: even

    def costs(self, schedule: Schedule) -> ParallelCosts:
        """The costs of `schedule` (cost mode or model mode); PipesimError if it does not fit."""
        check_devices(ParallelDims(pp=schedule.num_ranks, dp=self.dp, tp=self.tp), self.hardware)
        n = schedule.num_stages
        if self.cost is not None:
            if self.dp > 1 or self.tp > 1:
                raise PipesimError("--dp/--tp need a model (--model), not --cost")
            # --cost is one rank's share of the model; with v chunks per rank each chunk takes 1/v of it
            share = schedule.num_ranks / n
            costs = uniform_costs(n, {k: t * share for k, t in self.cost.items()}, boundary_bytes=self.boundary_bytes)
            if self.activation_bytes:
                table = CostTable(tuple(replace(c, activation_bytes=self.activation_bytes) for c in costs.table.stages))
                costs = replace(costs, table=table)
            return costs
        if self.model is None or self.hardware is None:
            raise PipesimError("give --cost F=<s>,B=<s>, or a --model with --hardware")
        split = list(self.layer_split) if self.layer_split else None
        costs = model_costs(self.model, n, schedule.num_microbatches, self.hardware, tp=self.tp, dp=self.dp,
                            layer_split=split)
        if self.check_memory:
            check_fits_memory(costs, self.hardware, inflight_by_stage(schedule), placement=schedule.placement)
        return costs

    def run(self, schedule: Schedule) -> SimResult:
        return simulate(schedule, self.costs(schedule), self.hardware, comm=self.comm and self.hardware is not None,
                        dp=self.dp, tp=self.tp)
