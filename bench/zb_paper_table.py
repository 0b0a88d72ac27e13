"""The Zero Bubble paper's Table 5 (bubble rates), reproduced from its own profiled times.

Source: Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, arXiv 2401.10241v1: Table 9 (appendix D,
"Profiled time of T_F, T_B, T_W and T_comm", in ms) and Table 5 (section 5.3, bubble rates). The bubble rate
is the paper's: (cost - m (T_F + T_B + T_W)) / cost, cost the longest stage's span (its first F's start to
its last action's end) with T_comm a latency between stages. 1F1B, ZB-H1 and ZB-H2 are pipesim's registered
orders timed so; ZB-1p and ZB-2p are the paper's heuristic (schedules/zb_heuristic.py) with the activation
limit p M_B and 2p M_B, and M_W = M_B / 2: the memory units of the authors' scheduler (F +2, B -1, W -1 in
sail-sg/zero-bubble-pipeline-parallelism, megatron/core/pipeline_parallel/zb_schedules.py at ed85b11c).
The paper's 1F1B-I column (one layer per chunk) is not reproduced.

    python bench/zb_paper_table.py            # prints the markdown table docs/schedules.md holds
"""

from __future__ import annotations

from dataclasses import dataclass

import schedules
from schedules.zb_heuristic import paper_heuristic, span
from schedules.zb_inputs import AutoCosts

COLUMNS = ("1F1B", "ZB-H1", "ZB-H2", "ZB-1p", "ZB-2p")
HANDCRAFTED = {"1F1B": "1f1b", "ZB-H1": "zb-h1", "ZB-H2": "zb-h2"}
SEARCHED = {"ZB-1p": 1, "ZB-2p": 2}  # activation limit in multiples of p M_B
WEIGHT_SHARE = 0.5  # M_W / M_B in the authors' scheduler


@dataclass(frozen=True)
class Setting:
    """One row of the paper's Table 9 (ms) with its published Table 5 bubble rates."""

    model: str
    p: int
    m: int
    f: float  # ms
    b: float  # ms
    w: float  # ms
    comm: float  # ms
    published: tuple[float, ...]  # Table 5, in COLUMNS order

    def costs(self, limit_multiple: float) -> AutoCosts:
        return AutoCosts.uniform(self.p, self.f, self.b, self.w, self.comm,
                                 limit_microbatches=limit_multiple * self.p, weight_share=WEIGHT_SHARE)


SETTINGS = (
    Setting("1.5B", 8, 24, 18.522, 18.086, 9.337, 0.601, (0.2431, 0.1585, 0.1083, 0.1585, 0.0433)),
    Setting("1.5B", 8, 32, 18.513, 18.086, 9.331, 0.626, (0.1985, 0.1242, 0.0837, 0.1242, 0.0039)),
    Setting("1.5B", 8, 64, 18.546, 18.097, 9.321, 0.762, (0.1240, 0.0674, 0.0444, 0.0674, 0.0026)),
    Setting("6.2B", 8, 24, 29.718, 29.444, 19.927, 0.527, (0.2347, 0.1323, 0.0698, 0.1323, 0.0029)),
    Setting("6.2B", 8, 32, 29.802, 29.428, 19.530, 0.577, (0.1898, 0.1045, 0.0559, 0.1045, 0.0022)),
    Setting("6.2B", 8, 64, 29.935, 29.621, 19.388, 0.535, (0.1091, 0.0554, 0.0294, 0.0554, 0.0010)),
    Setting("14.6B", 16, 48, 11.347, 11.248, 8.132, 0.377, (0.2552, 0.1397, 0.0672, 0.1397, 0.0066)),
    Setting("14.6B", 16, 64, 11.307, 11.254, 8.101, 0.379, (0.2082, 0.1088, 0.0516, 0.1088, 0.0054)),
    Setting("14.6B", 16, 128, 11.325, 11.308, 8.109, 0.378, (0.1251, 0.0576, 0.0266, 0.0576, 0.0028)),
    Setting("28.3B", 32, 96, 10.419, 10.207, 7.715, 0.408, (0.2646, 0.1421, 0.0641, 0.1421, 0.0038)),
    Setting("28.3B", 32, 128, 10.408, 10.204, 7.703, 0.408, (0.2168, 0.1106, 0.0490, 0.1106, 0.0029)),
    Setting("28.3B", 32, 256, 10.402, 10.248, 7.698, 0.460, (0.1352, 0.0594, 0.0257, 0.0594, 0.0018)),
)


def bubble_rate(s: Setting, cost: float) -> float:
    return (cost - s.m * (s.f + s.b + s.w)) / cost


def reproduce(s: Setting) -> tuple[float, ...]:
    """pipesim's bubble rates of one setting, in COLUMNS order."""
    out = []
    for col in COLUMNS:
        if col in HANDCRAFTED:
            cost = span(s.p, schedules.build(HANDCRAFTED[col], s.p, s.m).programs, s.costs(1))
        else:
            cost = paper_heuristic(s.p, s.m, s.costs(SEARCHED[col]))[0]
        out.append(bubble_rate(s, cost))
    return tuple(out)


def markdown() -> str:
    """The table docs/schedules.md holds: each cell pipesim's rate, then the paper's in brackets."""
    head = "| model | p | m | " + " | ".join(COLUMNS) + " |"
    lines = [head, "|" + "---|" * (3 + len(COLUMNS))]
    for s in SETTINGS:
        cells = [f"{ours:.4f} ({paper:.4f})" for ours, paper in zip(reproduce(s), s.published)]
        lines.append(f"| {s.model} | {s.p} | {s.m} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
