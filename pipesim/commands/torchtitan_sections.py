"""The sections of a torchtitan job config that become pipesim flags one for one: activation checkpointing,
torch.compile and torchao's float8 / MX linears (pytorch/torchtitan v0.2.2 torchtitan/config/job_config.py), and
the key reader that refuses what it does not know (pipesim.commands.torchtitan_import reads the rest)."""

from __future__ import annotations

from pipesim.errors import PipesimError

# keys read past in the sections read: data, logging, numerics that cost nothing pipesim times
PASSED = {"model": ("hf_assets_path", "tokenizer_path", "print_after_conversion"),
          "training": ("dataset", "dataset_path", "max_norm", "steps", "gc_freq", "gc_debug", "dataloader"),
          "activation_checkpoint": ("preserve_rng_state", "determinism_check", "debug", "early_stop",
                                    "per_op_sac_force_recompute_mm_shapes_by_fqns"),
          "debug": ("seed", "deterministic", "deterministic_warn_only", "moe_force_load_balance"),
          "parallelism": ("pipeline_parallel_expert_parallel_overlap",)}
FLOAT8 = ("float8", "quantize.linear.float8")  # the converter's name before and after torchtitan's quantize.* keys
MX = ("mx", "quantize.linear.mx")


class Keys:
    """One section's keys, each taken once; what is left over at the end is a key pipesim does not know."""

    def __init__(self, data: dict, section: str, where: str):
        table = data.get(section, {})
        if not isinstance(table, dict):
            raise PipesimError(f"{where}: [{section}] must be a table")
        self.left, self.section, self.where = dict(table), section, where
        for key in PASSED.get(section, ()):
            self.left.pop(key, None)

    def take(self, key: str, default, kind: type | tuple[type, ...]):
        value = self.left.pop(key, default)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool) and kind is not bool):
            raise PipesimError(f"{self.where}: {self.section}.{key} = {value!r} is not a {_kind(kind)}")
        return value

    def refuse(self, key: str, default, why: str) -> None:
        """A key pipesim does not model: its default passes, any other value is refused."""
        value = self.left.pop(key, default)
        if value != default:
            raise PipesimError(f"{self.where}: {self.section}.{key} = {value!r}: {why}")

    def done(self) -> None:
        if self.left:
            key = next(iter(self.left))
            raise PipesimError(f"{self.where}: unknown key {self.section}.{key} (torchtitan v0.2.2's job_config.py "
                               "has none such, or pipesim does not read it)")


def _kind(kind) -> str:
    names = {int: "integer", str: "string", bool: "boolean", list: "list", float: "number"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def recompute_flags(data: dict, where: str) -> list[str]:
    ac = Keys(data, "activation_checkpoint", where)
    mode, option = ac.take("mode", "selective", str), ac.take("selective_ac_option", "2", str)
    ac.refuse("memory_budget", 0.5, "the memory-budget policy is not modelled")
    ac.refuse("visualize_memory_budget_pareto", False, "the memory-budget policy is not modelled")
    ac.done()
    if mode == "none":
        return ["--recompute", "none"]
    if mode == "full" or mode == "selective" and option == "1":  # every layer checkpointed
        return ["--recompute", "full"]
    if mode == "selective" and option == "op":
        return ["--recompute", "op"]
    if mode == "selective":
        raise PipesimError(f"{where}: activation_checkpoint.selective_ac_option = {option!r} (one layer in every "
                           f"{option} checkpointed) is not modelled: op, or 1 (every layer)")
    raise PipesimError(f"{where}: activation_checkpoint.mode = {mode!r}: none, full or selective")


def compile_flags(data: dict, where: str) -> list[str]:
    keys = Keys(data, "compile", where)
    enable = keys.take("enable", False, bool)
    components = keys.take("components", ["model", "loss"], list)
    keys.refuse("backend", "inductor", "pipesim times inductor's fused kernels")
    keys.done()
    return ["--compile"] if enable and "model" in components else []  # the model's elementwise kernels fused


def quantize_flags(data: dict, converters: list, where: str) -> list[str]:
    """[model] converters and [quantize.linear.float8 | mx] -> --fp8-format/--fp8-recipe (torchao's)."""
    table = data.get("quantize", {})
    if not isinstance(table, dict) or not all(isinstance(table.get(k, {}), dict) for k in ("linear", "grouped_mm")):
        raise PipesimError(f"{where}: [quantize] must hold tables")
    extra = sorted(set(table) - {"linear", "grouped_mm"}) or sorted(set(table.get("linear", {})) - {"float8", "mx"})
    if extra:
        raise PipesimError(f"{where}: unknown section quantize.{extra[0]}")
    if any(table.get("grouped_mm", {}).values()) or any(c.startswith("quantize.grouped_mm") for c in converters):
        raise PipesimError(f"{where}: quantized grouped GEMMs (quantize.grouped_mm) are not modelled")
    linear = table.get("linear", {})
    fp8 = Keys(linear, "float8", where + " [quantize.linear]")
    recipe = fp8.take("recipe_name", None, str)
    gather = fp8.take("enable_fsdp_float8_all_gather", False, bool)
    fp8.take("precompute_float8_dynamic_scale_for_fsdp", False, bool)  # one amax pass a step: not counted
    fqns8 = fp8.take("filter_fqns", [], list)
    fp8.refuse("emulate", False, "emulated float8 is not timed")
    fp8.done()
    mx = Keys(linear, "mx", where + " [quantize.linear]")
    mx_recipe = mx.take("recipe_name", "mxfp8_cublas", str)
    fqns_mx = mx.take("filter_fqns", ["output"], list)
    mx.left.pop("mxfp8_dim1_cast_kernel_choice", None)  # a cast kernel's implementation: the same bytes
    mx.done()
    unknown = [c for c in converters if c not in (*FLOAT8, *MX)]
    if unknown:
        raise PipesimError(f"{where}: model.converters {unknown[0]!r} is not modelled ({', '.join(FLOAT8 + MX)})")
    float8, mxfp8 = any(c in FLOAT8 for c in converters), any(c in MX for c in converters)
    if float8 and mxfp8:
        raise PipesimError(f"{where}: model.converters names both float8 and mx linears")
    out: list[str] = []
    if float8:
        if recipe not in (None, "tensorwise", "rowwise"):
            raise PipesimError(f"{where}: quantize.linear.float8.recipe_name {recipe!r}: tensorwise or rowwise")
        if set(fqns8) - {"output"}:
            raise PipesimError(f"{where}: quantize.linear.float8.filter_fqns {fqns8}: pipesim keeps the output head "
                               "in bf16 and every other linear in float8")
        if recipe == "rowwise":
            out += ["--fp8-format", "e4m3", "--fp8-recipe", "rowwise"]
        else:
            out += ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"]
        if gather:
            out.append("--fp8-param-gather")
    if mxfp8:
        if mx_recipe != "mxfp8_cublas":
            raise PipesimError(f"{where}: quantize.linear.mx.recipe_name {mx_recipe!r}: pipesim times mxfp8_cublas")
        if set(fqns_mx) - {"output"}:
            raise PipesimError(f"{where}: quantize.linear.mx.filter_fqns {fqns_mx}: pipesim keeps the output head "
                               "in bf16 and every other linear in MXFP8")
        out += ["--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"]
    if out:
        out += ["--fp8-impl", "torchao"]
    return out


__all__ = ["FLOAT8", "MX", "PASSED", "Keys", "compile_flags", "quantize_flags", "recompute_flags"]
