"""What the host issues for one mixture-of-experts layer: kernel launches and device-to-host syncs.

A dropless MoE layer cannot be queued ahead of the GPU: the host must learn how many tokens each expert gets
(the all-to-all's split sizes, the grouped GEMM's m_splits) before it can launch what follows, so it waits for the
GPU once or more per layer and then issues the rest one launch at a time. NVIDIA's MoE report (arXiv:2603.07685,
section 4.3.6) names the result "host-boundedness". A dense layer has no such wait: its host runs ahead and its
launches are not counted here.

Counted from Megatron-LM 1e057005 (the MoE ModelZoo's main-branch runs) with Transformer Engine 2.4 and DeepEP
483f00a; "counted" figures replayed the Python code under torch's dispatch mode, "read" ones come from reading it:
- forward: the attention block (TE's fused norm + QKV, q/k norms, rotary, flash attention, projection, residuals,
  the pre-MLP norm: read, 20), the router (counted, 22: its GEMM, fp32 casts, softmax, top-k, the auxiliary loss),
  the dispatcher (alltoall: count all-gather, 4 D2H copies, preprocessing, permute, the two all-to-alls, chunk
  sorts and unpermute, 21; flex/DeepEP: layout, notify, dispatch, the unfused multihot (counted 12), permute,
  unpermute and combine, 23), one grouped-GEMM launch per local expert for FC1 and for FC2 (TE GroupedLinear runs
  one cuBLASLt GEMM per expert), the activation (1), a shared expert's MLP (5: fc1, activation, fc2 and its tp
  collectives); a clamped activation's clamps and an FC2 bias their kernels (pipesim.model.grouped_mlp_extras,
  forward and backward, read);
- backward: the router's 15 (counted), the attention block, dispatcher and activation read as 46, a data and a
  weight gradient GEMM per local expert and GroupedLinear (4 per expert), a shared expert's 7; its weight-gradient
  part (W of a split backward) the experts' wgrads, the attention block's 4 and the router's 1;
- syncs: alltoall waits once in the forward (megatron/core/transformer/moe/token_dispatcher.py: the D2H stream's
  synchronize before the all-to-all); DeepEP's normal dispatch spins on the host for the received counts
  (deep_ep.cpp), and Megatron's unfused multihot at that commit indexes by boolean masks three times (each a
  sync), 4 in the forward and 1 in the backward (the masks' backward). A recomputed MoE block repeats its forward's
  launches and syncs in the backward (full recomputation the whole layer's).
- Hybrid-EP (flex with `--moe-flex-dispatcher-backend hybridep`; read, not counted: no Hybrid-EP build here): the
  dispatcher's forward is 8 launches, Megatron's cast of the router's probabilities to float32 (token_dispatcher.py
  _HybridEPManager.dispatch) and Hybrid-EP's own kernels (DeepEP hybrid-ep docs/Hybrid-EP_Implementation.md,
  section 5: the metadata preprocessing's all-gather, metadata kernel and permute preprocessing, the dispatch and
  permute kernels, the unpermute and combine kernels; a staging copy more across NVLink domains, not counted). It waits
  once in the forward: dropless, Megatron passes no num_permuted_tokens, so the dispatch is blocking
  (megatron/core/transformer/moe/fused_a2a.py: `non_blocking = num_permuted_tokens is not None`) and the counts reach
  the host through pinned memory (hybrid_ep_buffer.py dispatch_with_permute); the backward's dispatch reuses the
  forward's handle and count (HybridEPCombine.backward), so no wait there.
- CUDA graphs (pipesim.model.cuda_graphs): a graphed attention block or router (with its pre-MLP norm and shared
  experts) is its graph's replay, REPLAY_F launches forward, REPLAY_B in the backward and REPLAY_W for its weight
  gradients, instead of its kernels' launches; both graphed are one graph ("one graph captures all static
  components before the dispatching operation", arXiv:2603.07685 section 4.3.6), replayed once; the syncs stay
  (they are in the dispatch, outside every graph). With drop-and-pad routing a graph may also take the whole MoE block
  ("moe"), the whole layer (no scope: one replay) or the whole iteration (full_iteration: no launches), and there are
  no waits (static token counts).
  The attention block's backward launches are not counted apart from the dispatcher's: ATTENTION_B takes them as
  its forward's 20 (read as the mirror of the forward) and the dispatcher's the rest of REST_B.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.model.config import ModelConfig
from pipesim.model.cuda_graphs import REPLAY_B, REPLAY_F, REPLAY_W
from pipesim.model.grouped_mlp_extras import CLAMP_LAUNCHES, extra_launches
from pipesim.model.options import LayerOptions

ATTENTION_F = 20  # launches of the attention block's forward (read)
ROUTER_F = 22  # the router's forward (counted)
DISPATCH_F = {"alltoall": 21, "deepep": 23, "hybridep": 8}  # the dispatcher's forward, dispatch and combine
ACTIVATION = 1  # the experts' activation, forward or backward
SHARED_F, SHARED_B = 5, 7  # a shared expert's MLP
ROUTER_B = 15  # the router's backward (counted)
REST_B = 45  # the attention block's and the dispatcher's backward (read: 46, less the activation counted apart)
ATTENTION_B = ATTENTION_F  # of REST_B, the attention block's, its weight gradients among them (assumed: mirrored)
ATTENTION_W, ROUTER_W = 4, 1  # of the backward, the weight gradients of the attention block and of the router
SYNCS_F = {"alltoall": 1, "deepep": 4, "hybridep": 1}  # device-to-host waits of the forward
SYNCS_B = {"alltoall": 0, "deepep": 1, "hybridep": 0}  # ... of the backward


@dataclass(frozen=True)
class HostOps:
    """Launches and device-to-host syncs of one MoE layer per action (I and W: a split backward's halves)."""

    launches_f: int
    launches_i: int
    launches_w: int
    syncs_f: int
    syncs_i: int  # a fused backward's are the same (B = I + W)


def _add(*parts: tuple[int, int, int]) -> tuple[int, int, int]:
    """(forward, whole backward, weight gradients) summed over parts of a layer."""
    forward, backward, weight = map(sum, zip(*parts, strict=True))
    return forward, backward, weight


REPLAY = (REPLAY_F, REPLAY_B + REPLAY_W, REPLAY_W)  # a graphed part: its replays (pipesim.model.cuda_graphs)


def moe_layer_host_ops(model: ModelConfig, opts: LayerOptions) -> HostOps:
    """One MoE layer's `HostOps` on a rank holding E / ep local experts, under `opts`' dispatcher, recompute and CUDA
    graphs. Drop-and-pad routing (a capacity factor, its inputs padded to capacity) has static token counts, so no
    wait: Megatron-core's alltoall dispatcher returns them without a device-to-host copy (token_dispatcher.py
    `preprocess`: `if self.drop_and_pad: ... return num_tokens_per_local_expert`, `cuda_sync_point` "no_sync") and
    Hybrid-EP's dispatch gets its token count (`num_permuted_tokens`), so it does not block."""
    moe = model.moe
    assert moe is not None  # the caller counts MoE layers only
    local = moe.experts // opts.ep
    shared = 1 if moe.shared_experts else 0
    graphs = opts.cuda_graphs

    def graphed(module: str) -> bool:
        return graphs is not None and graphs.captures(module)

    iteration = graphs is not None and graphs.impl == "full_iteration"
    whole_layer = graphs is not None and not iteration and not graphs.scope
    store = 1 if opts.act_fp8_store else 0  # --activation-func-fp8-input-store: a cast to FP8 and one back
    activation = ACTIVATION + store
    attn = REPLAY if graphed("attn") else (ATTENTION_F, ATTENTION_B, ATTENTION_W)
    router = (ROUTER_F + shared * (SHARED_F + store), ROUTER_B + shared * (SHARED_B + store), ROUTER_W)
    if graphed("moe_router"):  # with attn graphed too, one graph: replayed with the attention block's
        router = (0, 0, 0) if graphed("attn") else REPLAY
    extra = extra_launches(local, clamp=moe.glu_clamp is not None, bias=model.biases)
    rest = _add((DISPATCH_F[opts.moe_dispatcher] + 2 * local + activation,
                 (REST_B - ATTENTION_B) + activation + 4 * local, 2 * local), extra)  # dispatcher, experts, activation
    moe_ops = REPLAY if graphed("moe") else _add(router, rest)
    forward, backward, weight = (0, 0, 0) if iteration else REPLAY if whole_layer else _add(attn, moe_ops)
    padded = moe.capacity_factor is not None  # drop-and-pad: static token counts
    syncs_f = 0 if padded else SYNCS_F[opts.moe_dispatcher]
    syncs_i = 0 if padded else SYNCS_B[opts.moe_dispatcher]
    in_graph = iteration or whole_layer  # a recomputation inside a graph is replayed with it
    if opts.recompute == "full" and not in_graph:  # the whole layer's forward again, waits and all
        backward += forward
        syncs_i += syncs_f
    elif opts.recomputes("moe") and not (in_graph or graphed("moe")):  # the MoE block's forward again
        backward += moe_ops[0]
        syncs_i += syncs_f
    elif opts.recomputes("moe_act") and not (in_graph or graphed("moe")):
        backward += activation + (CLAMP_LAUNCHES if moe.glu_clamp is not None else 0)
    return HostOps(forward, backward - weight, weight, syncs_f, syncs_i)


__all__ = ["HostOps", "moe_layer_host_ops"]
