"""The console's charts, drawn on the server as SVG (no JavaScript): shapes computed here as numbers,
drawn and labelled by the template (which escapes the labels)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 520, 200, 110, 24, 12
_LEGEND_ROW, _CHAR = 16, 6.5  # a legend row's height; the width of a character at the legend's size


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
    dots: list[tuple[float, float]] = field(default_factory=list)  # each day's point, drawn as well as joined


@dataclass
class Key:
    """One legend entry, placed: entries wrap into rows below the plot rather than run off its right edge."""

    series: int
    label: str
    x: float
    y: float


@dataclass
class Chart:
    title: str
    bars: list[Bar] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    axis: list[tuple[float, str]] = field(default_factory=list)  # x positions and their labels
    legend: list[Key] = field(default_factory=list)
    axis_values: list[tuple[float, str]] = field(default_factory=list)  # y positions and their labels
    empty: bool = False

    @property
    def height(self) -> float:
        """The drawing's height: the plot, its axis labels, and as many legend rows as the entries need."""
        return max([HEIGHT + 20] + [k.y + 6 for k in self.legend])

    def keys(self, entries: list[tuple[int, str]]) -> None:
        x, y = float(LEFT), HEIGHT + 12.0
        for series, label in entries:
            label = label if len(label) <= 32 else label[:31] + "…"
            width = 18 + _CHAR * len(label) + 14
            if x > LEFT and x + width > WIDTH:
                x, y = float(LEFT), y + _LEGEND_ROW
            self.legend.append(Key(series, label, x, y))
            x += width


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
    span = WIDTH - LEFT - 20
    # one day is a point in the middle (a line needs two); more spread from edge to edge
    xs = [LEFT + span / 2] if len(days) == 1 else [LEFT + i * span / (len(days) - 1) for i in range(len(days))]
    plot = HEIGHT - BOTTOM
    for series, (topic, by_day) in enumerate(sorted(counts.items())):
        dots = []
        for x, day in zip(xs, days, strict=True):
            if day in by_day:
                confirmed, dismissed = by_day[day]
                dots.append((x, plot - (plot - TOP) * confirmed / (confirmed + dismissed)))
        chart.lines.append(Line(topic, " ".join(f"{x:.1f},{y:.1f}" for x, y in dots), series % 4, dots))
    chart.keys([(series % 4, topic) for series, topic in enumerate(sorted(counts))])
    chart.axis = [(x, day[5:]) for x, day in zip(xs, days, strict=True)]
    chart.axis_values = [(plot - (plot - TOP) * share, f"{share:.0%}") for share in (0.0, 0.5, 1.0)]
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
    chart.keys([(0, "confirmed (hallucinated)"), (1, "dismissed (faithful)")])
    return chart
