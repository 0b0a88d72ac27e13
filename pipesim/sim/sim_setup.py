"""What to simulate a schedule against: hardware, a model or hand-given costs, the job (dp/tp/cp, the
transformer's options, ZeRO, the framework's communication and kernel switches: pipesim.job), links on/off.

One object turns a model or hand-given costs into a simulation, so `pipesim simulate` and
`pipesim sweep` (their flags: pipesim.commands.setup_args), the planner and the calibration agree on
defaults: a model is costed on `dgx-h100` unless told otherwise; `--cost` alone means abstract seconds
with no links, like the closed forms; the attention kernel is decided once, here (`Job.resolve_attention`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipesim.comm.comm_options import CommOptions
from pipesim.cost.chain_costs import on_chains
from pipesim.cost.model_costs import ParallelCosts, model_costs, uniform_costs
from pipesim.cost.rank_memory import check_memory, rank_memory
from pipesim.cost.user_model_costs import UserModel, user_model_costs
from pipesim.cost.v_search import V_SEARCHED, rebuild_v
from pipesim.cost.zb_auto_costs import AUTO_SCHEDULES, MemoryLimit, rebuild
from pipesim.errors import PipesimError
from pipesim.hardware.machine import Hardware
from pipesim.ir.schedule import Schedule
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.model.memory import MemoryBreakdown
from pipesim.model.options import ACT_FP8_STORE_FLAG
from pipesim.model.pipeline_split import BalancedSplit, SplitRule, schedule_split
from pipesim.sim.perturb import Perturbation
from pipesim.sim.result import SimResult
from pipesim.sim.simulator import check_devices, simulate

DEFAULT_HARDWARE = "dgx-h100"


def on_gpus(hardware: Hardware | None) -> bool:
    """GPU hardware: a device preset without a [host] profile (the attention default depends on it)."""
    return hardware is not None and hardware.host is None


@dataclass(frozen=True)
class SimSetup:
    """Everything but the schedule; `run(schedule)` gives a SimResult. The job's attention kernel is decided on
    construction (flash on GPU hardware at 16 bits, eager on CPUs and in float32); its pp is each schedule's."""

    hardware: Hardware | None = None  # None: cost mode without links
    model: ModelConfig | None = None  # costed with pipesim.cost.model_costs when given
    cost: dict[str, float] | None = None  # parse_cost_spec output (seconds of F, I, W) when given
    boundary_bytes: int = 0  # bytes per P2P message in cost mode
    activation_bytes: int = 0  # bytes stashed per in-flight microbatch in cost mode
    comm: bool = True  # model links (False: transfers take no time)
    job: Job = Job()  # layout (its pp: the schedule's), transformer options, ZeRO, comm and kernel switches
    check_memory: bool = True  # refuse a model that does not fit device memory
    layer_split: tuple[int, ...] | None = None  # layers per stage (uneven splits); None: `split_rule`'s
    split_rule: SplitRule | BalancedSplit = SplitRule()  # a stack's split, or the plan's balance; unset: even
    memory_limit: MemoryLimit | None = None  # zb-auto / zb-2p / zb-v: per-rank activation limit (None: default)
    user_model: UserModel | None = None  # --model MODULE:FACTORY, counted per layer (pipesim.cost.user_model_costs)
    ilp_time_limit: float | None = None  # seconds: zb-auto / zb-2p / zb-v also searched by the ILP (None: not)
    perturb: Perturbation | None = None  # a what-if applied to every simulation (pipesim.sim.perturb)

    def __post_init__(self) -> None:
        if not isinstance(self.job, Job):
            raise PipesimError(f"a setup's job must be a pipesim.job.Job, got {type(self.job).__name__}")
        # the one place the attention default is applied (a frozen field set once, before anyone reads it)
        object.__setattr__(self, "job", self.job.resolve_attention(on_gpus(self.hardware), self.model))

    def microbatches(self, microbatches: int | None, microbatch_size: int | None, *,
                     default_batch: bool = False) -> int:
        """m from --microbatches or --microbatch-size (m = batch / (dp x mbs)); 8 when neither is given.
        `default_batch`: --batch was not typed (ModelConfig.microbatches_for says so where it does not split)."""
        if microbatch_size is None and microbatches is None:
            return 8
        if self.model is None or self.cost is not None:
            if microbatch_size is not None:
                raise PipesimError("--microbatch-size needs a model (--model), not --cost; give --microbatches")
            return microbatches
        return self.model.microbatches_for(self.job.dims.dp, microbatches=microbatches, microbatch_size=microbatch_size,
                                           default_batch=default_batch)

    def options(self) -> dict:
        """The features in effect, as --json reports them (one vocabulary with the flags)."""
        job, model = self.job, self.model is not None and self.cost is None
        return {"recompute": job.recompute, "sequence_parallel": job.sp,
                "attention": job.attention if model else None, "cp": job.dims.cp, "zero": job.zero,
                "nodes": self.hardware.num_nodes if self.hardware is not None else None,
                **({"recompute_modules": list(job.recompute_modules)} if job.recompute_modules else {}),
                **({"fsdp_reshard_after_forward": job.fsdp_reshard} if job.zero == 3 else {}),
                **({"optimizer": job.muon.name} if job.muon is not None else {}),
                # the linears' precision and the graphs, in their flags' names (set ones only)
                **(job.fp8.report() if job.fp8 is not None else {}),
                **({job.param_gather_flag.removeprefix("--").replace("-", "_"): True} if job.fp8_param_gather else {}),
                **({ACT_FP8_STORE_FLAG.removeprefix("--").replace("-", "_"): True} if job.act_fp8_store else {}),
                **(job.bf16_layers.report() if job.bf16_layers is not None else {}),
                **({"cuda_graph_impl": job.kernels.cuda_graphs.impl,
                    "cuda_graph_scope": list(job.kernels.cuda_graphs.scope)} if job.kernels.cuda_graphs else {}),
                **self.split_rule.report(),
                **(job.comm.report() if job.comm != CommOptions() else {})}  # set ones only

    def costs(self, schedule: Schedule) -> ParallelCosts:
        """The costs of `schedule` (cost mode or model mode) for the job on its ranks; PipesimError if it does
        not fit."""
        job = self.job.with_pp(schedule.num_ranks)
        check_devices(job.dims, self.hardware)
        if job.comm.moe_shared_expert_overlap and schedule.overlaps:  # transformer_config.py asserts it
            raise PipesimError(f"--moe-shared-expert-overlap with {schedule.name}, whose overlapped forward and "
                               "backward pairs hide the all-to-alls: Megatron-core refuses it beside "
                               "--overlap-moe-expert-parallel-comm")
        n = schedule.model_stages  # layer chunks; DualPipe's two chains run each twice (pipesim.cost.chain_costs)
        if self.cost is not None:
            if job.dims.dp > 1 or job.dims.tp > 1 or job.dims.cp > 1:
                raise PipesimError("--dp/--tp/--cp need a model (--model), not --cost")
            if job.recompute != "none" or job.sp or job.zero:
                raise PipesimError("--recompute/--sequence-parallel/--zero need a model (--model), not --cost")
            if "FB" in self.cost and not schedule.overlaps:
                raise PipesimError(f"--cost FB= times overlapped forward + backward pairs; {schedule.name} has none "
                                   "(dualpipev, combined-1f1b and the DualPipe family do)")
            # --cost is one rank's share of the model; with v chunks per rank each chunk takes 1/v of it
            share = schedule.num_ranks / n
            costs = uniform_costs(n, {k: t * share for k, t in self.cost.items()}, boundary_bytes=self.boundary_bytes,
                                  job=job)
            if self.activation_bytes:
                table = replace(costs.table, stages=tuple(replace(c, activation_bytes=self.activation_bytes)
                                                          for c in costs.table.stages))
                costs = replace(costs, table=table)
            return on_chains(costs, schedule)
        split = list(self.layer_split) if self.layer_split else None
        if split is None and self.split_rule and self.model is not None:
            split = schedule_split(self.split_rule, self.model, schedule)
        if self.user_model is not None and self.hardware is not None:
            return on_chains(user_model_costs(self.user_model, n, self.hardware, job, layer_split=split), schedule)
        if self.model is None or self.hardware is None:
            raise PipesimError("give --cost F=<s>,B=<s>, or a --model with --hardware")
        costs = on_chains(model_costs(self.model, n, schedule.num_microbatches, self.hardware, job,
                                      layer_split=split), schedule)
        if self.check_memory:
            check_memory(schedule, costs, self.hardware)
        return costs

    def memory(self, schedule: Schedule, costs: ParallelCosts) -> list[MemoryBreakdown] | None:
        """Each rank's peak memory (model mode; None with --cost, which knows no model state)."""
        if self.cost is not None or self.model is None:
            return None
        return rank_memory(schedule, costs)

    def simulate(self, schedule: Schedule, costs: ParallelCosts) -> SimResult:
        """`schedule` simulated on these costs (their job says dp, tp, cp and the comm options)."""
        return simulate(schedule, costs, self.hardware, comm=self.comm and self.hardware is not None,
                        perturb=self.perturb)

    def run(self, schedule: Schedule) -> SimResult:
        costs = self.costs(schedule)
        return self.simulate(self.tuned(schedule, costs), costs)

    def evaluate(self, schedule: Schedule) -> tuple[SimResult, list[MemoryBreakdown] | None]:
        """The simulated step and each rank's peak memory (refused first when a rank does not fit)."""
        costs = self.costs(schedule)
        schedule = self.tuned(schedule, costs)
        return self.simulate(schedule, costs), self.memory(schedule, costs)

    def tuned(self, schedule: Schedule, costs: ParallelCosts) -> Schedule:
        """zb-auto and zb-2p ordered for these costs, links and memory limit (and the ILP with `ilp_time_limit`);
        zb-v too when a limit or the ILP is asked for (pipesim.cost.v_search); other schedules as they are."""
        hw, table = self.hardware, costs.table
        searched_v = schedule.name in V_SEARCHED
        comm = ()
        if self.comm and hw is not None and (schedule.name in AUTO_SCHEDULES or searched_v):
            par = costs.job.with_pp(schedule.num_ranks).dims
            ranks = [schedule.rank_of(s) for s in range(schedule.num_stages)]
            comm = tuple(0.0 if ranks[s] == ranks[s + 1] else
                         hw.p2p_time(par.rank(pp=ranks[s]), par.rank(pp=ranks[s + 1]), table.stages[s].boundary_bytes)
                         for s in range(schedule.num_stages - 1))
        if searched_v:
            searched = rebuild_v(schedule, table, self.memory_limit, comm, self.ilp_time_limit)
        else:
            searched = rebuild(schedule, table, self.memory_limit, comm, self.ilp_time_limit)
        if searched is schedule or searched.programs == schedule.programs:
            return searched
        # the search times orders with plain seconds and hops; the simulator also knows link contention and a
        # CPU's shared cores: under the default limit (the registry's order keeps it: 1x or 2x 1F1B's microbatches
        # per rank) the searched order is kept unless the registry's simulates strictly faster
        if self.memory_limit is None and (self.simulate(schedule, costs).makespan
                                          < self.simulate(searched, costs).makespan):
            return schedule
        return searched
