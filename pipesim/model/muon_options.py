"""Megatron-core's Muon optimizer as a job asks for it (`--optimizer muon | dist_muon`), and what it refuses.

Megatron-core (megatron/core/optimizer/muon.py at NVIDIA/Megatron-LM d7288711ba, the Megatron-LM of Megatron-Bridge
v0.4.0) steps every 2-D weight but the embedding and the output layer with TensorParallelMuon (momentum, then the
Newton-Schulz orthogonalization of NVIDIA-NeMo/Emerging-Optimizers, then the update) and the rest with Adam.
`--optimizer muon` keeps every state on every data-parallel rank; `--optimizer dist_muon` is its
LayerWiseDistributedOptimizer: whole tensors dealt to the data-parallel ranks, each stepping its own, then an
all-gather of the parameters (pipesim.cost.muon_step). What it refuses (megatron/training/arguments.py,
get_megatron_muon_optimizer): the distributed optimizer ("muon with dist optimizer is not supported"), fp16, the
precision-aware optimizer (its TODO), and for `muon` the overlapped gradient reduction and parameter gather ("Use
dist_muon instead"). Its knobs that change no cost pipesim counts (--muon-momentum, --muon-scale-mode,
--muon-extra-scale-factor, --muon-coefficient-type: every coefficient set runs the same three GEMMs a step) are
not carried; those that would (--muon-tp-mode other than blockwise, --muon-fp32-matmul-prec other than medium,
--muon-scalar-optimizer other than adam) are refused where they are read.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.errors import PipesimError

OPTIMIZERS = ("adam", "muon", "dist_muon")  # Megatron-LM's --optimizer choices pipesim models
# the --framework profiles whose stack runs Megatron-core's Muon: it entered at core_v0.16.0 (NVIDIA/Megatron-LM
# 5548cdc57b, 2026-01-14, 'Add muon and layerwise distributed optimizer'); the 2021-22 Megatron-LM, NeMo 2.2.0's,
# torchtitan's and DeepSpeed's profiles predate it or are other stacks
MUON_FRAMEWORKS = ("megatron-core",)
MUON_DEFAULTS = {"ns_steps": 5, "split_qkv": True, "nesterov": False}  # megatron/training/arguments.py


@dataclass(frozen=True)
class MuonOptions:
    """Megatron-core's Muon: `distributed` (dist_muon), its Newton-Schulz steps, QKV split per head group
    (--muon-no-split-qkv turns it off) and Nesterov momentum (--muon-use-nesterov)."""

    distributed: bool = False
    ns_steps: int = MUON_DEFAULTS["ns_steps"]
    split_qkv: bool = MUON_DEFAULTS["split_qkv"]
    nesterov: bool = MUON_DEFAULTS["nesterov"]

    def __post_init__(self) -> None:
        if not isinstance(self.ns_steps, int) or isinstance(self.ns_steps, bool) or self.ns_steps < 1:
            raise PipesimError(f"--muon-num-ns-steps must be a positive integer, got {self.ns_steps!r}")
        for name in ("distributed", "split_qkv", "nesterov"):
            if not isinstance(getattr(self, name), bool):
                raise PipesimError(f"muon {name} must be true or false, got {getattr(self, name)!r}")

    @property
    def name(self) -> str:
        return "dist_muon" if self.distributed else "muon"

    def flags(self) -> list[str]:
        """Megatron-LM's flags for these options (its defaults left out)."""
        out = ["--optimizer", self.name]
        if self.ns_steps != MUON_DEFAULTS["ns_steps"]:
            out += ["--muon-num-ns-steps", str(self.ns_steps)]
        if not self.split_qkv:
            out.append("--muon-no-split-qkv")
        if self.nesterov:
            out.append("--muon-use-nesterov")
        return out


def muon_options(optimizer: str, *, ns_steps: int | None = None, split_qkv: bool = True,
                 nesterov: bool = False) -> MuonOptions | None:
    """The options of `--optimizer` (None for adam); one line for a name pipesim does not model, or Muon's flags
    without Muon."""
    if optimizer not in OPTIMIZERS:
        raise PipesimError(f"--optimizer {optimizer!r} is not modelled; choose {', '.join(OPTIMIZERS)}")
    if optimizer == "adam":
        given = [flag for flag, on in (("--muon-num-ns-steps", ns_steps is not None),
                                       ("--muon-no-split-qkv", not split_qkv),
                                       ("--muon-use-nesterov", nesterov)) if on]
        if given:
            raise PipesimError(f"{', '.join(given)} set Muon's step: give --optimizer muon or dist_muon")
        return None
    return MuonOptions(distributed=optimizer == "dist_muon",
                       ns_steps=MUON_DEFAULTS["ns_steps"] if ns_steps is None else ns_steps,
                       split_qkv=split_qkv, nesterov=nesterov)


def check_muon_framework(muon: MuonOptions | None, framework: str | None) -> None:
    """One line where --framework names a stack that does not run Megatron-core's Muon (None: no profile)."""
    if muon is not None and framework is not None and framework not in MUON_FRAMEWORKS:
        raise PipesimError(f"--optimizer {muon.name} is Megatron-core's Muon (core_v0.16.0 on); --framework "
                           f"{framework} does not run it: give --framework {' or '.join(MUON_FRAMEWORKS)}, or none")


def check_muon(muon: MuonOptions | None, *, zero: int, overlap_grad_reduce: bool, overlap_param_gather: bool,
               precision_aware: bool, fp8_param_gather: bool) -> None:
    """Megatron-core's refusals of a Muon job, in one line each."""
    if muon is None:
        return
    if not isinstance(muon, MuonOptions):
        raise PipesimError(f"a job's muon must be MuonOptions or None, got {type(muon).__name__}")
    if zero:
        raise PipesimError(f"--optimizer {muon.name} with --zero {zero}: Megatron-core's Muon does not run under the "
                           "distributed optimizer or FSDP (dist_muon shards its own state)")
    if precision_aware:
        raise PipesimError(f"--optimizer {muon.name} with --use-precision-aware-optimizer is not supported by "
                           "Megatron-core")
    if fp8_param_gather:
        raise PipesimError(f"--optimizer {muon.name} with --fp8-param-gather: the FP8 parameter gather is the "
                           "distributed optimizer's")
    if not muon.distributed and (overlap_grad_reduce or overlap_param_gather):
        raise PipesimError("--optimizer muon does not overlap the gradient reduction or the parameter gather "
                           "(Megatron-core: 'Use dist_muon instead')")


__all__ = ["MUON_DEFAULTS", "MUON_FRAMEWORKS", "OPTIMIZERS", "MuonOptions", "check_muon", "check_muon_framework",
           "muon_options"]
