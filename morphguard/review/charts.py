"""The console's charts, drawn on the server as SVG (no JavaScript): shapes computed here as numbers,
drawn and labelled by the template (which escapes the labels)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

WIDTH, HEIGHT, LEFT, BOTTOM = 520, 200, 110, 24


@dataclass
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str
    value: str
    series: int = 0


@dataclass
class Line:
    label: str
    points: str  # "x,y x,y ..." for <polyline>
    series: int


@dataclass
class Chart:
    title: str
    bars: list[Bar] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    axis: list[tuple[float, str]] = field(default_factory=list)  # x positions and their labels
    legend: list[tuple[int, str]] = field(default_factory=list)
    empty: bool = False


def flagged_rate(summary: list[dict[str, Any]]) -> Chart:
    """Share of decisions flagged, per topic: one horizontal bar each."""
    chart = Chart("Flagged share of decisions, by topic", empty=not summary)
    row = (HEIGHT - BOTTOM) / max(1, len(summary))
    for i, item in enumerate(summary):
        rate = (item["flagged"] or 0) / item["decisions"] if item["decisions"] else 0.0
        chart.bars.append(Bar(LEFT, i * row + 2, (WIDTH - LEFT - 60) * rate, max(2.0, row - 4), item["topic"],
                              f"{rate:.0%} of {item['decisions']}"))
    return chart


def precision_over_time(scores: list[tuple[str, str, float, str]]) -> Chart:
    """Per topic and day, the share of reviewed flags that reviewers confirmed as hallucinated."""
    days = sorted({day for _, day, _, label in scores if label in ("hallucinated", "faithful")})
    chart = Chart("Reviewers' precision of flags, by day", empty=not days)
    if not days:
        return chart
    counts: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for topic, day, _score, label in scores:
        if label in ("hallucinated", "faithful"):
            counts[topic][day][0 if label == "hallucinated" else 1] += 1
    step = (WIDTH - LEFT - 20) / max(1, len(days) - 1)
    plot = HEIGHT - BOTTOM
    for series, (topic, by_day) in enumerate(sorted(counts.items())):
        points = []
        for i, day in enumerate(days):
            if day in by_day:
                confirmed, dismissed = by_day[day]
                points.append(f"{LEFT + i * step:.1f},{plot - plot * confirmed / (confirmed + dismissed):.1f}")
        chart.lines.append(Line(topic, " ".join(points), series))
        chart.legend.append((series, topic))
    chart.axis = [(LEFT + i * step, day[5:]) for i, day in enumerate(days)]
    return chart


def score_distribution(scores: list[tuple[str, str, float, str]], bins: int = 10) -> Chart:
    """Histogram of scores of answers reviewers confirmed (hallucinated) and dismissed (faithful)."""
    counts = [[0] * bins, [0] * bins]
    for _topic, _day, score, label in scores:
        if label in ("hallucinated", "faithful"):
            counts[0 if label == "hallucinated" else 1][min(bins - 1, int(score * bins))] += 1
    total = max(max(counts[0]), max(counts[1]), 1)
    chart = Chart("Scores of confirmed and dismissed flags", empty=not any(counts[0]) and not any(counts[1]))
    slot = (WIDTH - LEFT - 20) / bins
    plot = HEIGHT - BOTTOM
    for series in (0, 1):
        for i, n in enumerate(counts[series]):
            height = plot * n / total
            chart.bars.append(Bar(LEFT + i * slot + series * slot / 2, plot - height, slot / 2 - 1, height,
                                  f"{i / bins:.1f}–{(i + 1) / bins:.1f}", str(n), series))
    chart.axis = [(LEFT + i * slot, f"{i / bins:.1f}") for i in range(bins + 1)]
    chart.legend = [(0, "confirmed (hallucinated)"), (1, "dismissed (faithful)")]
    return chart
