"""What to simulate a schedule against: hardware, a model or hand-given costs, dp/tp, links on/off.

One place turns CLI flags into costs, so `pipesim simulate` and `pipesim sweep` (and the plots)
agree on defaults: a model is costed on `dgx-h100` unless told otherwise; `--cost` alone means
abstract seconds with no links, like the closed forms.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from pipesim.errors import PipesimError
from pipesim.ir import Schedule
from pipesim.model_config import ModelConfig

DEFAULT_HARDWARE = "dgx-h100"


@dataclass(frozen=True)
class SimSetup:
    """Everything but the schedule; `run(schedule)` gives a SimResult."""

    hardware: Any = None  # pipesim.hardware.Hardware, or None (cost mode without links)
    model: ModelConfig | None = None  # costed with pipesim.model_costs when given
    cost: dict[str, float] | None = None  # parse_cost_spec output (seconds of F, I, W) when given
    boundary_bytes: int = 0  # bytes per P2P message in cost mode
    activation_bytes: int = 0  # bytes stashed per in-flight microbatch in cost mode
    comm: bool = True  # model links (False: transfers take no time)
    dp: int = 1
    tp: int = 1
    check_memory: bool = True  # refuse a model that does not fit device memory
    layer_split: tuple[int, ...] | None = None  # layers per stage (uneven splits); None: even

    def costs(self, schedule: Schedule) -> Any:
        """A ParallelCosts for `schedule` (cost mode or model mode); PipesimError if it does not fit."""
        from pipesim.analysis import inflight_by_stage
        from pipesim.model_costs import check_fits_memory, model_costs, uniform_costs
        from pipesim.parallel_dims import ParallelDims
        from pipesim.simulator import check_devices

        check_devices(ParallelDims(pp=schedule.num_ranks, dp=self.dp, tp=self.tp), self.hardware)
        n = schedule.num_stages
        if self.cost is not None:
            if self.dp > 1 or self.tp > 1:
                raise PipesimError("--dp/--tp need a model (--model), not --cost")
            # --cost is one rank's share of the model; with v chunks per rank each chunk takes 1/v of it
            share = schedule.num_ranks / n
            costs = uniform_costs(n, {k: t * share for k, t in self.cost.items()}, boundary_bytes=self.boundary_bytes)
            if self.activation_bytes:
                from dataclasses import replace

                from pipesim.costs import CostTable

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

    def run(self, schedule: Schedule):
        from pipesim.simulator import simulate

        return simulate(schedule, self.costs(schedule), self.hardware, comm=self.comm and self.hardware is not None,
                        dp=self.dp, tp=self.tp)


def add_setup_args(parser: argparse.ArgumentParser) -> None:
    """--hardware, --cost, --boundary-bytes, --activation-bytes, --comm, --dp, --tp (model flags separately)."""
    from pipesim.commands.common import int_list, positive_int

    g = parser.add_argument_group("costs and machine")
    g.add_argument("--hardware", metavar="PRESET|FILE",
                   help=f"hardware preset or TOML file (default {DEFAULT_HARDWARE} with a model; none with --cost)")
    g.add_argument("--cost", metavar="SPEC",
                   help="hand-given seconds per microbatch for one rank's share of the model: F=1,B=2 or "
                        "F=1,I=1,W=1 (with v chunks per rank each chunk takes 1/v)")
    g.add_argument("--boundary-bytes", type=int, default=0, metavar="BYTES",
                   help="with --cost: bytes of each activation/gradient message (default 0)")
    g.add_argument("--activation-bytes", type=int, default=0, metavar="BYTES",
                   help="with --cost: bytes stashed per in-flight microbatch (default 0)")
    g.add_argument("--comm", choices=("links", "none"), default=None,
                   help="links: transfers hold the links for latency + bytes/bandwidth; none: free "
                        "(default links when hardware is known)")
    g.add_argument("--dp", type=positive_int, default=1, help="data-parallel replicas per stage (default 1)")
    g.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel shards per stage (default 1)")
    g.add_argument("--layer-split", type=int_list, default=None, metavar="N,N,...",
                   help="layers per stage, e.g. 3,2,2,1 (default: even split, earlier stages take the remainder)")


def setup_from_args(args: argparse.Namespace) -> SimSetup:
    """Turn the shared flags into a SimSetup (loads the hardware, parses --cost)."""
    from pipesim.commands.common import model_config
    from pipesim.costs import parse_cost_spec
    from pipesim.hardware import load_hardware

    if args.boundary_bytes < 0 or args.activation_bytes < 0:
        raise PipesimError("--boundary-bytes and --activation-bytes must be >= 0")
    cost = parse_cost_spec(args.cost) if args.cost else None
    hw_name = args.hardware or (None if cost is not None else DEFAULT_HARDWARE)
    hardware = load_hardware(hw_name) if hw_name else None
    comm = (args.comm or "links") == "links" and hardware is not None
    model = None if cost is not None else model_config(args)
    split = tuple(args.layer_split) if args.layer_split else None
    if split and cost is not None:
        raise PipesimError("--layer-split needs a model (--model), not --cost")
    return SimSetup(hardware, model, cost, args.boundary_bytes, args.activation_bytes, comm, args.dp, args.tp,
                    layer_split=split)
