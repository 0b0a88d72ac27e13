"""What the executor runs of a mixture-of-experts model and its expert layout, checked before any process starts.

Torch-free (read by `pipesim run` before torchrun starts, as the rest of executor.run_config). The executor
trains pipesim's GPT block with MoE MLPs (executor.experts) over ep ranks laid out by pipesim.parallel_dims,
composed with pp and dp; the rest is refused in one line each rather than run as something else.
"""

from __future__ import annotations

from pipesim.errors import PipesimError
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.model.executor_scope import unrun_expert_layout


def check_experts(model: ModelConfig, job: Job, *, factory: str | None = None) -> None:
    """PipesimError (one line) for a mixture-of-experts run the executor cannot train as asked: pp, dp, ep and, with
    sequence parallelism, tp (attention split over tp, whole experts: etp 1) are run."""
    dims, moe = job.dims, model.moe
    if factory is not None and dims.ep > 1 and dims.etp in (None, 1) and moe is None:
        return  # the factory's MoE layers are checked once it is called (executor.user_model.check_run)
    if moe is None:
        if dims.has_experts:
            flags = " ".join(f for f, on in ((f"--ep {dims.ep}", dims.ep > 1), (f"--etp {dims.etp}",
                                                                                dims.etp is not None)) if on)
            raise PipesimError(f"{flags} shards a mixture-of-experts model's experts; this model has none "
                               "(--model moe)")
        return
    if factory is not None:
        raise PipesimError(f"--model {factory} defines its own layers; experts come with --model moe")
    if moe.experts % dims.ep:
        raise PipesimError(f"--ep {dims.ep} does not divide the {moe.experts} experts (--num-experts): each "
                           "expert-parallel rank holds experts / ep of them")
    if dims.tp > 1 and not (job.sp and dims.etp == 1):
        raise PipesimError(f"--model moe with --tp {dims.tp} needs --sequence-parallel (each tp rank routes its own "
                           "tokens, as Megatron-core requires) and --etp 1 (whole experts on each rank; experts split "
                           "over tp are not run)")
    unrun = unrun_expert_layout(moe, expert_tp=dims.expert_tp)
    if unrun:
        raise PipesimError(f"the executor's mixture-of-experts model runs with pp, dp, ep and tp; it does not run "
                           f"{'; '.join(unrun)}")


__all__ = ["check_experts"]
