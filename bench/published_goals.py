"""Issue 33's goals over the results of `pipesim bench published` (bench/bench_published.py): pure arithmetic on the
report's Result objects (bench/published_report.py), so that it is tested on hand-made results.

Three summaries, as issue 33 states them:

- the reference goal: the rows of every source whose `goal` is "reference" (shared/reference/published.md's,
  `in_published_md = true`, and shared/reference/published_modern.md's): median |error| <= 5 %, max <= 10 %;
- every published row the bench reports: median |error| <= 8 %, max <= 20 %, and no systematic optimism: the
  geometric mean of predicted / published speed between 0.95 and 1.05;
- rankings: for every pair of published rows of the same model on the same cluster, its GPU count included
  (Row.cluster), with the same metric, whether the predicted order of their speeds is the published one; the
  fraction of pairs that agree (goal >= 90 %). A row's speed is its figure for a throughput and work / figure for a
  time (Row.work: tokens per GPU per iteration), so that layouts of different batch or sequence compare per token.
  Pairs the publication cannot order (equal figures) are counted apart, not ranked, and so are pairs of one command
  (the same configuration published twice, at two software versions: the simulator cannot order them).

A source's `goal` ("reference" or "reported") may be left out: it is then "reference" for the sources of
published.md (`in_published_md`, true when absent, as the issue-15 goal reads it) and "reported" for the others, so
that a rows file written before issue 33 reads as it did.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

REF_MEDIAN, REF_MAX = 0.05, 0.10  # issue 33: the reference rows (old and new files together)
ALL_MEDIAN, ALL_MAX = 0.08, 0.20  # issue 33: every published row
SPEED_LOW, SPEED_HIGH = 0.95, 1.05  # issue 33: geometric mean of predicted / published speed
RANK_GOAL = 0.90  # issue 33: the predicted order matches the published one in at least 90 % of pairs
GOALS = ("reference", "reported")


def source_goal(key: str, source: dict) -> str:
    """The goal a source's rows join: its `goal`, else "reference" for published.md's sources (in_published_md,
    true when absent) and "reported" for the others. ValueError naming the source for any other value."""
    goal = source.get("goal", "reference" if source.get("in_published_md", True) else "reported")
    if goal not in GOALS:
        raise ValueError(f"source {key}: goal must be one of {', '.join(GOALS)}, got {goal!r}")
    return goal


def reference_sources(sources: dict[str, dict]) -> set[str]:
    """The keys of the sources whose rows form the reference goal."""
    return {k for k, s in sources.items() if source_goal(k, s) == "reference"}


def speed(row, value: float) -> float:
    """A figure as a speed: itself for a throughput, the row's work per GPU over it for a time."""
    return value if row.faster_is_higher else row.work / value


@dataclass(frozen=True)
class RankPair:
    """Two published rows of one model on one cluster, and which of them is faster, published and predicted."""

    a: str
    b: str
    published_a_faster: bool
    predicted_a_faster: bool

    @property
    def agrees(self) -> bool:
        return self.published_a_faster == self.predicted_a_faster


@dataclass(frozen=True)
class Ranking:
    """The ranked pairs, how many pairs of published rows the publication could not order (equal figures), and how
    many share one command (one configuration measured twice: the simulator gives both one figure)."""

    pairs: tuple[RankPair, ...]
    ties: int
    same_command: int = 0

    @property
    def agree(self) -> int:
        return sum(p.agrees for p in self.pairs)

    @property
    def fraction(self) -> float:
        """Pairs whose predicted order is the published one, over the ranked pairs; NaN when none."""
        return self.agree / len(self.pairs) if self.pairs else float("nan")


