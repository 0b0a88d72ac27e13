"""The per-rank interpreter: walks this rank's lowered program, one action at a time.

All schedule logic comes from the IR (`add_p2p(schedule).programs[pp_rank]`); each action is
turned once into a small closure, so the hot loop is: time, call, append. SENDs are isends whose
handles are waited at the end of the step; RECVs block (executor.pipeline_transfers). After the last
action: the gradient reductions (executor.gradient_sync: the sequence-parallel sum, DualPipe's sum of its
two model replicas' gradients, the DP all-reduce), then one optimizer step (gradient accumulation over
microbatches, losses scaled by 1/m).

With experts over ep > 1 ranks an overlapped forward-and-backward pair (DualPipeV's OVERLAP_F_B) runs for real:
the forward chunk runs up to its first all-to-all, issues it asynchronously, the backward chunk runs whole, and
only then does the forward wait for its exchange and finish (executor.overlap_pairs); `--no-a2a-overlap` runs the same
order back to back instead (the bench's baseline).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from time import perf_counter_ns, sleep

import torch
import torch.distributed as dist
from torch import nn

from executor import rank_status
from executor.expert_dispatch import ExchangeError, set_exchange_observer
from executor.experts import set_routing, shard_experts
from executor.faults import die, inject
from executor.gradient_sync import GradientSync
from executor.mesh import Mesh
from executor.models import StageModule, apply_tensor_parallel, set_recompute, shard_piece
from executor.overlap_pairs import install_pairs
from executor.params import full_parameters
from executor.pipeline_transfers import PipelineTransfers
from executor.run_config import RunConfig
from executor.stage import Stage
from executor.tensor_parallel import set_collective_observer
from executor.timing import RankLog
from executor.workload import BuiltinWorkload
from pipesim.errors import PipesimError
from pipesim.ir.lowering import add_p2p
from pipesim.ir.schedule import COMPUTE, Action, Kind, Schedule


class Runtime:
    """One schedule's training run on this rank."""

    def __init__(self, cfg: RunConfig, schedule: Schedule, mesh: Mesh, device: torch.device,
                 workload=None) -> None:
        """`workload` (executor.workload): the model, loss and data; default pipesim's own from `cfg.model`."""
        grid = cfg.job_for(mesh.world).dims
        if grid != mesh.dims:  # one grid: the mesh is built from the run's job (build_mesh_for)
            raise PipesimError(f"the mesh's {mesh.dims} is not the run's {grid}")
        self.cfg, self.mesh, self.device = cfg, mesh, device
        self.workload = workload = workload if workload is not None else BuiltinWorkload(cfg)
        self.schedule = add_p2p(schedule)
        self.me = mesh.coords.pp
        self.program: tuple[Action, ...] = self.schedule.programs[self.me]
        m = schedule.num_microbatches
        self.m = m
        local = list(schedule.stages_of(self.me))
        # a stage runs its model stage's layers; DualPipe's two chains hold two replicas of each (Schedule.chains)
        ep = (mesh.expert_coords.ep, mesh.dims.ep) if mesh.dims.ep > 1 else None  # draw only this rank's experts
        by_model = workload.stage_modules(schedule.model_stages, sorted({schedule.model_stage(s) for s in local}),
                                          self._prepare, ep)
        modules = {s: by_model[schedule.model_stage(s)] for s in local}
        for module in modules.values():
            if not module.prepared:  # a user's model, or the MLP: prepared whole
                self._prepare(module)
            set_recompute(module, cfg.job.recompute)
        loss = workload.loss
        # sequence parallel: outside the TP layers each TP rank holds 1/tp of every sequence (a transformer, as
        # Megatron) or of every microbatch's rows (the MLP, which has no sequence)
        self.sp = cfg.job.sp and mesh.tp > 1
        self.seq_shards = mesh.tp if self.sp and cfg.model.kind == "gpt" else 1
        scale = 1.0 / (m * mesh.tp) if self.sp else 1.0 / m
        self.stages = {s: Stage(s, modules[s], is_last=schedule.chain_last(s), loss=loss, scale=scale)
                       for s in local}
        # a tied embedding and head on one rank (pp 1, a V schedule) are one Parameter: optimised once
        self.params = list({id(p): p for st in self.stages.values() for p in st.params}.values())
        self.grad_sync = GradientSync(self.schedule, self.me, self.stages, mesh, self.params, sp=self.sp,
                                      bucket_bytes=cfg.bucket_bytes, tied=cfg.model.tied_embeddings)
        # a rank whose stages hold no layer (identity stages, `--layer-split 0,4` on an MLP) has nothing to update
        self.optimizer = (None if not self.params else torch.optim.SGD(self.params, lr=cfg.lr)
                          if cfg.optimizer == "sgd" else torch.optim.Adam(self.params, lr=cfg.lr))
        self.mb_size = workload.batch_rows // (mesh.dp * m)
        self.rows = self.mb_size // mesh.tp if self.sp and self.seq_shards == 1 else self.mb_size  # on this rank
        # the load-balancing loss: a microbatch's rows here, its counts summed over tp where tp splits its groups
        set_routing(modules.values(), scale=1.0 / m, sequences=self.rows, tp_group=mesh.tp_group if self.sp else None,
                    tp=mesh.tp, split_sequences=self.seq_shards > 1)
        model_boundaries = workload.boundaries(schedule.model_stages, self.rows, self.seq_shards)  # out of stage k
        self.transfers = PipelineTransfers(self.schedule, self.me, mesh, model_boundaries, device,
                                           trace=cfg.trace is not None)
        self.log = RankLog(mesh.rank, param_elements=sum(p.numel() for p in self.params))
        # per-step state, keyed (stage, microbatch)
        self.acts: dict[tuple[int, int], torch.Tensor] = {}  # stage inputs waiting for their F
        self.outs: dict[tuple[int, int], torch.Tensor] = {}  # activations waiting for their SEND_F
        self.grads: dict[tuple[int, int], torch.Tensor] = {}  # output grads waiting for their B / I
        self.gins: dict[tuple[int, int], torch.Tensor] = {}  # input grads waiting for their SEND_B
        self.losses: list[torch.Tensor] = []
        self.x_mb: tuple[torch.Tensor, ...] = ()
        self.y_mb: tuple[torch.Tensor, ...] = ()
        self.step_index = 0
        self.ops = [self._op(i, a) for i, a in enumerate(self.program)]
        if cfg.model.moe is not None and mesh.dims.ep > 1 and cfg.a2a_overlap:
            install_pairs(self)  # DualPipe's overlapped F&B pairs (executor.overlap_pairs)
        if dist.get_backend() == "nccl":
            self.transfers.fuse_sends(self.program, self.ops, self.outs, self.gins)
        if cfg.fail_rank == mesh.rank and cfg.fail_at is not None:
            self._arm_fault(Action.parse(cfg.fail_at))
        slow = dict(zip(cfg.slow_ranks, cfg.slow_factors, strict=True)).get(mesh.rank, 1.0)
        if slow != 1.0:  # what-if: this rank's compute stretched (a slow GPU), the extra time slept, its core free
            sync = partial(torch.cuda.synchronize, device) if device.type == "cuda" else None
            self.ops = [partial(_stretched, op, slow - 1.0, sync) if a.kind in COMPUTE else op
                        for op, a in zip(self.ops, self.program, strict=True)]

    # -- building the closures (once) --------------------------------------------------------------

    def local(self, stage: int) -> bool:
        return self.schedule.rank_of(stage) == self.me

    def passes(self, stage: int) -> bool:
        """An identity stage (a chunk with no layers, not its chain's last, which computes the loss): its output
        is its input and its input gradient its output gradient, so autograd has nothing to run."""
        module = self.stages[stage].module
        return isinstance(module, StageModule) and not module.pieces and not self.schedule.chain_last(stage)

    def _op(self, idx: int, a: Action) -> Callable[[], None]:
        s, mb, kind = a.stage, a.microbatch, a.kind
        if kind == Kind.F:
            first, last = self.schedule.chain_first(s), self.schedule.chain_last(s)
            fn = _pass_forward if self.passes(s) else self.stages[s].forward
            return partial(self._forward, fn, s, mb, first, last, not last and self.local(s + 1))
        if kind in (Kind.B, Kind.I):
            fn = self.stages[s].backward if kind == Kind.B else self.stages[s].backward_input
            fn = _pass_gradient if self.passes(s) else fn
            first, last = self.schedule.chain_first(s), self.schedule.chain_last(s)
            return partial(self._backward, fn, s, mb, first, last, not first and self.local(s - 1))
        if kind == Kind.W:
            return partial(_no_weights if self.passes(s) else self.stages[s].backward_weight, mb)
        peer, p2p, recv = self.transfers.peer_of(a), self.transfers.p2p, self.transfers.recv
        if kind == Kind.RECV_F:
            return partial(recv, p2p.act[s][mb], peer, p2p.tag(False, s - 1, mb), self.acts, (s, mb), True)
        if kind == Kind.RECV_B:
            return partial(recv, p2p.grad[s][mb], peer, p2p.tag(True, s + 1, mb), self.grads, (s, mb), False)
        if kind == Kind.SEND_F:
            return partial(self._send, self.outs, (s, mb), peer, p2p.tag(False, s, mb), idx)
        return partial(self._send, self.gins, (s, mb), peer, p2p.tag(True, s, mb), idx)

    def _arm_fault(self, target: Action) -> None:
        if target not in self.program:
            return
        idx = self.program.index(target)
        inner = self.ops[idx]

        def faulty():
            if self.step_index == 0:
                inject(self.cfg.fail_mode, self.mesh.rank, target)
            return inner()

        self.ops[idx] = faulty

    # -- the actions ---------------------------------------------------------------------------------

    def _forward(self, forward: Callable, s: int, mb: int, first: bool, last: bool, next_local: bool) -> None:
        x = self.x_mb[mb] if first else self.acts.pop((s, mb))
        self.deliver(forward(mb, x, self.y_mb[mb] if last else None), s, mb, last, next_local)

    def deliver(self, y: torch.Tensor, s: int, mb: int, last: bool, next_local: bool) -> None:
        """A forward's result: a loss, the next local stage's input, or an activation to send."""
        if last:
            self.losses.append(y)
        elif next_local:
            self.acts[(s + 1, mb)] = y.detach().requires_grad_()
        else:
            self.outs[(s, mb)] = y.detach()

    def _backward(self, fn: Callable, s: int, mb: int, first: bool, last: bool, prev_local: bool) -> None:
        grad_in = fn(mb, None if last else self.grads.pop((s, mb)))
        if first:
            return
        if prev_local:
            self.grads[(s - 1, mb)] = grad_in
        else:
            self.gins[(s, mb)] = grad_in.contiguous()

    def _send(self, source: dict, key: tuple[int, int], dst: int, tag: int, idx: int) -> None:
        self.transfers.send(source.pop(key), dst, tag, self.step_index, idx)

    def _prepare(self, module: nn.Module) -> nn.Module:
        """Its experts and tensor-parallel layers sharded, then moved to this rank's device: one piece of pipesim's
        transformer as it is built (so the rank never holds its stages' unsharded layers at once), or a whole stage
        (the MLP, whose tp pairs layers; a user's model)."""
        mesh = self.mesh
        if mesh.dims.ep > 1:
            shard_experts(module, mesh.expert_coords.ep, mesh.dims.ep, mesh.ep_group)
        if mesh.tp > 1:
            shard = apply_tensor_parallel if isinstance(module, StageModule) else shard_piece
            shard(module, self.cfg.model, mesh.tp_group, sequence_parallel=self.cfg.job.sp)
        return module.to(self.device)

    # -- the step --------------------------------------------------------------------------------------

    def _load_batch(self, step: int) -> None:
        x, y = self.workload.batch(step, self.device)
        rows = self.workload.batch_rows // self.mesh.dp
        d = self.mesh.coords.dp
        self.x_mb = x[d * rows:(d + 1) * rows].chunk(self.m)
        self.y_mb = y[d * rows:(d + 1) * rows].chunk(self.m)
        if self.seq_shards > 1:  # this rank's part of every sequence: its tokens and their targets
            per = x.shape[1] // self.seq_shards
            lo = self.mesh.coords.tp * per
            self.x_mb = tuple(t[:, lo:lo + per] for t in self.x_mb)
            self.y_mb = tuple(t[:, lo:lo + per] for t in self.y_mb)
        elif self.sp:
            lo = self.mesh.coords.tp * self.rows
            self.x_mb = tuple(t[lo:lo + self.rows] for t in self.x_mb)
            self.y_mb = tuple(t[lo:lo + self.rows] for t in self.y_mb)

    def train(self, progress: Callable[[int, float], None] | None = None) -> RankLog:
        """Run all steps; on any error name this rank and the action, and exit non-zero."""
        log, ops, actions = self.log, self.ops, self.log.actions
        where: Action | str = "setup"
        sync = self.device.type == "cuda" and self.cfg.trace is not None
        observe_tp = self.cfg.trace is not None and self.mesh.tp > 1
        if observe_tp:  # TP collectives run inside F/B/I/W; timed only when a trace is asked for
            record = log.tp_collectives.append
            set_collective_observer(lambda kind, t0, t1, nbytes: record((self.step_index, kind, t0, t1, nbytes)))
        observe_ep = self.cfg.trace is not None and self.mesh.dims.ep > 1
        if observe_ep:  # expert all-to-alls, from their issue to their completion
            record_ep = log.tp_collectives.append
            set_exchange_observer(lambda kind, t0, t1, nbytes: record_ep((self.step_index, kind, t0, t1, nbytes)))
        status = rank_status.current()  # what this rank is doing, for the launcher's failure line
        publish = status.doing if status is not None else None
        texts = [rank_status.RankStatus.encode(a.describe()) for a in self.program]
        states = [rank_status.WAITING if a.kind in (Kind.RECV_F, Kind.RECV_B) else rank_status.BUSY
                  for a in self.program]

        def phase(text: str, state: int = rank_status.WAITING) -> str:
            if status is not None:
                status.phase(self.step_index, text, state)
            return text

        try:
            for step in range(self.cfg.steps):
                self.step_index = step
                self._load_batch(step)
                start = perf_counter_ns()
                for idx, op in enumerate(ops):
                    where = self.program[idx]
                    if publish is not None:
                        publish(step, texts[idx], states[idx])
                    t0 = perf_counter_ns()
                    ran = op()
                    if sync:
                        torch.cuda.synchronize(self.device)
                    if ran is None:
                        actions.append((step, idx, t0, perf_counter_ns()))
                    else:  # an overlapped pair gives both actions' intervals
                        actions.extend(ran)
                where = phase("the wait for posted sends")
                self.transfers.wait_sends()
                for reduction in self.grad_sync.reductions:  # executor.gradient_sync
                    where = phase(reduction.text)
                    if reduction.run is not None:
                        t0 = perf_counter_ns()
                        nbytes = reduction.run()
                        log.collectives.append((step, "all_reduce", t0, perf_counter_ns(), nbytes))
                where = phase("the optimizer step", rank_status.BUSY)
                if self.optimizer is not None:
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
                if self.losses:
                    log.losses.append(float(torch.stack(self.losses).sum()) / self.m)
                    self.losses.clear()
                end = perf_counter_ns()
                log.steps.append((start, end))
                if progress is not None:
                    progress(step, (end - start) / 1e9)
        except Exception as exc:  # noqa: BLE001 - any failure ends the run with a named rank and action
            if isinstance(exc, ExchangeError) and isinstance(where, Action):
                where = f"the expert all-to-all of {where.describe()}"
            die(self.mesh.rank, where, exc)
        if observe_tp:
            set_collective_observer(None)
        if observe_ep:
            set_exchange_observer(None)
        done = self.transfers.close()
        if done is not None:
            log.sends_done = done
        return log

    def named_parameters(self) -> dict[str, torch.Tensor]:
        """This rank's parameters under their full-model names (TP shards gathered to full tensors)."""
        return full_parameters(self.stages, self.mesh)


def _stretched(op: Callable[[], None], extra: float, sync: Callable[[], None] | None,
               clock: Callable[[], int] = perf_counter_ns, pause: Callable[[float], None] = sleep) -> None:
    """Run a compute action, then sleep `extra` times its duration: the action takes (1 + extra) x as long."""
    t0 = clock()
    op()
    if sync is not None:
        sync()
    pause(extra * (clock() - t0) / 1e9)


def _pass_forward(mb: int, x: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
    """An identity stage's F: the received tensor is the output (sent on, or handed to the next local stage)."""
    return x


def _pass_gradient(mb: int, grad: torch.Tensor | None) -> torch.Tensor | None:
    """An identity stage's B or I: the output gradient is the input gradient."""
    return grad


def _no_weights(mb: int) -> None:
    """An identity stage's W: it has no weights."""
