"""Transformer Engine's userbuffers: Megatron-core's `--tp-comm-overlap`, the sequence-parallel collectives inside
their GEMMs.

With sequence parallelism each linear of a layer gathers its input over tp before its GEMM (QKV, FC1; in backward
the projection's and FC2's input gradients) or reduce-scatters its output after it (projection, FC2; in backward
the QKV's and FC1's input gradients). Without the overlap pipesim runs the forward ones blocking and the backward
ones beside the next GEMM on NCCL (pipesim.comm.overlap_interference). TE's userbuffers run each beside its own GEMM
by one of three methods (transformer_engine/pytorch/module/base.py @ v2.1, initialize_ub):

- ring_exchange (qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad): the GEMM cut into n = tp chunks of its rows, each
  computed while the next chunk arrives over the copy engines (use_ce): no SM held, the first chunk local.
  pair = g + (n - 1) max(g, c), g the chunk's GEMM, c = C / (n - 1) one hop. With aggregate each GEMM takes two
  chunks: n = tp / 2 GEMMs, after one chunk from the pair partner has arrived (split_overlap_ag's 'initial 1X input
  chunk exchange between neighboring peers', before the first GEMM) and then 2-chunk hops:
  pair = c + g + (n - 1) max(g, 2c), c = C / (tp - 1).
- pipeline (proj_fprop, fc2_fprop): the GEMM cut into n = num_splits chunks, each chunk's output reduce-scattered by
  a kernel on num_sm SMs while the next chunk computes; the last chunk's part exposed.
  pair = g + (n - 1) max(g, c) + c, c = C / n.
- bulk (qkv_dgrad, fc1_dgrad: the saved input gathered again beside the input-gradient GEMM; qkv_wgrad, fc1_wgrad:
  the input gradient reduce-scattered beside the weight-gradient GEMM): the whole collective beside the whole GEMM
  on num_sm SMs; without set_sm_margin the GEMM gets them back when it ends (exposed_beside's rule), with it it runs
  on SMs - num_sm throughout: pair = max(G', C).

Around the ring each method stages bytes on the compute stream, exposed: a ring exchange's reduce-scatter sums its
tp partial chunks in one memory-bound kernel after the ring (TE v2.1 comm_gemm_overlap.cpp
CommOverlapP2PBase::split_overlap_rs `reduce_bf16`, torch's `_fused_matmul_reduce_scatter_impl` `reduce_fn` over the
stacked partials): it reads the whole tensor and writes one chunk, S (1 + 1 / tp) bytes; an all-gather whose input
is not written into the buffer by its producer first copies its local chunk in, 2 S / tp bytes (TE's
`copy_into_buffer` of the output gradient and of the saved input re-gathered for the wgrad; torch's `copy_shard` into
the local p2p buffer before the first matmul, which its comment says it gives up overlapping). TE's forward LayerNorm
writes into the buffer itself (`get_buffer(..., local_chunk=True)`), and a pipelined or bulk reduce-scatter reduces
inside its communication kernel.

g and G' come from the wave model (pipesim.device.gemm) on the SMs the communication leaves (SMs - num_sm where it
holds them: pipeline, bulk, a ring exchange with set_sm_margin), taken as a ratio to the GEMM's time on all SMs so that
a calibrated GEMM keeps its calibration; C is the collective as NCCL would run it over the same links
(pipesim.comm.collective_algos). The collective adds pair - G to the GEMM's own seconds.

Defaults are TE's get_default_config (v2.0 on: TE 1.x held no SM margin for any method, which
bench/tp_overlap/te_v1.14_defaults.yaml spells); `--tp-comm-overlap-cfg FILE` reads Megatron-core's YAML of the same
keys (what NeMo's recipes pass as tp_comm_overlap_cfg). Only the dense linears' collectives ride on userbuffers
here; latent attention's, the experts' and the head's keep pipesim's NCCL model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from pipesim.comm.overlap_interference import HidingGemm, exposed_beside
from pipesim.device.gemm import gemm_time
from pipesim.device.kernels import memory_bound_time
from pipesim.device.profile import DeviceProfile
from pipesim.errors import PipesimError, refuse_special_file

METHODS = ("ring_exchange", "pipeline", "bulk")
# transformer_engine/pytorch/module/base.py @ v2.1, initialize_ub: the default method of each userbuffers GEMM
DEFAULT_METHOD = {"qkv_fprop": "ring_exchange", "fc1_fprop": "ring_exchange", "proj_dgrad": "ring_exchange",
                  "fc2_dgrad": "ring_exchange", "proj_fprop": "pipeline", "fc2_fprop": "pipeline",
                  "qkv_dgrad": "bulk", "qkv_wgrad": "bulk", "fc1_dgrad": "bulk", "fc1_wgrad": "bulk"}
# add_ub's keywords that change no timing pipesim models (the CGA size, buffer dtype, stream priorities, which
# collective a name is: fixed by the name here)
TIMELESS_KEYS = ("cga_size", "fp8_buf", "comm_priority", "gemm_priority", "is_reduce_scatter",
                 "pipeline_rs_overlap_first_gemm")
# which of pipesim's tp collectives (pipesim.model.layer_collectives' `what`) rides on which userbuffers GEMM, and
# the kernel (pipesim.model.layer_kernels' name) it runs inside
UB_GEMMS = {"attention input (before QKV)": ("qkv_fprop", "QKV"),
            "attention output": ("proj_fprop", "projection"),
            "MLP input (before MLP up)": ("fc1_fprop", "FC1"),
            "MLP output": ("fc2_fprop", "FC2"),
            "attention output gradient": ("proj_dgrad", "projection dgrad"),
            "attention input, again (for the QKV weight gradient)": ("qkv_dgrad", "QKV dgrad"),
            "attention input gradient": ("qkv_wgrad", "QKV wgrad"),
            "MLP output gradient": ("fc2_dgrad", "FC2 dgrad"),
            "MLP input, again (for the MLP up weight gradient)": ("fc1_dgrad", "FC1 dgrad"),
            "MLP input gradient": ("fc1_wgrad", "FC1 wgrad")}
RECOMPUTED = "recompute: "  # a forward collective re-run in the backward (pipesim.model.layer_collectives)
# the GEMMs whose gathered tensor TE copies into the userbuffer on the compute stream first (v2.1 module/base.py
# grad_output_preprocess: copy_into_buffer(grad_output); layernorm_linear.py and layernorm_mlp.py backward:
# copy_into_buffer(ln_out) before the bulk re-gather); qkv_fprop's and fc1_fprop's LayerNorm writes into it
TE_COPIES_IN = ("proj_dgrad", "fc2_dgrad", "qkv_dgrad", "fc1_dgrad")


@dataclass(frozen=True)
class UbMethod:
    """How one userbuffers GEMM overlaps its collective (TE's add_ub keywords)."""

    method: str  # "ring_exchange", "pipeline" or "bulk"
    num_sm: int  # SMs its communication kernel holds (a ring exchange over the copy engines holds none)
    set_sm_margin: bool  # the GEMM runs on SMs - num_sm throughout
    num_splits: int  # chunks the GEMM is cut into; 0: tp (a ring exchange's default)
    use_ce: bool = True  # a ring exchange over the copy engines (else on num_sm SMs)
    aggregate: bool = False  # a ring exchange whose GEMMs each take two arrived chunks (half as many GEMMs)
    copies_in: bool = False  # an all-gather's local chunk copied into the buffer on the compute stream first

    @classmethod
    def default(cls, name: str, method: str | None = None) -> UbMethod:
        """TE v2.1's get_default_config for `name` run by `method` (default: the name's own)."""
        method = method or DEFAULT_METHOD[name]
        ring = method == "ring_exchange"
        return cls(method, 1 if ring else 16, not ring, 0 if ring else 4, copies_in=name in TE_COPIES_IN)

    def held_sms(self) -> int:
        """SMs the GEMM loses while the collective runs."""
        if self.method == "ring_exchange" and self.use_ce:
            return self.num_sm if self.set_sm_margin else 0
        return self.num_sm

    def chunks(self, tp: int) -> int:
        """GEMMs the overlap cuts its GEMM into: bulk 1; a ring exchange tp (num_splits), half with aggregate."""
        if self.method == "bulk":
            return 1
        n = self.num_splits or (tp if self.method == "ring_exchange" else 4)
        return max(1, n // 2) if self.aggregate and self.method == "ring_exchange" else n


@dataclass(frozen=True)
class UbConfig:
    """Every userbuffers GEMM's method: TE's defaults, overridden per name by a tp-comm-overlap-cfg file."""

    methods: tuple[tuple[str, UbMethod], ...] = tuple((n, UbMethod.default(n)) for n in DEFAULT_METHOD)
    source: str = ""  # the YAML file read ("" TE's defaults)
    async_tp: bool = False  # torch's micro-pipelined TP (`torch_async_tp`), not Transformer Engine's userbuffers

    def method(self, name: str) -> UbMethod:
        return dict(self.methods)[name]

    def flags(self) -> list[str]:
        """Megatron-core's flags (and pipesim's) that give this config; --async-tp for torch's."""
        if self.async_tp:
            return ["--async-tp"]
        return ["--tp-comm-overlap"] + (["--tp-comm-overlap-cfg", self.source] if self.source else [])

    @classmethod
    def torch_async_tp(cls) -> UbConfig:
        """torchtitan's async TP (--parallelism.enable_async_tensor_parallel): torch.compile's micro-pipelining puts
        every sequence-parallel all-gather and reduce-scatter inside its matmul (torch/distributed/_symmetric_memory
        @ 006b161: `_pipelined_all_gather_and_consume` copies each peer's shard over the copy engines, `copy_` on a
        second stream, while the shard before it is multiplied, the local one first; `_pipelined_produce_and_all2all`
        multiplies each peer's chunk and copies it out the same way): every name a ring exchange in tp chunks over
        the copy engines, no SM held, each gather's local shard copied into the p2p buffer first."""
        ring = UbMethod("ring_exchange", num_sm=0, set_sm_margin=False, num_splits=0, use_ce=True, copies_in=True)
        return cls(tuple((n, ring) for n in DEFAULT_METHOD), async_tp=True)

    @classmethod
    def from_yaml(cls, path: str) -> UbConfig:
        """Megatron-core's --tp-comm-overlap-cfg: a YAML mapping of userbuffers names to add_ub's keywords."""
        import yaml  # local import: only a run given a config file needs PyYAML at start-up

        refuse_special_file(path, f"--tp-comm-overlap-cfg {path}")
        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as err:
            raise PipesimError(f"--tp-comm-overlap-cfg {path}: {err.strerror or err}") from None
        except UnicodeDecodeError as err:
            raise PipesimError(f"--tp-comm-overlap-cfg {path}: not UTF-8 (byte {err.start}: {err.reason})") from None
        except yaml.YAMLError as err:
            raise PipesimError(f"--tp-comm-overlap-cfg {path}: not YAML ({str(err).splitlines()[0]})") from None
        return cls.from_mapping(data, path)

    @classmethod
    def from_mapping(cls, data: object, source: str) -> UbConfig:
        """The config of a {name: {keyword: value}} mapping, each name's keywords over its TE default."""
        if not isinstance(data, dict):
            raise PipesimError(f"--tp-comm-overlap-cfg {source}: expected a mapping of userbuffers names "
                               f"({', '.join(DEFAULT_METHOD)}) to their settings")
        methods = dict(cls().methods)
        for name, keys in data.items():
            if name not in DEFAULT_METHOD:
                raise PipesimError(f"--tp-comm-overlap-cfg {source}: unknown userbuffers name {name!r}; choose "
                                   f"from {', '.join(DEFAULT_METHOD)}")
            methods[name] = _method(name, keys or {}, source)
        return cls(tuple(methods.items()), source)


def _method(name: str, keys: object, source: str) -> UbMethod:
    if not isinstance(keys, dict):
        raise PipesimError(f"--tp-comm-overlap-cfg {source}: {name} needs a mapping of settings")
    where = f"--tp-comm-overlap-cfg {source}: {name}"
    method = keys.get("method", DEFAULT_METHOD[name])
    if method not in METHODS:
        raise PipesimError(f"{where}: unknown method {method!r}; choose {', '.join(METHODS)}")
    out = UbMethod.default(name, method)
    for key, value in keys.items():
        if key == "method" or key in TIMELESS_KEYS:
            continue
        if key == "atomic_gemm":
            if value:
                raise PipesimError(f"{where}: atomic_gemm is not modelled (TE's atomic GEMM overlap, an FP8 beta)")
            continue
        if key in ("num_sm", "num_splits"):
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if key == "num_sm" else 0):
                raise PipesimError(f"{where}: {key} must be a {'positive' if key == 'num_sm' else 'non-negative'} "
                                   f"integer, got {value!r}")
            out = replace(out, **{key: value})
        elif key in ("set_sm_margin", "use_ce", "aggregate"):
            if value not in (True, False, 0, 1):
                raise PipesimError(f"{where}: {key} must be true or false, got {value!r}")
            out = replace(out, **{key: bool(value)})
        else:
            raise PipesimError(f"{where}: unknown setting {key!r}")
    return out


def ub_gemm(what: str) -> tuple[str, str] | None:
    """(userbuffers name, kernel name) of the GEMM a tp collective rides on, or None (it keeps NCCL's model)."""
    return UB_GEMMS.get(what.removeprefix(RECOMPUTED))


def _seconds(gemm: HidingGemm, chunks: int, held: int) -> float:
    """The GEMM cut into `chunks` along its rows, on SMs - `held`: its seconds (a ratio to the wave model's whole
    GEMM on every SM, times the stage's timing of it)."""
    g = gemm.gemm
    return gemm.seconds * _split_ratio(g.m, g.n, g.k, g.batch, g.c_bytes, gemm.dtype, gemm.profile, chunks, held)


@lru_cache(maxsize=1 << 14)
def _split_ratio(m: int, n: int, k: int, batch: int, c_bytes: int, dtype: str, profile: DeviceProfile, chunks: int,
                 held: int) -> float:
    """chunks x t(m / chunks rows on SMs - held) / t(m on every SM), of the wave model (every compute action asks
    again: cached, as overlap_interference's ratio)."""
    whole = gemm_time(m, n, k, dtype, profile, batch=batch, c_bytes=c_bytes).seconds
    part = gemm_time(math.ceil(m / chunks), n, k, dtype, profile, batch=batch, sms=profile.sms - held,
                     c_bytes=c_bytes).seconds
    return chunks * part / whole


def staged_bytes(kind: str, nbytes: int, method: UbMethod, tp: int) -> float:
    """Bytes the method reads and writes on the compute stream around its ring for a `kind` collective of the full
    tensor's `nbytes` (the module's rule): a ring exchange's reduce-scatter sums tp partials, an all-gather that
    copies in stages its local chunk."""
    if kind == "reduce_scatter" and method.method == "ring_exchange":
        return nbytes * (1 + 1 / tp)
    if kind == "all_gather" and method.copies_in:
        return 2 * nbytes / tp
    return 0.0


def exposed_ub(collective: float, gemm: HidingGemm, method: UbMethod, tp: int, *, kind: str, nbytes: int) -> float:
    """Seconds a userbuffers `kind` collective of `nbytes` (the full tensor) and `collective` seconds adds to its
    GEMM's own: the pair's formula, and its staging kernel exposed (the module's formulas)."""
    staged = staged_bytes(kind, nbytes, method, tp)
    staging = memory_bound_time(staged, gemm.profile).seconds if staged else 0.0
    if method.aggregate and kind != "all_gather":  # split_overlap_rs has no aggregated ring: TE ignores the key
        method = replace(method, aggregate=False)
    return staging + _paired(collective, gemm, method, tp)


def _paired(collective: float, gemm: HidingGemm, method: UbMethod, tp: int) -> float:
    """Seconds the collective's overlap with its GEMM adds to the GEMM's own (ring exchange, pipeline, bulk)."""
    n, held = method.chunks(tp), method.held_sms()
    if method.method == "bulk":
        beside = _seconds(gemm, 1, held)
        if method.set_sm_margin:
            return max(beside, collective) - gemm.seconds
        return exposed_beside(collective, gemm.seconds, beside)
    g = _seconds(gemm, n, held) / n
    if n == 1:  # one chunk: nothing to overlap it with
        return collective + g - gemm.seconds
    if method.method == "ring_exchange" and method.aggregate:
        hop = collective / (tp - 1)  # one chunk
        return hop + g + (n - 1) * max(g, 2 * hop) - gemm.seconds
    if method.method == "ring_exchange":
        return g + (n - 1) * max(g, collective / (n - 1)) - gemm.seconds
    c = collective / n
    return g + (n - 1) * max(g, c) + c - gemm.seconds


__all__ = ["DEFAULT_METHOD", "METHODS", "TE_COPIES_IN", "UB_GEMMS", "UbConfig", "UbMethod", "exposed_ub",
           "staged_bytes", "ub_gemm"]
