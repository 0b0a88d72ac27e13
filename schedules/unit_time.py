"""Merge fixed per-rank action queues into programs by simulating unit-time steps.

Used by zero-bubble schedules whose order is easiest to state as a rule ("input grads first, weight
grads fill the gaps, never more than `cap` stashed activations") rather than as a formula. Every
compute action counts one time unit here; the resulting order is then fixed and used with any
costs. Each queue runs strictly in order, so the messages between two ranks keep one order.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipesim.ir.schedule import Action, Kind


def _ready(a: Action, done: set[Action], last_stage: int) -> bool:
    """Inputs of `a` are computed: previous stage's F for F; own F and next stage's I for I."""
    s, mb = a.stage, a.microbatch
    if a.kind == Kind.F:
        return s == 0 or Action(s - 1, Kind.F, mb) in done
    return Action(s, Kind.F, mb) in done and (s == last_stage or Action(s + 1, Kind.I, mb) in done)


def merge_unit_time(
    queues: Sequence[Sequence[Sequence[Action]]], num_stages: int, cap: int
) -> tuple[tuple[Action, ...], ...]:
    """Per-rank programs from per-rank F/I queues (listed by preference); W's are added here.

    At each unit step a rank runs, in this priority: the oldest pending W when it holds `cap`
    activations; a ready I at a queue head; a ready F at a queue head if it holds fewer than `cap`;
    the oldest pending W; otherwise it idles. Ties go to the earlier queue. Activations are held
    from F to W (split backward). Raises RuntimeError if the queues deadlock (a bug, not user input).
    """
    ranks = len(queues)
    heads = [[0] * len(qs) for qs in queues]
    pending: list[list[Action]] = [[] for _ in range(ranks)]  # W's whose I is done, oldest first
    live = [0] * ranks  # stashed activations per rank
    done: set[Action] = set()
    programs: list[list[Action]] = [[] for _ in range(ranks)]
    remaining = sum(len(q) for qs in queues for q in qs) * 3 // 2  # every I brings one W
    while remaining:
        step: list[tuple[int, Action]] = []
        for r in range(ranks):
            choice = None
            if live[r] >= cap and pending[r]:
                choice = pending[r].pop(0)
            else:
                ready = [
                    (i, queues[r][i][heads[r][i]])
                    for i in range(len(queues[r]))
                    if heads[r][i] < len(queues[r][i]) and _ready(queues[r][i][heads[r][i]], done, num_stages - 1)
                ]
                ready = [(i, a) for i, a in ready if a.kind == Kind.I or live[r] < cap]
                ready.sort(key=lambda item: item[1].kind != Kind.I)  # stable: queue order breaks ties
                if ready:
                    i, choice = ready[0]
                    heads[r][i] += 1
                elif pending[r]:
                    choice = pending[r].pop(0)
            if choice is not None:
                live[r] += {Kind.F: 1, Kind.W: -1}.get(choice.kind, 0)
                programs[r].append(choice)
                step.append((r, choice))
        if not step:
            raise RuntimeError("unit-time merge deadlocked: queues are inconsistent")
        for r, a in step:
            done.add(a)
            remaining -= 1
            if a.kind == Kind.I:
                pending[r].append(Action(a.stage, Kind.W, a.microbatch))
    return tuple(tuple(p) for p in programs)
