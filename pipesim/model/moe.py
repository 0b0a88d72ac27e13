"""A mixture-of-experts MLP: which layers have experts, how many, how wide, and how tokens reach them.

A layer's MLP is either dense (the model's `ffn_size`) or a mixture of `experts` routed experts of
width `expert_ffn`, each token sent to `top_k` of them by a router (a linear h -> E and a top-k), plus
`shared_experts` that every token passes through (DeepSeek's; width `shared_ffn`). The first
`dense_layers` layers are dense (DeepSeek-V3's `first_k_dense_replace`), and after them every
`every`-th layer has experts (Qwen-MoE's `decoder_sparse_step`, Llama 4's interleaving: layer l is
MoE when (l + 1) % every == 0). Routing is dropless unless `capacity_factor` is set (GShard/Switch:
each expert takes at most capacity_factor x tokens x k / E tokens, the rest dropped); `imbalance` is
the most-loaded expert's tokens over the mean (1.0: perfectly balanced), what the slowest expert-parallel
rank computes and receives, since every rank waits for it at the combine. `expert_bias`: DeepSeek-V3's
auxiliary-loss-free balancing adds a per-expert bias to the routing scores (E values per MoE layer: a parameter of its
checkpoint, counted in its totals; Megatron-core's expert_bias buffer is updated outside the optimizer).
`router_bias`: the router's linear has a bias of its own (GPT-OSS's GptOssTopKRouter: F.linear(x, weight, bias)),
E trained parameters per MoE layer added to the logits before the top-k.
`glu_clamp`: the experts' gated activation clamps its input at this value (GPT-OSS's `swiglu_limit`, Megatron-core's
activation_func_clamp_value): no parameter or FLOP, but Megatron-core runs it as kernels of its own
(pipesim.model.grouped_mlp_extras). `glu_alpha` and `glu_offset`: the experts' gate is gate x sigmoid(alpha x gate)
times (up + offset); SwiGLU's are 1 and 0, GPT-OSS's 1.702 and 1 (transformers' GptOssExperts: alpha, (up + 1) * glu;
Megatron-core's quick_gelu with glu_linear_offset 1.0): inside the activation's kernel, no cost pipesim counts; the
executor trains that function (executor.mlp).
`balance` and `aux_loss_coeff`: Megatron-core's load-balancing loss (--moe-router-load-balancing-type,
--moe-aux-loss-coeff; its defaults "aux_loss" and 0, no loss), and `z_loss_coeff` its router z-loss (ST-MoE's,
--moe-z-loss-coeff): a few FLOPs per token on scores the router made, no cost pipesim counts; the executor trains
them (executor.experts). `shared_gate`: the shared experts' output times a sigmoid of the token (Qwen2-MoE's;
pipesim.model.shared_gate).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.errors import PipesimError

# Megatron-core's alltoall dispatcher; its flex dispatcher on DeepEP or on Hybrid-EP
MOE_DISPATCHERS = ("alltoall", "deepep", "hybridep")
# Megatron-core's --moe-token-drop-policy: over capacity an expert keeps its highest-probability tokens (its
# default) or its first ones by position
DROP_POLICIES = ("probs", "position")
# Megatron-core's --moe-router-load-balancing-type choices pipesim's executor trains: the switch loss over a
# microbatch's tokens, over each sequence's, or none (its global_aux_loss and sinkhorn are not run)
BALANCE_TYPES = ("aux_loss", "seq_aux_loss", "none")
SCORE_FUNCTIONS = ("softmax", "sigmoid")  # Megatron-core's --moe-router-score-function choices


@dataclass(frozen=True)
class MoeConfig:
    """The experts of a mixture-of-experts model (see the module's docstring for each field's meaning)."""

    experts: int  # routed experts per MoE layer (E)
    top_k: int  # routed experts per token (k)
    expert_ffn: int  # width of one routed expert's MLP (moe_intermediate_size; Mixtral: intermediate_size)
    shared_experts: int = 0  # experts every token passes through (DeepSeek's n_shared_experts)
    shared_ffn: int | None = None  # width of one shared expert; None: expert_ffn
    dense_layers: int = 0  # the first layers with a dense MLP (first_k_dense_replace)
    every: int = 1  # after them, layer l has experts when (l + 1) % every == 0 (decoder_sparse_step)
    capacity_factor: float | None = None  # None: dropless; else tokens per expert capped at cf x T k / E
    imbalance: float = 1.0  # the most-loaded expert's tokens / the mean (>= 1; dropless routing)
    expert_bias: bool = False  # a per-expert routing-score bias (DeepSeek-V3's e_score_correction_bias: E values)
    router_bias: bool = False  # the router's linear has a bias (GPT-OSS's: E trained values)
    glu_clamp: float | None = None  # the experts' GLU input clamped at this value (GPT-OSS's swiglu_limit); None: none
    glu_alpha: float = 1.0  # the gate's sigmoid gain: gate x sigmoid(alpha x gate) (SwiGLU 1; GPT-OSS 1.702)
    glu_offset: float = 0.0  # added to the up half before the product (SwiGLU 0; GPT-OSS 1)
    # group-limited routing (DeepSeek-V3's n_group / topk_group; Megatron-core's --moe-router-num-groups /
    # --moe-router-group-topk): the experts in `groups` equal groups, each token's k among `group_topk` of them
    groups: int = 1
    group_topk: int | None = None
    # the router's k weights divided by their sum (Mixtral's softmax over the top-k logits, Qwen3-MoE's
    # norm_topk_prob): k divisions per token, no cost pipesim counts; the executor's router honours it
    renormalize: bool = False
    drop_policy: str = "probs"  # over capacity, which tokens an expert keeps (DROP_POLICIES; Megatron-core's default)
    balance: str = "aux_loss"  # the load-balancing loss's kind (BALANCE_TYPES), Megatron-core's default
    aux_loss_coeff: float = 0.0  # its coefficient; 0: no loss (Megatron-core's default)
    z_loss_coeff: float = 0.0  # the router z-loss's coefficient; 0: none (Megatron-core's default, None)
    # a Hugging Face config's own router loss (router_aux_loss_coef under output_router_logits): one loss over every
    # layer's routing at once, k times Megatron-core's per layer; costs nothing counted, the executor refuses it
    hf_router_loss: float = 0.0
    # the router's scores (Megatron-core's --moe-router-score-function): a softmax over the E logits, or each logit's
    # sigmoid (DeepSeek-V3, Llama 4); the top k of them weight the chosen experts. The same kernels' bytes either way:
    # no cost pipesim counts; the executor's router computes them
    score: str = "softmax"
    # the chosen expert's weight multiplies its input, not its output (Llama 4's Llama4TextMoe; Megatron-core's
    # --moe-apply-probs-on-input, top-1 only): the same product on the same rows, no cost pipesim counts
    input_probs: bool = False
    # a sigmoid gate on the shared experts' output (Qwen2-MoE's shared_expert_gate, Megatron-core's
    # --moe-shared-expert-gate: pipesim.model.shared_gate): h weights, three small kernels each way per MoE layer
    shared_gate: bool = False
    # the layers with experts given one by one (a hybrid model's E layers, pipesim.model.hybrid); None: `dense_layers`
    # and `every` place them
    placement: tuple[int, ...] | None = None

    @property
    def balance_loss(self) -> bool:
        """The router trains a load-balancing loss (a kind other than none, at a positive coefficient)."""
        return self.balance != "none" and self.aux_loss_coeff > 0

    def __post_init__(self) -> None:
        for name in ("experts", "top_k", "expert_ffn", "every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PipesimError(f"moe {name} must be a positive integer, got {value!r}")
        for name in ("shared_experts", "dense_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise PipesimError(f"moe {name} must be a non-negative integer, got {value!r}")
        if self.shared_ffn is not None and (not isinstance(self.shared_ffn, int) or isinstance(self.shared_ffn, bool)
                                            or self.shared_ffn < 1):
            raise PipesimError(f"moe shared_ffn must be a positive integer, got {self.shared_ffn!r}")
        for name in ("expert_bias", "router_bias"):
            if not isinstance(getattr(self, name), bool):
                raise PipesimError(f"moe {name} must be true or false, got {getattr(self, name)!r}")
        if self.glu_clamp is not None and (isinstance(self.glu_clamp, bool)
                                           or not isinstance(self.glu_clamp, (int, float))
                                           or not 0 < self.glu_clamp < float("inf")):
            raise PipesimError(f"moe glu_clamp must be a positive finite number or null, got {self.glu_clamp!r}")
        for name, positive in (("glu_alpha", True), ("glu_offset", False)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not abs(value) < float("inf") \
                    or (positive and not value > 0):
                raise PipesimError(f"moe {name} must be a {'positive ' if positive else ''}finite number, "
                                   f"got {value!r}")
        if self.top_k > self.experts:
            raise PipesimError(f"moe top_k {self.top_k} is more than its {self.experts} experts")
        # an expert receives each token at most once: at most T of the mean's T k / E, so both ratios stay <= E / k
        most = self.experts / self.top_k
        if self.capacity_factor is not None and (isinstance(self.capacity_factor, bool)
                                                 or not isinstance(self.capacity_factor, (int, float))
                                                 or not 0 < self.capacity_factor <= most):
            raise PipesimError(f"moe capacity_factor must be a number in (0, E / k = {most:g}] (an expert holds at "
                               f"most every token), got {self.capacity_factor!r}")
        if isinstance(self.imbalance, bool) or not isinstance(self.imbalance, (int, float)) \
                or not 1 <= self.imbalance <= most:
            raise PipesimError(f"moe imbalance (the most-loaded expert's tokens / the mean) must be in [1, E / k = "
                               f"{most:g}] (an expert receives at most every token), got {self.imbalance!r}")
        if not isinstance(self.groups, int) or isinstance(self.groups, bool) or self.groups < 1 \
                or self.experts % self.groups:
            raise PipesimError(f"moe groups must be a positive integer dividing the {self.experts} experts, "
                               f"got {self.groups!r}")
        if (self.group_topk is None) != (self.groups == 1) or self.group_topk is not None and (
                isinstance(self.group_topk, bool) or not isinstance(self.group_topk, int)
                or not 1 <= self.group_topk <= self.groups
                or self.top_k > self.group_topk * (self.experts // self.groups)):
            raise PipesimError(f"moe group_topk must be given with groups > 1, between 1 and groups ({self.groups}), "
                               f"its groups holding top_k ({self.top_k}) experts; got {self.group_topk!r}")
        if not isinstance(self.renormalize, bool):
            raise PipesimError(f"moe renormalize must be true or false, got {self.renormalize!r}")
        if self.drop_policy not in DROP_POLICIES:
            raise PipesimError(f"moe drop_policy must be one of {', '.join(DROP_POLICIES)}, got {self.drop_policy!r}")
        if self.balance not in BALANCE_TYPES:
            raise PipesimError(f"moe balance must be one of {', '.join(BALANCE_TYPES)}, got {self.balance!r}")
        for name in ("aux_loss_coeff", "z_loss_coeff", "hf_router_loss"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise PipesimError(f"moe {name} must be a finite number >= 0, got {value!r}")
        if self.score not in SCORE_FUNCTIONS:
            raise PipesimError(f"moe score must be one of {', '.join(SCORE_FUNCTIONS)}, got {self.score!r}")
        if not isinstance(self.input_probs, bool):
            raise PipesimError(f"moe input_probs must be true or false, got {self.input_probs!r}")
        if not isinstance(self.shared_gate, bool):
            raise PipesimError(f"moe shared_gate must be true or false, got {self.shared_gate!r}")
        if self.shared_gate and not self.shared_experts:  # Megatron-core: "Only effective when ... is set"
            raise PipesimError("moe shared_gate (--moe-shared-expert-gate) gates the shared experts: the model has "
                               "none (give shared experts, --moe-shared-expert-intermediate-size)")
        self._check_placement()
        if self.input_probs and self.top_k != 1:  # Megatron-core asserts it (experts.py)
            raise PipesimError(f"moe input_probs (--moe-apply-probs-on-input) needs top_k 1, got {self.top_k}")
        if self.capacity_factor is not None and self.imbalance != 1.0:
            raise PipesimError("moe imbalance applies to dropless routing; with a capacity_factor the most-loaded "
                               "expert takes capacity_factor x the mean")

    def _check_placement(self) -> None:
        """`placement`: increasing layer indices, in place of `dense_layers` and `every` (one spelling)."""
        if self.placement is None:
            return
        if isinstance(self.placement, list):  # from to_dict / JSON
            object.__setattr__(self, "placement", tuple(self.placement))
        layers = self.placement
        if not isinstance(layers, tuple) or not layers or any(
                not isinstance(k, int) or isinstance(k, bool) or k < 0 for k in layers) \
                or list(layers) != sorted(set(layers)):
            raise PipesimError(f"moe placement must be increasing layer indices, got {layers!r}")
        if self.dense_layers or self.every != 1:
            raise PipesimError("moe placement lists the layers with experts: give no dense_layers or every beside it")

    @property
    def plain_glu(self) -> bool:
        """The experts' gated activation is SwiGLU's own: no clamp, gain 1, no offset."""
        return self.glu_clamp is None and self.glu_alpha == 1.0 and self.glu_offset == 0.0

    @property
    def shared_width(self) -> int:
        """Width of one shared expert."""
        return self.expert_ffn if self.shared_ffn is None else self.shared_ffn

    def is_moe_layer(self, layer: int) -> bool:
        """Whether layer `layer` (0-based, in model order) has experts."""
        if self.placement is not None:
            return layer in self.placement
        return layer >= self.dense_layers and (layer + 1) % self.every == 0

    def moe_layers(self, start: int, count: int) -> int:
        """How many of the layers start .. start + count - 1 have experts."""
        return sum(self.is_moe_layer(layer) for layer in range(start, start + count))

    def load_factor(self) -> float:
        """Tokens the most-loaded expert computes over the mean: `imbalance` when dropless; with a capacity factor,
        the capacity every expert's buffer is padded to (GShard; Megatron's --moe-pad-expert-input-to-capacity)."""
        return float(self.capacity_factor) if self.capacity_factor is not None else float(self.imbalance)


def group_node_limit(groups: int, group_topk: int, nodes: int) -> int | None:
    """The nodes a token's experts can be on when group-limited routing (`group_topk` of `groups` groups; 0: none)
    runs over an ep group of `nodes` nodes, experts placed in order: group_topk x nodes / groups where each group
    covers whole nodes (DeepSeek-V3's 8 groups over EP 64 on 8 nodes: 4, its "node-limited routing",
    arXiv:2412.19437 section 2.1.2). None without groups, on one node, or where a node holds several groups (no
    exact bound there: the all-to-all is timed as if every node could be reached)."""
    if not group_topk or nodes < 2 or nodes % groups:
        return None
    return group_topk * nodes // groups


__all__ = ["BALANCE_TYPES", "DROP_POLICIES", "MOE_DISPATCHERS", "SCORE_FUNCTIONS", "MoeConfig", "group_node_limit"]
