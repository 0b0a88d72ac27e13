"""Context parallelism's traffic of one layer: ring attention's K/V hops (Megatron-core's and Transformer Engine's
p2p), the all-gathered K/V (all_gather) and DeepSpeed-Ulysses' all-to-alls (a2a), per microbatch, with the blocks'
sizes the memory model holds too. Bytes as pipesim.model.layer_collectives.Collective counts them.
"""

from __future__ import annotations

from pipesim.model.config import ModelConfig
from pipesim.model.latent_layer import latent_widths
from pipesim.model.layer_collectives import Collective
from pipesim.model.options import LayerOptions


def cp_kv_block_bytes(model: ModelConfig, b: int, opts: LayerOptions) -> int:
    """One rank's K and V block: 2 x (s / cp) x b x h_kv / t values of the model's dtype (latent attention: K of
    a (nope + rope) / t and V of a v / t per token)."""
    opts.check(model)
    if model.mla is not None:
        qk, v = latent_widths(model, opts.tp)
        return opts.local_seq(model) * b * (qk + v) * model.dtype_bytes
    return 2 * opts.local_seq(model) * b * model.kv_width // opts.tp * model.dtype_bytes


def cp_layer_exchanges(model: ModelConfig, b: int, opts: LayerOptions) -> list[Collective]:
    """Context parallelism's traffic of one layer per microbatch: ring attention's P2P, per direction (each rank sends
    this, and receives it); with --cp-comm-type all_gather the gathers of `_gathered_kv`, with a2a the all-to-alls of
    `_ulysses` instead.

    F: the K/V blocks go round the ring, cp - 1 hops (each rank meets every block, computing
    attention block by block while the next block is in flight). Backward: the K/V blocks go
    round again (cp - 1 hops) and their gradients dK, dV travel with them, accumulating, back
    to the block's owner (cp hops). Full recomputation re-runs the forward's hops first. cp = 1: none.
    """
    if opts.cp == 1:
        return []
    kv = cp_kv_block_bytes(model, b, opts)
    if opts.cp_comm == "all_gather":
        return _gathered_kv(kv, opts)
    if opts.cp_comm == "a2a":
        return _ulysses(kv, cp_q_block_bytes(model, b, opts), opts)
    hops = opts.cp - 1
    overlap = "attention of the block held"
    out = [Collective("send_recv", kv, "F", "cp", "K/V block", overlaps=overlap, count=hops)]
    if opts.recompute == "full":
        out.append(Collective("send_recv", kv, "I", "cp", "recompute: K/V block", overlaps=overlap, count=hops))
    out.append(Collective("send_recv", kv, "I", "cp", "K/V block", overlaps=overlap, count=hops))
    out.append(Collective("send_recv", kv, "I", "cp", "dK/dV block", overlaps=overlap, count=opts.cp))
    return out


def cp_q_block_bytes(model: ModelConfig, b: int, opts: LayerOptions) -> int:
    """One rank's Q (and O) block: (s / cp) x b x a d_head / t values (latent attention: Q of a (nope + rope) / t;
    its O, a v / t, is no wider)."""
    width = latent_widths(model, opts.tp)[0] if model.mla is not None else model.attention_width // opts.tp
    return opts.local_seq(model) * b * width * model.dtype_bytes


def _ulysses(kv: int, q: int, opts: LayerOptions) -> list[Collective]:
    """--cp-comm-type a2a (DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv:2309.14509; Transformer Engine's
    AttnFuncWithCPAndQKVOA2A): Q, K and V all-to-all'd from sequence shards to head shards before a full-sequence
    attention on heads / cp, O back after it; the backward mirrors them (dO in, dQ and dK/dV out). Each blocks;
    bytes are one rank's buffer (all_to_all's convention)."""
    forward = [Collective("all_to_all", q, "F", "cp", "Q, to heads"),
               Collective("all_to_all", kv, "F", "cp", "K/V, to heads"),
               Collective("all_to_all", q, "F", "cp", "O, to tokens")]
    out = list(forward)
    if opts.recompute == "full":
        out += [Collective(c.kind, c.nbytes, "I", "cp", f"recompute: {c.what}") for c in forward]
    return out + [Collective("all_to_all", q, "I", "cp", "dO, to heads"),
                  Collective("all_to_all", q, "I", "cp", "dQ, to tokens"),
                  Collective("all_to_all", kv, "I", "cp", "dK/dV, to tokens")]


def _gathered_kv(kv: int, opts: LayerOptions) -> list[Collective]:
    """--cp-comm-type all_gather (Transformer Engine's AttnFuncWithCPAndKVAllGather; Llama 3's context parallelism,
    arXiv:2407.21783 section 3.3.2): K and V all-gathered over cp before the attention, blocking; the backward
    gathers them again and reduce-scatters dK/dV. Bytes are the gathered tensor's (cp blocks)."""
    whole = kv * opts.cp
    out = [Collective("all_gather", whole, "F", "cp", "K/V, gathered")]
    if opts.recompute == "full":
        out.append(Collective("all_gather", whole, "I", "cp", "recompute: K/V, gathered"))
    return out + [Collective("all_gather", whole, "I", "cp", "K/V, gathered again"),
                  Collective("reduce_scatter", whole, "I", "cp", "dK/dV")]


__all__ = ["cp_kv_block_bytes", "cp_layer_exchanges", "cp_q_block_bytes"]
