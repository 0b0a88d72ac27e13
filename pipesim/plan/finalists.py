"""The plan's finalists searched again: zb-auto and zb-2p on each finalist's layout, their orders searched
for its costs by the heuristic and then the Zero Bubble paper's ILP (schedules/zb_ilp.py), and zb-v (two
chunks per rank on the V placement) searched by the same ILP over its placement (pipesim/cost/v_search.py)
from the best handcrafted V order within 1F1B's activations.

The walk (pipesim/plan/search.py) tries zb-auto / zb-2p only up to MAX_AUTO_STAGES ranks and with the
heuristic's order, and zb-v with its handcrafted order, because a search is costly per candidate. For the
few layouts that reach the top, it is affordable: each of the best `count` rows' layouts (the same p, tp,
dp, mbs, recompute, ZeRO) is costed again with zb-auto and zb-2p (one stage per rank) and zb-v (where the
layers split over 2p chunks), ILP-searched for `seconds` each where p and m are small enough, checked
against device memory, simulated, and kept when it is new or faster than the row of the same candidate.
Deterministic for a given `seconds` only where the ILP proves its optimum (or does not run); a best-found
order depends on the machine's speed, so this stays opt-in (`--ilp`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipesim.cost.v_search import V_SEARCHED
from pipesim.cost.zb_auto_costs import AUTO_SCHEDULES
from pipesim.plan.backends import visit
from pipesim.plan.evaluate import Evaluator
from pipesim.plan.ranking import PlanRow
from pipesim.plan.space import Candidate, splits

DEFAULT_FINALISTS = 3


@dataclass
class FinalistReport:
    """What the finalists' search did: candidates tried, simulated, and rows it improved or added."""

    tried: int = 0
    simulated: int = 0
    improved: int = 0
    added: int = 0


def searched_alternatives(row: PlanRow, req_layers: int, uneven: bool) -> list[Candidate]:
    """zb-auto and zb-2p on `row`'s layout (one stage per rank) where the layers split over its p ranks, and zb-v
    (2 chunks per rank) where they split over 2p chunks."""
    c = row.candidate
    if c.p < 2 or c.cp != 1:
        return []
    out = [replace(c, schedule=name, v=1) for name in AUTO_SCHEDULES] if splits(req_layers, c.p, uneven) else []
    return out + ([replace(c, schedule=name, v=2) for name in V_SEARCHED] if splits(req_layers, 2 * c.p, uneven)
                  else [])  # the walk's stage cap does not apply


def search_finalists(ev: Evaluator, rows: list[PlanRow], *, count: int = DEFAULT_FINALISTS, seconds: float = 2.0
                     ) -> tuple[list[PlanRow], FinalistReport]:
    """`rows` (sorted, fastest first) with the searched schedules of the top `count` layouts merged in."""
    fin = ev.with_ilp(seconds)  # the walk's costs reused
    report = FinalistReport()
    by_candidate = {r.candidate: r for r in rows}
    tried: set[Candidate] = set()
    for row in rows[:count]:
        for alt in searched_alternatives(row, ev.req.model.layers, ev.req.uneven):
            if alt in tried:
                continue
            tried.add(alt)
            report.tried += 1
            kind, value = visit(fin, alt)
            if kind != "row":
                continue
            report.simulated += 1
            old = by_candidate.get(alt)
            if old is None:
                report.added += 1
            elif value.step_time < old.step_time:
                report.improved += 1
            else:
                continue
            by_candidate[alt] = replace(value, refused_recompute=old.refused_recompute if old else False)
    return sorted(by_candidate.values(), key=PlanRow.sort_key), report


__all__ = ["DEFAULT_FINALISTS", "FinalistReport", "search_finalists"]
