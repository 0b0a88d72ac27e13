"""CUDA graphs over parts of a layer (Megatron-core's --cuda-graph-impl and --cuda-graph-scope): which launches the
host no longer issues one by one.

Megatron-core (megatron/core/transformer/transformer_config.py @ d98e8a64dd, `cuda_graph_impl`, `cuda_graph_modules`,
which `cuda_graph_scope` is the older name of) captures per layer, with its own graphs ("local") or Transformer
Engine's make_graphed_callables ("transformer_engine"):
- attn: TransformerLayer._forward_attention (the input norm, QKV, attention, projection, residual);
- moe_router: _forward_mlp up to MoELayer.router(), the pre-MLP norm, the router and the shared experts (not
  overlapped with the all-to-all, Megatron's default);
- moe_preprocess (with moe_router): MoELayer.preprocess(), the dispatcher's dispatch_preprocess;
- mlp: a dense layer's MLP; moe: a whole MoE layer, drop-and-pad MoE only; mamba: a hybrid model's Mamba layers
  (pipesim.model.hybrid; refused for a model without any);
- no scope: the whole layer; "full_iteration" (an impl of its own): the whole forward and backward.

A replayed graph costs the host a few launches instead of its kernels' (transformer_engine/pytorch/graph.py
@ d0067d0da, `Graphed.forward` / `backward`): the input copied into the graph's static buffer and the replay, 2
each way, and a split backward's weight-gradient graph (`backward_dw`) 1. With attn and moe_router both graphed,
"one graph captures all static components before the dispatching operation" (NVIDIA's MoE report,
arXiv:2603.07685 section 4.3.6): one replay. Not modelled: the graphs' static buffers and memory pool (the report:
"about 7 GB extra memory on DeepSeek-V3 GB200 training"). pipesim charges host launches only in
mixture-of-experts layers (pipesim.model.host_ops: a dense layer's host runs ahead of the GPU), so there graphs
change what it charges; on a dense layer they change nothing. The flex dispatchers' preprocessing is views and at
most one fused copy (token_dispatcher.py `MoEFlexTokenDispatcher.dispatch_preprocess`, `_HybridEPManager.
setup_metadata`: reshapes), none of the launches pipesim counts, so moe_preprocess moves none; the alltoall
dispatcher's preprocessing holds its device-to-host copies, which graphing moves (`cuda_dtoh_point`), not modelled:
refused there. A whole MoE layer, layer or iteration in a graph needs static token counts: taken with
drop-and-pad routing (a capacity factor: no waits either), refused for dropless routing (Megatron's paged stash,
which makes it possible, is not modelled).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.errors import PipesimError

CUDA_GRAPH_IMPLS = ("local", "transformer_engine", "full_iteration")  # Megatron-core's, less "none"
CUDA_GRAPH_SCOPES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")  # Megatron's order
REPLAY_F = 2  # a graphed forward: its input copied into the static buffer, then the replay
REPLAY_B = 2  # a graphed backward: the output gradient copied in, then the backward graph's replay
REPLAY_W = 1  # a split backward's weight-gradient graph (TE's backward_dw)


@dataclass(frozen=True)
class CudaGraphs:
    """The graphs a run captures: Megatron-core's --cuda-graph-impl and its --cuda-graph-scope (() the whole layer)."""

    impl: str = "transformer_engine"
    scope: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.impl not in CUDA_GRAPH_IMPLS:
            raise PipesimError(f"unknown --cuda-graph-impl {self.impl!r}; choose none, {', '.join(CUDA_GRAPH_IMPLS)}")
        unknown = [s for s in self.scope if s not in CUDA_GRAPH_SCOPES]
        if unknown:
            raise PipesimError(f"unknown --cuda-graph-scope {unknown[0]!r}; choose {', '.join(CUDA_GRAPH_SCOPES)} "
                               "(none: the whole layer)")
        object.__setattr__(self, "scope", tuple(s for s in CUDA_GRAPH_SCOPES if s in self.scope))
        if self.impl == "full_iteration" and self.scope:
            raise PipesimError("--cuda-graph-impl full_iteration graphs the whole iteration: it takes no "
                               "--cuda-graph-scope (Megatron-core)")
        if "moe_preprocess" in self.scope and "moe_router" not in self.scope:
            raise PipesimError("--cuda-graph-scope moe_preprocess must be used together with moe_router "
                               "(Megatron-core)")

    def captures(self, module: str) -> bool:
        """Whether `module` ("attn", "moe_router", ...) runs inside a per-layer graph."""
        return self.impl != "full_iteration" and module in self.scope

    def check_recompute(self, recompute: str, modules: tuple[str, ...] = ()) -> None:
        """One line where Megatron-core refuses the recomputation under these graphs (transformer_config.py): full
        recomputation except with full_iteration ("full recompute is only supported with full iteration CUDA
        graph"), and the MoE block's with Transformer Engine's graphs over the router ("moe recompute is not
        supported with moe_router CUDA graph")."""
        if recompute == "full" and self.impl != "full_iteration":
            raise PipesimError("--recompute full with per-layer CUDA graphs: Megatron-core supports full "
                               "recomputation only with --cuda-graph-impl full_iteration")
        if self.impl == "transformer_engine" and "moe" in modules and "moe_router" in self.scope:
            raise PipesimError("--recompute-modules moe with --cuda-graph-scope moe_router under --cuda-graph-impl "
                               "transformer_engine: Megatron-core does not support recomputing a graphed router")

    def check_moe(self, dispatcher: str, *, padded: bool) -> None:
        """One line unless pipesim's host model of a MoE layer holds under these graphs (`padded`: drop-and-pad
        routing, static token counts) and Megatron-core takes them (transformer_config.py's asserts)."""
        if "moe" in self.scope and "moe_router" in self.scope:
            raise PipesimError("--cuda-graph-scope moe and moe_router cannot go together (Megatron-core: the router "
                               "is inside the moe graph)")
        if not padded and (self.impl == "full_iteration" or not self.scope or "moe" in self.scope):
            what = "the whole iteration" if self.impl == "full_iteration" else \
                "a whole MoE layer" if "moe" in self.scope else "the whole layer"
            raise PipesimError(f"CUDA graphs over {what} need static token counts: drop-and-pad routing "
                               "(--moe-expert-capacity-factor; Megatron's paged stash is not modelled), or give "
                               "--cuda-graph-scope attn moe_router moe_preprocess")
        if "moe_preprocess" in self.scope and dispatcher == "alltoall":
            raise PipesimError("--cuda-graph-scope moe_preprocess with the alltoall dispatcher moves its "
                               "device-to-host copies into the graph, which pipesim does not model: use "
                               "--moe-token-dispatcher-type flex, or leave moe_preprocess out")

    def flags(self) -> list[str]:
        """Megatron-core's flags for these graphs."""
        return ["--cuda-graph-impl", self.impl] + (["--cuda-graph-scope", *self.scope] if self.scope else [])


__all__ = ["CUDA_GRAPH_IMPLS", "CUDA_GRAPH_SCOPES", "REPLAY_B", "REPLAY_F", "REPLAY_W", "CudaGraphs"]
