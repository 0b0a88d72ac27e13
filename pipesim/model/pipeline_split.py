"""How a training stack cuts a transformer's layers over its pipeline stages, beside an explicit --layer-split.

pipesim's own cut (`split_layers`) gives every stage (chunk) layers / stages and the remainder to the first ones, the
embedding riding on the first stage and the output head on the last. The stacks balance those two ends their own way:

- Megatron-core (NVIDIA/Megatron-LM @ d98e8a64, megatron/core/transformer/transformer_block.py
  get_num_layers_to_build, and transformer_config.py's checks):
  - `--account-for-embedding-in-pipeline-split`, `--account-for-loss-in-pipeline-split`: the embedding and the loss
    (the output head) each take one layer's slot. The L + e + l slots split evenly over the p x v chunks (Megatron
    asserts (L + e + l) % p == 0 and the per-rank count % v == 0, i.e. % (p v)); the first chunk of the first rank
    builds one layer fewer, the last chunk of the last rank one fewer.
  - `--decoder-first-pipeline-num-layers N`, `--decoder-last-pipeline-num-layers N` (num_layers_in_first /
    last_pipeline_stage): the first (last) pipeline rank holds N layers over its v chunks, N / v each; the other
    ranks share the rest evenly (it must divide, and each rank's count by v). Megatron refuses them beside the
    account-for flags. They name pipeline ranks, so they need Megatron's interleaved placement (stage s on rank
    s mod p).
  - `--pipeline-model-parallel-layout STR`: every stage spelled out (pipesim.model.megatron_layout, the grammar).
- torchtitan (pytorch/torchtitan v0.2.2, torchtitan/distributed/pipeline_parallel.py generate_llm_fqn_per_model_part;
  torchtitan/config/job_config.py pipeline_parallel_first_stage_less_layers and _last_stage_less_layers, 1 each by
  default): the embedding weighs a layers and the output (norm and head) b. The L + a + b effective layers split over
  the n stages, (L + a + b) // n each and the remainder to the first stages; then the first stage holds a layers
  fewer and the last b fewer. torchtitan refuses more stages than effective layers, and a or b above (L + a + b) // n.

Every refusal is one line, as the stack's own assertion would stop the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipesim.errors import PipesimError
from pipesim.model.megatron_layout import LAYOUT, layout_split

ACCOUNT_EMBEDDING = "--account-for-embedding-in-pipeline-split"
ACCOUNT_LOSS = "--account-for-loss-in-pipeline-split"
FIRST_LAYERS = "--decoder-first-pipeline-num-layers"
LAST_LAYERS = "--decoder-last-pipeline-num-layers"
FIRST_LESS = "--pipeline-parallel-first-stage-less-layers"
LAST_LESS = "--pipeline-parallel-last-stage-less-layers"


@dataclass(frozen=True)
class SplitRule:
    """A stack's rule for layers per stage; nothing set: pipesim's even split."""

    account_embedding: bool = False  # Megatron: the embedding takes a layer's slot
    account_loss: bool = False  # Megatron: the loss (output head) takes a layer's slot
    first_layers: int | None = None  # Megatron: layers of the first pipeline rank
    last_layers: int | None = None  # Megatron: layers of the last pipeline rank
    first_less: int = 0  # torchtitan: layers the embedding weighs
    last_less: int = 0  # torchtitan: layers the output weighs
    layout: str | None = None  # Megatron: --pipeline-model-parallel-layout, every stage spelled out

    def __post_init__(self) -> None:
        for name in ("first_layers", "last_layers"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise PipesimError(f"{FIRST_LAYERS if name == 'first_layers' else LAST_LAYERS} takes a count of "
                                   f"layers (0 or more), got {value!r}")
        for name, flag in (("first_less", FIRST_LESS), ("last_less", LAST_LESS)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise PipesimError(f"{flag} takes a count of layers (0 or more), got {value!r}")
        if self.ranks_given and (self.account_embedding or self.account_loss):
            raise PipesimError(f"{FIRST_LAYERS} / {LAST_LAYERS} cannot go with {ACCOUNT_EMBEDDING} / {ACCOUNT_LOSS} "
                               "(Megatron-core refuses the two at once)")
        if self.layout is not None and (self.ranks_given or self.account_embedding or self.account_loss):
            raise PipesimError(f"{LAYOUT} cannot go with the other pipeline layout flags (Megatron-core refuses them "
                               "together)")
        if self.torchtitan and self.megatron:
            raise PipesimError(f"{FIRST_LESS} / {LAST_LESS} are torchtitan's split, the others Megatron-core's: "
                               "give one stack's")

    @property
    def ranks_given(self) -> bool:
        return self.first_layers is not None or self.last_layers is not None

    @property
    def megatron(self) -> bool:
        return self.account_embedding or self.account_loss or self.ranks_given or self.layout is not None

    @property
    def torchtitan(self) -> bool:
        return bool(self.first_less or self.last_less)

    @property
    def fixes_stages(self) -> bool:
        """Whether the rule fixes one layout (a rank's layers, or every stage's) rather than a rule over any
        number of stages: the planner, which searches pipeline sizes, refuses it."""
        return self.ranks_given or self.layout is not None

    def __bool__(self) -> bool:
        return self.megatron or self.torchtitan

    def split(self, layers: int, stages: int, placement: tuple[int, ...] | None = None, *,
              mtp_layers: int = 0) -> list[int] | None:
        """Layers per stage in pipeline order (stage 0 holds the embedding, the last the head); None: the even
        split. `placement` (stage -> rank) is needed by the rank counts alone, `mtp_layers` (the model's) by a
        layout."""
        if self.layout is not None:
            return layout_split(self.layout, layers, stages, mtp_layers)
        if self.torchtitan:
            return torchtitan_split(layers, stages, self.first_less, self.last_less)
        if self.account_embedding or self.account_loss:
            return account_split(layers, stages, embedding=self.account_embedding, loss=self.account_loss)
        if self.ranks_given:
            if placement is None or len(placement) != stages:
                raise PipesimError(f"{FIRST_LAYERS} / {LAST_LAYERS} name pipeline ranks: the schedule's placement "
                                   "is needed")
            return rank_split(layers, placement, self.first_layers, self.last_layers)
        return None

    def flags(self) -> list[str]:
        """The flags that give this rule (the winner's command, --json)."""
        out = [ACCOUNT_EMBEDDING] * self.account_embedding + [ACCOUNT_LOSS] * self.account_loss
        out += [FIRST_LAYERS, str(self.first_layers)] if self.first_layers is not None else []
        out += [LAST_LAYERS, str(self.last_layers)] if self.last_layers is not None else []
        out += [FIRST_LESS, str(self.first_less)] if self.first_less else []
        out += [LAST_LESS, str(self.last_less)] if self.last_less else []
        out += [LAYOUT, self.layout] if self.layout is not None else []
        return out

    def report(self) -> dict:
        """--json's account (the set fields, in their flags' names)."""
        out: dict = {}
        for flag, value in ((ACCOUNT_EMBEDDING, self.account_embedding), (ACCOUNT_LOSS, self.account_loss),
                            (FIRST_LAYERS, self.first_layers), (LAST_LAYERS, self.last_layers),
                            (FIRST_LESS, self.first_less or None), (LAST_LESS, self.last_less or None),
                            (LAYOUT, self.layout)):
            if value:
                out[flag.removeprefix("--").replace("-", "_")] = value
        return out


@dataclass(frozen=True)
class BalancedSplit:
    """pipesim's own rule for `pipesim plan --balance-layers`: the layers cut so that the most loaded stage carries
    as little as it can, the embedding weighing `first_weight` layers on the first stage and the head `last_weight`
    on the last (fractions: the planner's ratio of their FLOPs to a layer's). No stack has it as a flag: the
    plan exports the split it gives (Megatron-core's layout string, torchtitan's module list, --layer-split)."""

    first_weight: float
    last_weight: float

    megatron = False
    torchtitan = False
    fixes_stages = False

    def __bool__(self) -> bool:
        return True

    def split(self, layers: int, stages: int, placement: tuple[int, ...] | None = None, *,
              mtp_layers: int = 0) -> list[int]:
        return balanced_split(layers, stages, self.first_weight, self.last_weight)

    def flags(self) -> list[str]:
        return []  # not a flag of any stack: the commands carry its split

    def report(self) -> dict:
        return {"balanced_layer_split": {"embedding_weight": self.first_weight, "head_weight": self.last_weight}}


def schedule_split(rule: SplitRule | BalancedSplit, model, schedule) -> list[int] | None:
    """Layers per model stage of `schedule` (its `model_stages` chunks in pipeline order) under `rule`, None: the
    even split; its placement serves the rank counts, `model`'s MTP layers a layout. simulate's and run's one cut."""
    n = schedule.model_stages
    return rule.split(model.layers, n, schedule.placement[:n], mtp_layers=model.mtp_layers)


def balanced_split(layers: int, stages: int, first_weight: float, last_weight: float) -> list[int]:
    """Layers per stage minimising the largest stage's load (its layers, plus `first_weight` on the first stage and
    `last_weight` on the last): the smallest load T whose capacities floor(T - weight) hold every layer, then the
    surplus taken one layer at a time from the most loaded stage (the later one on a tie)."""
    if stages == 1:
        return [layers]
    extra = [first_weight] + [0.0] * (stages - 2) + [last_weight]

    def capacity(t: float) -> list[int]:
        return [max(0, math.floor(t - e + 1e-9)) for e in extra]

    targets = sorted({k + e for k in range(layers + 1) for e in set(extra)})
    lo, hi = 0, len(targets) - 1
    while lo < hi:  # the smallest target whose capacities hold the layers
        mid = (lo + hi) // 2
        if sum(capacity(targets[mid])) >= layers:
            hi = mid
        else:
            lo = mid + 1
    out = capacity(targets[lo])
    for _ in range(sum(out) - layers):
        s = max((i for i in range(stages) if out[i]), key=lambda i: (out[i] + extra[i], i))
        out[s] -= 1
    return out


def account_split(layers: int, stages: int, *, embedding: bool, loss: bool) -> list[int]:
    """Megatron-core's account-for split: the L + e + l slots evenly over the stages, the first stage one layer
    fewer for the embedding, the last one fewer for the loss."""
    slots = layers + embedding + loss
    if slots % stages:
        raise PipesimError(f"{layers} layers and {embedding + loss} slot(s) for the embedding / loss "
                           f"({ACCOUNT_EMBEDDING}, {ACCOUNT_LOSS}) do not split evenly over {stages} pipeline chunks: "
                           f"Megatron-core needs (layers + slots) divisible by pp x vp")
    per = slots // stages
    out = [per] * stages
    out[0] -= embedding
    out[-1] -= loss
    if min(out) < 0:
        raise PipesimError(f"{stages} chunks of {per} slot(s): not enough layers for the embedding and the loss "
                           "slots in one chunk")
    return out


def rank_split(layers: int, placement: tuple[int, ...], first: int | None, last: int | None) -> list[int]:
    """Megatron-core's uneven first / last rank: `first` (`last`) layers on the first (last) pipeline rank, the
    rest evenly over the others, each rank's layers evenly over its chunks (placement: stage s on rank s mod p)."""
    stages = len(placement)
    p = max(placement) + 1
    v = stages // p
    if p < 2:
        raise PipesimError(f"{FIRST_LAYERS} / {LAST_LAYERS} need a pipeline (2 or more ranks)")
    if any(r != s % p for s, r in enumerate(placement)):
        raise PipesimError(f"{FIRST_LAYERS} / {LAST_LAYERS} place layers by pipeline rank as Megatron's schedules "
                           "do (stage s on rank s mod p); this schedule places its stages otherwise: give "
                           "--layer-split")
    per_rank: dict[int, int] = {}
    if first is not None:
        per_rank[0] = first
    if last is not None:
        per_rank[p - 1] = last
    rest, left = layers - sum(per_rank.values()), p - len(per_rank)
    if rest < 0 or (left == 0 and rest != 0) or (left and rest % left):
        given = " and ".join(f"{n} on the {which} rank" for which, n in (("first", first), ("last", last))
                             if n is not None)
        raise PipesimError(f"{layers} layers less {given} leave {rest} for {left} other rank(s): Megatron-core needs "
                           "them to divide evenly")
    for r in range(p):
        per_rank.setdefault(r, rest // left if left else 0)
    uneven = [r for r in range(p) if per_rank[r] % v]
    if uneven:
        raise PipesimError(f"pipeline rank {uneven[0]}'s {per_rank[uneven[0]]} layers do not split over its {v} "
                           "chunks: Megatron-core needs each rank's count divisible by vp")
    return [per_rank[r] // v for r in placement]


def torchtitan_split(layers: int, stages: int, first_less: int, last_less: int) -> list[int]:
    """torchtitan's weighted split (generate_llm_fqn_per_model_part): the embedding weighs `first_less` layers,
    the output `last_less`; refused where torchtitan raises."""
    if stages == 1:
        return [layers]
    effective = layers + first_less + last_less
    if stages > effective:
        raise PipesimError(f"{stages} pipeline stages exceed torchtitan's {effective} effective layers "
                           f"({layers} + {first_less} + {last_less})")
    per, extra = divmod(effective, stages)
    if first_less > per or last_less > per:
        raise PipesimError(f"torchtitan's {FIRST_LESS} {first_less} / {LAST_LESS} {last_less} exceed the "
                           f"{per} layers per stage of {stages} stages")
    out = [per + (1 if s < extra else 0) for s in range(stages)]
    out[0] -= first_less
    out[-1] -= last_less
    return out


def torchtitan_fqns(split: list[int]) -> list[list[str]]:
    """torchtitan's module_fqns_per_model_part for `split` (its Llama modules: tok_embeddings, layers.N, norm,
    output), the list pipeline_llm builds its stages from when given."""
    out, layer = [], 0
    for s, n in enumerate(split):
        names = ["tok_embeddings"] if s == 0 else []
        names += [f"layers.{k}" for k in range(layer, layer + n)]
        layer += n
        if s == len(split) - 1:
            names += ["norm", "output"]
        out.append(names)
    return out


__all__ = ["ACCOUNT_EMBEDDING", "ACCOUNT_LOSS", "FIRST_LAYERS", "FIRST_LESS", "LAST_LAYERS", "LAST_LESS", "LAYOUT",
           "BalancedSplit", "SplitRule", "account_split", "balanced_split", "rank_split", "schedule_split",
           "torchtitan_fqns", "torchtitan_split"]
