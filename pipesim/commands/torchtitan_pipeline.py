"""How torchtitan's pipeline_llm cuts a model into stages (pytorch/torchtitan v0.2.2
torchtitan/distributed/pipeline_parallel.py), read for `--from-torchtitan`: the schedule and its stages per rank,
and the layers of each model part a job config lists."""

from __future__ import annotations

import re
from pathlib import Path

from pipesim.errors import PipesimError
from pipesim.model.hf_config import load_hf_config
from pipesim.plan.stack_space import TORCH_SCHEDULES

SCHEDULES = {torch: ours for ours, torch in TORCH_SCHEDULES.items()}
SINGLE_STAGE = ("GPipe", "1F1B")  # torch's PipelineScheduleSingle classes: one stage per rank


def parts_split(parts: list, where: str) -> list[int]:
    """module_fqns_per_model_part -> layers per model part, checked as pipesim models a stage (the embedding first,
    the norm and the head last, each decoder layer once and in order)."""
    if not all(isinstance(part, list) and all(isinstance(n, str) for n in part) for part in parts) or not parts:
        raise PipesimError(f"{where}: parallelism.module_fqns_per_model_part must be a list of lists of names")
    split, expected = [], 0
    for s, part in enumerate(parts):
        names = list(part)
        head = ["tok_embeddings"] if s == 0 else []
        tail = ["norm", "output"] if s == len(parts) - 1 else []
        body = names[len(head):len(names) - len(tail)]
        indices = [re.fullmatch(r"layers\.(\d+)", n) for n in body]
        if names[:len(head)] != head or names[len(names) - len(tail):] != tail or not all(indices):
            raise PipesimError(f"{where}: module_fqns_per_model_part part {s} is {names}: pipesim models "
                               "tok_embeddings first, norm and output last, and layers.N between")
        numbers = [int(m.group(1)) for m in indices]
        if numbers != list(range(expected, expected + len(numbers))):
            raise PipesimError(f"{where}: module_fqns_per_model_part part {s} holds layers {numbers}; the parts "
                               "must take the layers in order")
        expected += len(numbers)
        split.append(len(numbers))
    return split


def model_layers(config: str | None, where: str) -> int:
    """The decoder layers of `config` (the flavor's bundled config, or the --model-config typed)."""
    if config is None:
        raise PipesimError(f"{where}: pipeline_parallel_layers_per_stage needs the model's layers: give "
                           "--model-config")
    return load_hf_config(config).layers


def stages_per_rank(where: str, name: str, csv: str, pp: int, fqns, stages: int | None, path: str) -> tuple[str, int]:
    """(the schedule, or the CSV file's path; its stages per rank) as torchtitan's pipeline_llm decides them."""
    if csv:
        found = Path(path).parent / csv
        return str(found if found.is_file() else Path(csv)), 1
    if name not in SCHEDULES:
        raise PipesimError(f"{where}: pipeline_parallel_schedule {name!r}: pipesim runs "
                           + ", ".join(SCHEDULES) + " (or a pipeline_parallel_schedule_csv)")
    if fqns is not None:
        if len(fqns) % pp:
            raise PipesimError(f"{where}: {len(fqns)} model parts over pipeline_parallel_degree {pp}")
        v = len(fqns) // pp
    elif stages is not None:  # from pipeline_parallel_layers_per_stage
        if stages % pp:
            raise PipesimError(f"{where}: pipeline_parallel_layers_per_stage gives {stages} stages, not a multiple of "
                               f"pipeline_parallel_degree {pp} (torchtitan refuses it)")
        v = stages // pp
    else:
        v = 1 if name in SINGLE_STAGE else 2  # pipeline_llm's default
    if name in SINGLE_STAGE and v != 1 or name not in SINGLE_STAGE and v < 2:
        raise PipesimError(f"{where}: {name} with {v} stages per rank: torchtitan refuses it")
    return SCHEDULES[name], v


__all__ = ["SCHEDULES", "SINGLE_STAGE", "model_layers", "parts_split", "stages_per_rank"]
