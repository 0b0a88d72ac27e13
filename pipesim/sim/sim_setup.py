"""What to simulate a schedule against: hardware, a model or hand-given costs, dp/tp/cp, the transformer's
options (recomputation, sequence parallelism, attention kernel, ZeRO), links on/off.

One object turns a model or hand-given costs into a simulation, so `pipesim simulate` and
`pipesim sweep` (their flags: pipesim.commands.setup_args) and the calibration agree on defaults: a
model is costed on `dgx-h100` unless told otherwise; `--cost` alone means abstract seconds with no
links, like the closed forms; attention is flash on GPU hardware at 16 bits, eager on CPUs and in
float32 (the models the CPU preset was calibrated with).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipesim.comm.comm_options import CommOptions
from pipesim.cost.chain_costs import on_chains
from pipesim.cost.model_costs import ParallelCosts, model_costs, uniform_costs
from pipesim.cost.rank_memory import check_memory, rank_memory
from pipesim.cost.user_model_costs import UserModel, user_model_costs
from pipesim.cost.zb_auto_costs import AUTO_SCHEDULES, MemoryLimit, rebuild
from pipesim.errors import PipesimError
from pipesim.hardware.machine import Hardware
from pipesim.ir.schedule import Schedule
from pipesim.model.config import ModelConfig
from pipesim.model.memory import MemoryBreakdown
from pipesim.parallel_dims import ParallelDims
from pipesim.sim.result import SimResult
from pipesim.sim.simulator import check_devices, simulate

DEFAULT_HARDWARE = "dgx-h100"


def default_attention(hardware: Hardware | None, model: ModelConfig | None) -> str:
    """flash on GPU hardware (no [host] profile) at 16 bits; eager on CPUs and in float32 (today's numbers)."""
    gpu = hardware is not None and hardware.host is None
    return "flash" if gpu and model is not None and model.dtype != "float32" else "eager"


@dataclass(frozen=True)
class SimSetup:
    """Everything but the schedule; `run(schedule)` gives a SimResult."""

    hardware: Hardware | None = None  # None: cost mode without links
    model: ModelConfig | None = None  # costed with pipesim.cost.model_costs when given
    cost: dict[str, float] | None = None  # parse_cost_spec output (seconds of F, I, W) when given
    boundary_bytes: int = 0  # bytes per P2P message in cost mode
    activation_bytes: int = 0  # bytes stashed per in-flight microbatch in cost mode
    comm: bool = True  # model links (False: transfers take no time)
    dp: int = 1
    tp: int = 1
    check_memory: bool = True  # refuse a model that does not fit device memory
    layer_split: tuple[int, ...] | None = None  # layers per stage (uneven splits); None: even
    recompute: str = "none"  # "none", "selective" (attention core) or "full" (Megatron's meanings)
    sp: bool = False  # sequence parallelism over the tp ranks
    attention: str | None = None  # "flash" or "eager"; None: `default_attention`
    cp: int = 1  # context-parallel ranks (each holds seq / cp tokens)
    zero: int = 0  # ZeRO stage of the data-parallel state
    memory_limit: MemoryLimit | None = None  # zb-auto / zb-2p: per-rank activation limit (None: their default)
    comm_options: CommOptions = CommOptions()  # scatter/gather, overlapped gradient buckets (pipesim.comm.comm_options)
    kernel_fusion: bool = True  # GPU kernel path: Megatron's fused elementwise kernels (False: eager PyTorch's)
    tp_comm_overlap: bool = True  # GPU kernel path: backward TP collectives under the weight-gradient GEMM
    grad_accum_fusion: bool = True  # GPU kernel path: wgrad GEMMs accumulate into main_grad (False: a separate add)
    grad_fp32: bool | None = None  # 16-bit models: float32 main gradients (None: for bfloat16, as Megatron)
    user_model: UserModel | None = None  # --model MODULE:FACTORY, counted per layer (pipesim.cost.user_model_costs)

    @property
    def attention_kernel(self) -> str:
        return self.attention or default_attention(self.hardware, self.model)

    def microbatches(self, microbatches: int | None, microbatch_size: int | None) -> int:
        """m from --microbatches or --microbatch-size (m = batch / (dp x mbs)); 8 when neither is given."""
        if microbatch_size is None and microbatches is None:
            return 8
        if self.model is None or self.cost is not None:
            if microbatch_size is not None:
                raise PipesimError("--microbatch-size needs a model (--model), not --cost; give --microbatches")
            return microbatches
        return self.model.microbatches_for(self.dp, microbatches=microbatches, microbatch_size=microbatch_size)

    def options(self) -> dict:
        """The features in effect, as --json reports them (one vocabulary with the flags)."""
        model = self.model is not None and self.cost is None
        return {"recompute": self.recompute, "sequence_parallel": self.sp,
                "attention": self.attention_kernel if model else None, "cp": self.cp, "zero": self.zero,
                "nodes": self.hardware.num_nodes if self.hardware is not None else None,
                **(self.comm_options.report() if self.comm_options != CommOptions() else {})}  # set ones only

    def costs(self, schedule: Schedule) -> ParallelCosts:
        """The costs of `schedule` (cost mode or model mode); PipesimError if it does not fit."""
        check_devices(ParallelDims(pp=schedule.num_ranks, dp=self.dp, cp=self.cp, tp=self.tp), self.hardware)
        n = schedule.model_stages  # layer chunks; DualPipe's two chains run each twice (pipesim.cost.chain_costs)
        if self.cost is not None:
            if self.dp > 1 or self.tp > 1 or self.cp > 1:
                raise PipesimError("--dp/--tp/--cp need a model (--model), not --cost")
            if self.recompute != "none" or self.sp or self.zero:
                raise PipesimError("--recompute/--sequence-parallel/--zero need a model (--model), not --cost")
            # --cost is one rank's share of the model; with v chunks per rank each chunk takes 1/v of it
            share = schedule.num_ranks / n
            costs = uniform_costs(n, {k: t * share for k, t in self.cost.items()}, boundary_bytes=self.boundary_bytes)
            if self.activation_bytes:
                table = replace(costs.table, stages=tuple(replace(c, activation_bytes=self.activation_bytes)
                                                          for c in costs.table.stages))
                costs = replace(costs, table=table)
            return on_chains(costs, schedule)
        if self.user_model is not None and self.hardware is not None:
            split = list(self.layer_split) if self.layer_split else None
            return on_chains(user_model_costs(self.user_model, n, self.hardware, dp=self.dp, layer_split=split),
                             schedule)
        if self.model is None or self.hardware is None:
            raise PipesimError("give --cost F=<s>,B=<s>, or a --model with --hardware")
        split = list(self.layer_split) if self.layer_split else None
        costs = model_costs(self.model, n, schedule.num_microbatches, self.hardware, tp=self.tp, dp=self.dp,
                            layer_split=split, sp=self.sp, cp=self.cp, recompute=self.recompute,
                            attention=self.attention_kernel, zero=self.zero, kernel_fusion=self.kernel_fusion,
                            tp_comm_overlap=self.tp_comm_overlap, grad_accum_fusion=self.grad_accum_fusion,
                            grad_fp32=self.grad_fp32)
        costs = on_chains(costs, schedule)
        if self.check_memory:
            check_memory(schedule, costs, self.hardware)
        return costs

    def memory(self, schedule: Schedule, costs: ParallelCosts) -> list[MemoryBreakdown] | None:
        """Each rank's peak memory (model mode; None with --cost, which knows no model state)."""
        if self.cost is not None or self.model is None:
            return None
        return rank_memory(schedule, costs)

    def simulate(self, schedule: Schedule, costs: ParallelCosts) -> SimResult:
        return simulate(schedule, costs, self.hardware, comm=self.comm and self.hardware is not None,
                        dp=self.dp, tp=self.tp, comm_options=self.comm_options)

    def run(self, schedule: Schedule) -> SimResult:
        costs = self.costs(schedule)
        return self.simulate(self.tuned(schedule, costs), costs)

    def evaluate(self, schedule: Schedule) -> tuple[SimResult, list[MemoryBreakdown] | None]:
        """The simulated step and each rank's peak memory (refused first when a rank does not fit)."""
        costs = self.costs(schedule)
        schedule = self.tuned(schedule, costs)
        return self.simulate(schedule, costs), self.memory(schedule, costs)

    def tuned(self, schedule: Schedule, costs: ParallelCosts) -> Schedule:
        """zb-auto and zb-2p ordered for these costs, links and memory limit; other schedules as they are."""
        hw, table = self.hardware, costs.table
        comm = ()
        if self.comm and hw is not None and schedule.name in AUTO_SCHEDULES:
            par = ParallelDims(pp=schedule.num_ranks, dp=self.dp, cp=self.cp, tp=self.tp)
            comm = tuple(hw.p2p_time(par.rank(pp=s), par.rank(pp=s + 1), table.stages[s].boundary_bytes)
                         for s in range(schedule.num_ranks - 1))
        return rebuild(schedule, table, self.memory_limit, comm)
