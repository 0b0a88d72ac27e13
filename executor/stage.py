"""One pipeline stage: forward, full backward, and backward split into I (input grad) and W (weight grad).

The split follows the technique of torch.distributed.pipelining's `_backward.py`: I runs autograd
to the stage input only, with hooks on the graph nodes where weight branches join the input path
("intermediates") capturing the gradients that reach them; W later restarts autograd at those
nodes, with the captured gradients, towards the parameters only. No work is done twice.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable

import torch
from torch import nn
from torch.autograd.graph import GradientEdge, Node


def _node(t: torch.Tensor) -> Node | None:
    """The autograd node producing `t`; for a leaf, its (lazily created) gradient accumulator."""
    if t.grad_fn is not None:
        return t.grad_fn
    if not t.requires_grad:
        return None
    return t.view_as(t).grad_fn.next_functions[0][0]


def _consumers(root: Node) -> dict[Node, list[Node]]:
    """Reverse edges of the backward graph below `root`: node -> nodes that feed gradient into it."""
    rev: dict[Node, list[Node]] = defaultdict(list)
    seen, queue = {root}, deque([root])
    while queue:
        node = queue.popleft()
        for nxt, _ in node.next_functions:
            if nxt is None:
                continue
            rev[nxt].append(node)
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return rev


def _upward(starts: list[Node], rev: dict[Node, list[Node]], stop: set[Node]) -> tuple[set[Node], set[Node]]:
    """Nodes reachable from `starts` towards the output, not passing `stop`; also the `stop` nodes hit."""
    seen, hit, queue = set(starts), set(), deque(starts)
    while queue:
        for up in rev.get(queue.popleft(), ()):
            if up in stop:
                hit.add(up)
            elif up not in seen:
                seen.add(up)
                queue.append(up)
    return seen, hit


class _WeightGroup:
    """Parameters whose gradient branches join the input path at the same intermediates."""

    __slots__ = ("params", "intermediates", "grads")

    def __init__(self, params: list[Node], intermediates: list[Node]) -> None:
        self.params = params
        self.intermediates = intermediates
        self.grads: list[tuple | None] = [None] * len(intermediates)


def backward_input(out: torch.Tensor, grad_out: torch.Tensor | None, inp: torch.Tensor,
                   params: list[nn.Parameter]) -> tuple[torch.Tensor, list[_WeightGroup]]:
    """Input gradient only; returns it and the saved state `backward_weight` needs."""
    root = out.grad_fn
    rev = _consumers(root)
    input_path, _ = _upward([_node(inp)], rev, set())
    by_node = {_node(p): p for p in params}
    groups: dict[Node, _WeightGroup] = {}
    loose: list[nn.Parameter] = []  # parameters not joining the input path: done in this pass
    for acc, param in by_node.items():
        if acc not in rev:
            continue  # unused by this stage's output
        _, hit = _upward([acc], rev, input_path)
        if not hit:
            loose.append(param)
            continue
        merged = {id(groups[h]): groups[h] for h in hit if h in groups}
        group = _WeightGroup([acc], sorted(hit, key=id))
        for other in merged.values():
            group.params += other.params
            group.intermediates = sorted(set(group.intermediates) | set(other.intermediates), key=id)
        group.grads = [None] * len(group.intermediates)
        for h in group.intermediates:
            groups[h] = group
    unique = list({id(g): g for g in groups.values()}.values())
    handles = []
    for group in unique:
        for i, node in enumerate(group.intermediates):
            handles.append(node.register_prehook(_capture(group, i)))
    try:
        wanted = [inp] + loose
        grads = torch.autograd.grad(out, wanted, grad_out, retain_graph=True, allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    for param, g in zip(loose, grads[1:], strict=True):
        if g is not None:
            param.grad = g if param.grad is None else param.grad.add_(g)  # in place, as autograd does
    if not out._is_view():
        out.detach_()  # the output side of the graph is no longer needed
    return grads[0], unique


def _capture(group: _WeightGroup, i: int) -> Callable:
    def hook(grad_outputs):
        group.grads[i] = grad_outputs

    return hook


def backward_weight(groups: list[_WeightGroup], params: list[nn.Parameter], *, one_call: bool = False) -> None:
    """Weight gradients from the state `backward_input` saved; accumulates into `.grad`.

    `one_call`: all groups in one autograd call. A recomputing stage (torch.utils.checkpoint) re-runs
    a layer's forward once per autograd call that needs it, so W then re-runs it once, not once per group.
    Each intermediate's incoming gradient is pinned to the captured one, so nothing counts twice.
    """
    by_node = {_node(p): p for p in params}
    for batch in ([groups] if one_call else [[g] for g in groups]):
        edges, grads, handles, accs = [], [], [], []
        for group in batch:
            accs += group.params
            for node, saved in zip(group.intermediates, group.grads, strict=True):
                if saved is None:
                    continue
                for i, g in enumerate(saved):
                    if g is not None:
                        edges.append(GradientEdge(node, i))
                        grads.append(g)
                if one_call or len(group.intermediates) > 1:  # an intermediate below another must not count twice
                    handles.append(node.register_prehook(lambda _g, s=saved: s))
        try:
            if edges:
                dws = torch.autograd.grad(edges, [GradientEdge(a, 0) for a in accs], grads, allow_unused=True)
                for acc, dw in zip(accs, dws, strict=True):
                    if dw is None:
                        continue
                    param = by_node[acc]
                    param.grad = dw if param.grad is None else param.grad.add_(dw)  # in place: no new buffer
        finally:
            for h in handles:
                h.remove()


class Stage:
    """A stage module plus the per-microbatch state between its F and its B (or I and W)."""

    def __init__(self, index: int, module: nn.Module, *, is_last: bool,
                 loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None, scale: float) -> None:
        self.index = index
        self.module = module
        self.is_last = is_last
        self.loss = loss
        self.scale = scale  # 1 / microbatches: gradient accumulation averages the microbatch losses
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.recomputes = bool(getattr(module, "checkpointed", None))  # full recomputation: W in one autograd call
        self._inp: dict[int, torch.Tensor] = {}
        self._out: dict[int, torch.Tensor] = {}
        self._grad: dict[int, torch.Tensor | None] = {}
        self._weight_state: dict[int, list[_WeightGroup] | None] = {}

    def forward(self, mb: int, x: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
        """Returns the activation to pass on, or (last stage) the unscaled loss, detached."""
        return self._keep(mb, x, self.module(x), target)

    def forward_steps(self, mb: int, x: torch.Tensor, target: torch.Tensor | None = None):
        """`forward` as a generator yielding the module's all-to-alls in flight (executor.experts.drive runs it)."""
        return self._keep(mb, x, (yield from self.module.steps(x)), target)

    def _keep(self, mb: int, x: torch.Tensor, out: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
        if self.is_last:
            loss = self.loss(out, target)
            out = loss * self.scale
            self._out[mb] = out
            self._inp[mb] = x
            return loss.detach()
        self._out[mb] = out
        self._inp[mb] = x
        return out

    def backward(self, mb: int, grad_out: torch.Tensor | None) -> torch.Tensor | None:
        """Full backward (B): accumulates weight grads, returns the input grad (None on the first stage)."""
        out, x = self._out.pop(mb), self._inp.pop(mb)
        torch.autograd.backward(out, grad_out)
        return x.grad if x.requires_grad else None

    def backward_input(self, mb: int, grad_out: torch.Tensor | None) -> torch.Tensor | None:
        """I: input grad only. A stage whose input needs no grad (the first) defers all its work to W."""
        x = self._inp[mb]
        if not x.requires_grad:
            self._grad[mb] = grad_out
            self._weight_state[mb] = None
            return None
        out = self._out.pop(mb)
        dx, state = backward_input(out, grad_out, x, self.params)
        self._inp.pop(mb)
        self._weight_state[mb] = state
        return dx

    def backward_weight(self, mb: int) -> None:
        """W: weight grads of microbatch `mb`, after its I."""
        state = self._weight_state.pop(mb)
        if state is None:
            self._inp.pop(mb)
            torch.autograd.backward(self._out.pop(mb), self._grad.pop(mb))
            return
        backward_weight(state, self.params, one_call=self.recomputes)
