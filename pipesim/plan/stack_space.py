"""What each training stack can run, as `pipesim plan --framework NAME` searches it.

A plan for a stack is only worth having if the stack can run it: torchtitan has no ZeRO 1 and no Megatron-style
selective recomputation, DeepSpeed's pipeline engine refuses ZeRO 2 and 3 and runs one schedule, Megatron-LM runs
neither zero-bubble schedules nor DualPipe. So each profile of pipesim.frameworks has a space here: the schedules,
ZeRO stages, recomputations, sequence-parallel choices and context-parallel exchanges it offers, each read from the
repository and version named beside it. The planner searches the space by default; a choice typed outside it is
refused in one line (an export could not say how to run it). Without --framework the planner searches pipesim's
own (every schedule the executor runs). docs/frameworks.md lists the spaces in prose.
"""

from __future__ import annotations

from dataclasses import dataclass

import schedules
from pipesim.errors import PipesimError
from pipesim.model.op_recompute import OP

# torchtitan's (model.name, model.flavor) -> the bundled config of the same shapes (pytorch/torchtitan v0.2.2
# torchtitan/models/*/__init__.py: llama3's 8B, 70B and 405B are Llama 3.1's; rope scaling changes no cost)
TORCHTITAN_FLAVORS = {("llama3", "8B"): "llama3.1-8b", ("llama3", "70B"): "llama3.1-70b",
                      ("llama3", "405B"): "llama3-405b", ("qwen3", "30B-A3B"): "qwen3-30b-a3b",
                      ("qwen3", "235B-A22B"): "qwen3-235b-a22b"}
# pipesim name -> torch.distributed.pipelining / torchtitan `pipeline_parallel_schedule`
TORCH_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B",
                   "looped-bfs": "LoopedBFS", "interleaved-zb": "InterleavedZeroBubble", "zb-v": "ZBVZeroBubble",
                   "dualpipev": "DualPipeV"}
# what Megatron-LM runs (with --num-layers-per-virtual-...; combined-1f1b with --overlap-moe-expert-parallel-comm)
MEGATRON_SCHEDULES = ("1f1b", "interleaved-1f1b", "combined-1f1b")
# schedules torch's runtime cannot take as a CSV: DualPipe runs two replicas of the model on every rank (their
# gradients summed), and combined-1f1b is Megatron-core's overlap of one chunk's all-to-all with another's compute
NOT_AS_CSV = ("dualpipe", "combined-1f1b")

_TITAN = "pytorch/torchtitan v0.2.2"
_MCORE = "NVIDIA/Megatron-LM core_v0.15.3"
_MLM21 = "NVIDIA/Megatron-LM @ 46c74b4"


def _on_off(values: tuple[bool, ...]) -> str:
    """Sequence-parallel choices as the flag spells them: on, off."""
    return ", ".join("on" if v else "off" for v in values)


@dataclass(frozen=True)
class StackSpace:
    """The choices a stack offers for what the planner searches (pipesim names), and where each was read."""

    schedules: tuple[str, ...] | None  # pipeline schedules (a single stage runs as 1f1b); None: all but `not_run`
    zeros: tuple[int, ...]  # ZeRO stages with dp > 1
    recomputes: tuple[str, ...]  # --recompute choices
    sequence_parallel: tuple[bool, ...]  # with tp > 1
    cp_comm_types: tuple[str, ...]  # context parallelism's exchanges; () none (cp 1 only)
    sources: str
    origin: str  # the repository and version, as a refusal names it (docs/frameworks.md has `sources`)
    not_run: tuple[str, ...] = ()  # with schedules None: the registered ones the stack cannot run

    @property
    def schedule_names(self) -> tuple[str, ...]:
        """The schedules it runs (a schedule module added to schedules/ joins a stack that takes any order)."""
        if self.schedules is not None:
            return self.schedules
        return tuple(n for n in schedules.names() if n not in self.not_run)

    def refusal(self, framework: str, *, schedule_names: tuple[str, ...], zeros: tuple[int, ...],
                recomputes: tuple[str, ...], sequence_parallel: tuple[bool, ...], cps: tuple[int, ...],
                cp_comm: str) -> str | None:
        """The first choice typed for a plan that `framework` cannot run, as one line; None when all can run."""
        def line(what: str, offered: str) -> str:
            return f"--framework {framework} has no {what} (it offers {offered}: {self.origin}, docs/frameworks.md)"

        for name in schedule_names:
            if name not in self.schedule_names:
                return line(f"{name} schedule", self.schedules_text())
        for z in zeros:
            if z not in self.zeros:
                return line(f"ZeRO {z}", "ZeRO " + ", ".join(map(str, self.zeros)))
        for rc in recomputes:
            if rc not in self.recomputes:
                return line(f"--recompute {rc}", "--recompute " + ", ".join(self.recomputes))
        for sp in sequence_parallel:
            if sp not in self.sequence_parallel:
                return line(f"--sequence-parallel {_on_off((sp,))}",
                            f"sequence parallelism {_on_off(self.sequence_parallel)} with tp > 1")
        if any(cp > 1 for cp in cps):
            if not self.cp_comm_types:
                return line("context parallelism", "--cp 1 only")
            if cp_comm not in self.cp_comm_types:
                return line(f"--cp-comm-type {cp_comm}", "--cp-comm-type " + ", ".join(self.cp_comm_types))
        return None

    def schedules_text(self) -> str:
        if self.schedules is None:
            return f"every registered one but {', '.join(self.not_run)}"
        return ", ".join(self.schedules)

    def summary(self) -> str:
        """The space in one line, as docs/frameworks.md lists it (pipesim's names)."""
        return (f"schedules {self.schedules_text()}; ZeRO {', '.join(map(str, self.zeros))}; --recompute "
                f"{', '.join(self.recomputes)}; sequence parallelism {_on_off(self.sequence_parallel)}; "
                + (f"--cp-comm-type {', '.join(self.cp_comm_types)}" if self.cp_comm_types else "no --cp"))


