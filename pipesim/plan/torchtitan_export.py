"""The plan's winner as torchtitan's job config (v0.2.x job_config.py names): its parallel layout, training batch,
activation checkpointing, compile and float8 sections, a comment where torchtitan has no counterpart of what pipesim
timed."""

from __future__ import annotations

import json

from pipesim.model.fp8 import FP4_RECIPES, TORCHAO_RECIPES
from pipesim.model.op_recompute import OP
from pipesim.model.pipeline_split import torchtitan_fqns
from pipesim.plan.space import Candidate, PlanRequest
from pipesim.plan.stack_space import TORCH_SCHEDULES, TORCHTITAN_FLAVORS

# pipesim's --cp-comm-type -> torchtitan's context_parallel_rotate_method (torch's rotaters: all-gather the K/V
# shards once, or pass them round the ring by all-to-all); Ulysses' head all-to-all (a2a) has none there
TORCH_ROTATE = {"all_gather": "allgather", "p2p": "alltoall"}


def torchtitan_toml(c: Candidate, req: PlanRequest, config: str | None = None) -> str:
    """[parallelism], [training] and [activation_checkpoint] of torchtitan's job config for `c`; [model] too when
    the plan's model is bundled config `config` unchanged and torchtitan has it as a flavor."""
    m = req.model
    flavor = next((key for key, name in TORCHTITAN_FLAVORS.items() if name == config), None)
    shard = c.dp if c.zero else 1
    replicate = 1 if c.zero else c.dp
    lines = [] if flavor is None else ["[model]", f'name = "{flavor[0]}"', f'flavor = "{flavor[1]}"', ""]
    if m.hybrid is not None or m.linear_attention is not None:  # pipesim.model.hybrid, linear_attention
        what = "hybrid (Mamba)" if m.hybrid is not None else "linear-attention (Gated DeltaNet)"
        lines += [f"# torchtitan has no {what} model: the layout below is the plan's, not a model torchtitan builds",
                  ""]
    lines += ["[parallelism]",
              f"data_parallel_replicate_degree = {replicate}",
              f"data_parallel_shard_degree = {shard}"]
    if c.zero in (1, 2):
        lines.append('fsdp_reshard_after_forward = "never"  # ZeRO-2-like: parameters stay gathered')
    elif c.zero == 3:  # the policy the simulation ran (pipesim.model.fsdp)
        lines.append(f'fsdp_reshard_after_forward = "{req.job.fsdp_reshard}"')
    job = c.job(req.job)
    if job.kernels.ub is not None and job.kernels.ub.async_tp:  # torch's micro-pipelined TP (needs compile)
        lines.append("enable_async_tensor_parallel = true")
    lines += [f"tensor_parallel_degree = {c.tp}",
              f"context_parallel_degree = {c.cp}",
              f"pipeline_parallel_degree = {c.p}"]
    if c.cp > 1:
        rotate = TORCH_ROTATE.get(req.job.cp_comm)
        lines.append(f'context_parallel_rotate_method = "{rotate}"' if rotate else
                     f"# --cp-comm-type {req.job.cp_comm} has no torchtitan rotate method (allgather or alltoall)")
    if req.model.moe is not None:  # torchtitan's MoE parallelism (its expert TP is 1 or tp)
        lines += [f"expert_parallel_degree = {c.ep}",
                  f"expert_tensor_parallel_degree = {c.etp or c.tp}"]
    vflag = f" -v {c.v}" if c.v > 1 else ""
    if c.schedule in TORCH_SCHEDULES:
        lines.append(f'pipeline_parallel_schedule = "{TORCH_SCHEDULES[c.schedule]}"')
    else:
        lines.append(f'pipeline_parallel_schedule_csv = "{c.schedule}.csv"  # no built-in torch schedule: '
                     f'`pipesim schedule {c.schedule} -p {c.p} -m {c.m}{vflag} --format csv`')
    lines.append(f"pipeline_parallel_microbatch_size = {c.mbs}")
    if c.p > 1:  # the stages pipesim simulated, module by module: torchtitan builds its stages from this list
        lines.append(f"module_fqns_per_model_part = {json.dumps(torchtitan_fqns(req.stage_split(c.chunks)))}")
    # torchtitan accumulates global / (local x dp) forwards (torchtitan/train.py); a pipeline splits each local
    # batch into microbatches: without one, pipesim's m microbatches are its accumulation steps
    local = c.mbs if c.p == 1 else m.batch // c.dp
    lines += ["", "[training]", f"local_batch_size = {local}", f"global_batch_size = {m.batch}",
              f"seq_len = {m.seq}", "", "[activation_checkpoint]",
              f'mode = "{"selective" if c.recompute == OP else c.recompute}"']
    if c.recompute == OP:  # torchtitan's per-op policy, as simulated (pipesim.model.op_recompute)
        lines.append('selective_ac_option = "op"')
    elif c.recompute == "selective":  # the nearest: Megatron's attention-core recompute has no torchtitan option
        lines.append('selective_ac_option = "op"  # torchtitan\'s own policy, pipesim\'s --recompute op')
        if c.modules:
            lines.append(f"# Megatron-core's --recompute-modules {' '.join(c.modules)} has no torchtitan option: "
                         "its op-level selective checkpointing decides what it saves")
    if job.kernels.fusion:  # pipesim timed fused elementwise kernels: torchtitan gets them from torch.compile
        lines += ["", "[compile]", "enable = true  # pipesim timed fused elementwise kernels (torch.compile's)"]
    if job.kernels.eager_rmsnorm:
        lines.append("# --eager-rmsnorm: the norm as eager PyTorch's ops (torchtitan before torch.nn.RMSNorm's "
                     "fused kernel, torch < 2.9)")
    if req.job.kernels.grad_fp32 is False:  # [training] above; torchtitan's default reduces in float32
        lines.insert(lines.index("[activation_checkpoint]") - 1, 'mixed_precision_reduce = "bfloat16"')
    if req.job.fp8 is not None:
        bf16 = req.job.bf16_layers.indices(req.model.layers) if req.job.bf16_layers is not None else ()
        fp8 = torchtitan_fp8(req.job.fp8.recipe, bf16)
        if flavor is not None:  # one [model] table: its converters join the name and the flavor
            at = fp8.index("[model]")
            lines.insert(3, fp8[at + 1])
            del fp8[at:at + 3]
        lines += ["", *fp8]
    return "\n".join(lines) + "\n"