def ranking(results: list) -> Ranking:
    """Every pair of simulated published rows with the same cluster (not "") and metric, in the results' order;
    a pair of one command is counted apart (Ranking.same_command), before its figures are compared."""
    ran = [r for r in results if r.row.published is not None and r.predicted is not None and r.row.cluster]
    pairs, ties, same = [], 0, 0
    for x, y in itertools.combinations(ran, 2):
        if (x.row.cluster, x.row.metric) != (y.row.cluster, y.row.metric):
            continue
        if x.row.command == y.row.command:
            same += 1
            continue
        pub_x, pub_y = speed(x.row, x.row.published), speed(y.row, y.row.published)
        if pub_x == pub_y:
            ties += 1
            continue
        pred_x, pred_y = speed(x.row, x.predicted), speed(y.row, y.predicted)
        pairs.append(RankPair(x.row.id, y.row.id, pub_x > pub_y, pred_x > pred_y))
    return Ranking(tuple(pairs), ties, same)


def goal_lines(sources: dict[str, dict], results: list, stats: Callable) -> list[str]:
    """The three summaries of issue 33 for docs/published.md (`stats`: published_report.stats)."""
    published = [r for r in results if r.row.published is not None]
    if not published:
        return ["No published row in this run: no issue-33 goal lines."]
    refs = reference_sources(sources)
    ref = [r for r in published if r.row.source in refs]
    out = []
    s = stats(ref)
    if ref:
        met = s.rows == len(ref) and s.median_abs <= REF_MEDIAN and s.max_abs <= REF_MAX
        out.append(f"Issue 33's reference goal, the reference rows of published.md and published_modern.md together "
                   f"({', '.join(sorted({r.row.source for r in ref}))}): {s.rows} of {len(ref)} simulated, median "
                   f"|error| {s.median_abs * 100:.1f} %, max {s.max_abs * 100:.1f} % (goal: median <= "
                   f"{REF_MEDIAN * 100:.0f} %, max <= {REF_MAX * 100:.0f} %): **{'met' if met else 'not met'}**.")
    else:
        out.append("Issue 33's reference goal: no reference row in this run (--only).")
    a = stats(published)
    met = (a.rows == len(published) and a.median_abs <= ALL_MEDIAN and a.max_abs <= ALL_MAX
           and SPEED_LOW <= a.speed_factor <= SPEED_HIGH)
    out.append(f"Issue 33's goal on every published row this bench reports: {a.rows} of {len(published)} simulated, "
               f"median |error| {a.median_abs * 100:.1f} %, max {a.max_abs * 100:.1f} %, geometric mean of predicted "
               f"/ published speed {a.speed_factor:.3f} (goal: median <= {ALL_MEDIAN * 100:.0f} %, max <= "
               f"{ALL_MAX * 100:.0f} %, speed factor in [{SPEED_LOW:.2f}, {SPEED_HIGH:.2f}]): "
               f"**{'met' if met else 'not met'}**.")
    rk = ranking(published)
    if rk.pairs:
        wrong = [p for p in rk.pairs if not p.agrees]
        out.append(f"Rankings (issue 33): {len(rk.pairs)} pairs of published rows of the same model on the same "
                   f"cluster and metric (speed per GPU), predicted order as published in {rk.agree} "
                   f"({rk.fraction * 100:.0f} %; goal >= {RANK_GOAL * 100:.0f} %): "
                   f"**{'met' if rk.fraction >= RANK_GOAL else 'not met'}**"
                   + (f"; {rk.ties} pairs with equal published figures not ranked" if rk.ties else "")
                   + (f"; {rk.same_command} pairs of one command (one configuration at two software versions) "
                      "not ranked" if rk.same_command else "")
                   + (". Reversed: " + "; ".join(f"`{p.a}` / `{p.b}`" for p in wrong) if wrong else "") + ".")
    else:
        out.append("Rankings (issue 33): no pair of published rows of the same model on the same cluster in this run"
                   + (f" ({rk.ties} with equal published figures)" if rk.ties else "") + ".")
    if math.isnan(a.speed_factor):
        out.append("No published row ran: every goal above is not met.")
    return out


__all__ = ["ALL_MAX", "ALL_MEDIAN", "GOALS", "RANK_GOAL", "REF_MAX", "REF_MEDIAN", "RankPair", "Ranking",
           "SPEED_HIGH", "SPEED_LOW", "goal_lines", "ranking", "reference_sources", "source_goal", "speed"]