_MEGATRON_CORE = StackSpace(
    schedules=MEGATRON_SCHEDULES, zeros=(0, 1), recomputes=("none", "selective", "full"),
    sequence_parallel=(True, False), cp_comm_types=("p2p", "all_gather", "a2a"),
    sources=f"{_MCORE} megatron/core/pipeline_parallel/schedules.py (no pipelining, 1F1B, interleaved 1F1B; "
            "combined 1F1B with --overlap-moe-expert-parallel-comm), --use-distributed-optimizer (ZeRO 1; "
            "megatron/training/arguments.py refuses --use-torch-fsdp2 with pipelining, expert parallelism or the "
            "distributed optimizer), --recompute-granularity selective|full, --cp-comm-type p2p|all_gather|a2a",
    origin=_MCORE)

SPACES: dict[str, StackSpace] = {
    "megatron-lm-2021": StackSpace(
        schedules=("1f1b", "interleaved-1f1b"), zeros=(0,), recomputes=("none", "full"),
        sequence_parallel=(False,), cp_comm_types=(),
        sources=f"{_MLM21} megatron/schedules.py (1F1B, interleaved 1F1B), megatron/arguments.py "
                "(--checkpoint-activations only; no distributed optimizer, sequence or context parallelism)",
        origin=_MLM21),
    "megatron-lm-2022": StackSpace(
        schedules=("1f1b", "interleaved-1f1b"), zeros=(0, 1), recomputes=("none", "selective", "full"),
        sequence_parallel=(True, False), cp_comm_types=(),
        sources="NVIDIA/Megatron-LM of 2022: --sequence-parallel and --recompute-granularity selective (merged "
                "cfd2e21607 and bbab79f869, 2022-04/05), --use-distributed-optimizer (merged d07d29df14, "
                "2022-06-08); no context parallelism",
        origin="NVIDIA/Megatron-LM of 2022"),
    "megatron-core": _MEGATRON_CORE,
    "nemo": _MEGATRON_CORE,
    "torchtitan": StackSpace(
        schedules=None, not_run=NOT_AS_CSV, zeros=(0, 3), recomputes=("none", OP, "full"),
        sequence_parallel=(True,), cp_comm_types=("all_gather", "p2p"),
        sources=f"{_TITAN} torchtitan/config/job_config.py: pipeline_parallel_schedule (torch's, or any order as "
                "pipeline_parallel_schedule_csv, except DualPipe's two model replicas and Megatron's combined "
                "1F1B), data_parallel_replicate_degree (DDP) and data_parallel_shard_degree (FSDP2), "
                "activation_checkpoint mode none|full|selective with selective_ac_option 'op', "
                "context_parallel_rotate_method allgather|alltoall; torchtitan/models/llama3/infra/parallelize.py "
                "shards the norms over the sequence under tp (SequenceParallel)",
        origin=_TITAN),
    "deepspeed": StackSpace(
        schedules=("deepspeed-1f1b",), zeros=(0, 1), recomputes=("none", "full"),
        sequence_parallel=(False,), cp_comm_types=(),
        sources="microsoft/DeepSpeed deepspeed/runtime/pipe/engine.py (its TrainSchedule; PipelineEngine asserts "
                "'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism'), bigscience-workshop/"
                "Megatron-DeepSpeed @ 119a0d2 (--checkpoint-activations; the 2021 layers without sequence "
                "parallelism)",
        origin="microsoft/DeepSpeed's pipeline engine"),
}

# what `pipesim plan` searches without --framework: pipesim's own executor's choices
ZEROS = (0, 1)
RECOMPUTES = ("none", "selective", "full")


def stack_space(framework: str | None) -> StackSpace | None:
    """The space of `framework` (None without one); one line for a name without a space."""
    if framework is None:
        return None
    if framework not in SPACES:
        raise PipesimError(f"--framework {framework!r}: the planner knows {', '.join(SPACES)}")
    return SPACES[framework]


__all__ = ["MEGATRON_SCHEDULES", "NOT_AS_CSV", "RECOMPUTES", "SPACES", "TORCHTITAN_FLAVORS", "TORCH_SCHEDULES",
           "StackSpace", "ZEROS", "stack_space"]