def torchtitan_fp8(recipe: str, bf16_layers: tuple[int, ...] = ()) -> list[str]:
    """torchtitan's (v0.2.x job_config.py) float8 sections for an --fp8-recipe: torchao's per-tensor dynamic scaling
    is "tensorwise" (current scaling) and its per-row one "rowwise"; it has no delayed scaling and no 1 x 128 block
    recipe, which a comment says; mxfp8 is its MX converter. The output head stays bf16 there too (filter_fqns), and
    so do the layers `bf16_layers` names (--first-last-layers-bf16): filter_fqns matches a module's name by substring
    (torchtitan/components/quantization/utils.py module_filter_fn), and "layers.3." names layer 3's linears alone."""
    fqns = ", ".join(f'"{name}"' for name in ["output", *(f"layers.{k}." for k in bf16_layers)])
    if recipe == "mxfp8":
        return ["[model]", 'converters = ["quantize.linear.mx"]', "", "[quantize.linear.mx]",
                'recipe_name = "mxfp8_cublas"', f"filter_fqns = [{fqns}]"]
    own = recipe if recipe in TORCHAO_RECIPES else "tensorwise"  # mxfp8 returned above
    lines = ["[model]", 'converters = ["quantize.linear.float8"]', "", "[quantize.linear.float8]",
             f'recipe_name = "{own}"', f"filter_fqns = [{fqns}]"]
    if recipe in FP4_RECIPES:
        lines.insert(0, f"# pipesim timed Transformer Engine's {recipe} linears, not torchao's: float8 tensorwise is "
                        "the converter this export names")
    elif recipe != own:
        lines.insert(0, f"# torchao has no {recipe} scaling: tensorwise (current scaling) is the nearest recipe")
    return lines


__all__ = ["TORCH_ROTATE", "torchtitan_fp8", "torchtitan_toml"]
