"""From outcomes to figures: one summary per detector, then markdown, JSON, PNG plots and an HTML page.

With calibration, each detector's threshold is the F1-best one on a dev half of the items and every
figure is computed on the disjoint test half; without it, each outcome keeps the detector's own threshold.
"""

from __future__ import annotations

import html
import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from morphguard.eval import metrics
from morphguard.eval.datasets import split
from morphguard.eval.items import Item
from morphguard.eval.runner import Outcome

CAVEAT = ("RAGTruth here is a partial third-party test subset (see ../shared/data/ragtruth/README.md): "
          "use the figures for relative comparisons, not against published numbers.")


def summarize(items: Sequence[Item], outcomes: Sequence[Outcome], detectors: Sequence[str], *,
              calibrate: bool = False, seed: int = 0, threshold: float | None = None) -> dict[str, Any]:
    """`threshold`: where every detector's score is read as flagged (the config's `detector.threshold`, which a
    score does not depend on); None: each outcome's own. With `calibrate`, each detector's F1-best one instead."""
    by_id = {i.id: i for i in items}
    # Paired comparison: only the items every detector has a result for (a run still going, or failures).
    scored = [{o.item_id for o in outcomes if o.detector == name and o.error is None} for name in detectors]
    common = set.intersection(*scored) if scored else set()
    items = [i for i in items if i.id in common]
    test_ids = {i.id for i in items}
    dev_ids: set[str] = set()
    if calibrate:
        dev, test = split(list(items), seed=seed)
        dev_ids, test_ids = {i.id for i in dev}, {i.id for i in test}
    summary: dict[str, Any] = {"items": len(items), "sampled_items": len(by_id), "evaluated_items": len(test_ids),
                               "calibrated": calibrate, "tasks": sorted({i.task for i in items}), "detectors": {}}
    for name in detectors:
        mine = [o for o in outcomes if o.detector == name]
        good = [o for o in mine if o.error is None]
        tau = threshold
        if calibrate:
            tune = [(o.hallucinated, o.score) for o in good if o.item_id in dev_ids and o.score is not None]
            tau = metrics.best_threshold([label for label, _ in tune], [score for _, score in tune]) if tune else None
        summary["detectors"][name] = _detector_summary(
            [o for o in good if o.item_id in test_ids], by_id, tau, calibrated=calibrate and tau is not None,
            errors=sum(1 for o in mine if o.error is not None))
    return summary


def _flag(o: Outcome, threshold: float | None) -> bool:
    return bool(o.flagged) if threshold is None else (o.score or 0.0) >= threshold


def _predicted(o: Outcome, threshold: float | None) -> list[tuple[int, int]]:
    tau = o.threshold if threshold is None else threshold
    return [(s.start, s.end) for s in o.factoid_spans if tau is not None and s.score >= tau]


def _quality(group: list[Outcome], by_id: dict[str, Item], threshold: float | None) -> dict[str, Any]:
    labels = [o.hallucinated for o in group]
    scores = [o.score or 0.0 for o in group]
    binary = metrics.confusion(labels, [_flag(o, threshold) for o in group])
    figures: dict[str, Any] = {"n": len(group), **binary.as_dict(), "auroc": metrics.auroc(labels, scores),
                               "auroc_ci": metrics.auroc_interval(labels, scores),
                               "pr_auc": metrics.pr_auc(labels, scores),
                               "ece": metrics.calibration_error(labels, scores)}
    spanned = [o for o in group if o.localizes and by_id[o.item_id].spans is not None]
    if spanned:
        figures["span"] = metrics.span_scores(
            [[(s.start, s.end) for s in by_id[o.item_id].spans or []] for o in spanned],
            [_predicted(o, threshold) for o in spanned]).as_dict()
    return figures


def _detector_summary(good: list[Outcome], by_id: dict[str, Item], threshold: float | None, *, calibrated: bool,
                      errors: int) -> dict[str, Any]:
    repeats = sorted({o.repeat for o in good})
    per_repeat = [_quality([o for o in good if o.repeat == r], by_id, threshold) for r in repeats]
    keys = ("precision", "recall", "f1", "accuracy", "auroc", "pr_auc", "ece")
    result: dict[str, Any] = {
        "threshold": threshold if threshold is not None else (good[0].threshold if good else None),
        "calibrated_threshold": calibrated,
        "outcomes": len(good), "errors": errors, "repeats": len(repeats),
        **{k: metrics.spread(q[k] for q in per_repeat) for k in keys},
        "auroc_ci": per_repeat[0]["auroc_ci"] if per_repeat else None,  # of the first repeat
        "per_repeat": per_repeat,
    }
    if any("span" in q for q in per_repeat):
        result["span"] = {k: metrics.spread(q["span"][k] for q in per_repeat if "span" in q)
                          for k in ("precision", "recall", "f1")}
    tasks: dict[str, list[Outcome]] = defaultdict(list)
    for o in good:
        tasks[o.task].append(o)
    kept = ("n", "f1", "auroc", "auroc_ci", "pr_auc", "ece", "span")
    result["per_task"] = {t: {k: v for k, v in _quality(g, by_id, threshold).items() if k in kept}
                          for t, g in sorted(tasks.items())}
    seconds = [o.seconds for o in good]
    result["cost"] = {
        "llm_calls": statistics.fmean(o.llm_calls for o in good) if good else None,
        "input_tokens": statistics.fmean(o.input_tokens for o in good) if good else None,
        "output_tokens": statistics.fmean(o.output_tokens for o in good) if good else None,
        "seconds_median": statistics.median(seconds) if seconds else None,
        "seconds_mean": statistics.fmean(seconds) if seconds else None,
    }
    return result


def _interval(figures: dict[str, Any]) -> str:
    ci = figures.get("auroc_ci")
    return f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""


def _fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, dict):
        mean, std = value.get("mean"), value.get("std")
        if mean is None:
            return "–"
        return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")
    if value is None:
        return "–"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def markdown(summary: dict[str, Any]) -> str:
    scope = (f"{summary['evaluated_items']} test items of {summary['items']} (τ chosen for max F1 on the other half)"
             if summary["calibrated"] else f"{summary['items']} items, each detector at its own threshold")
    if summary["items"] < summary.get("sampled_items", summary["items"]):
        scope += f"; only the {summary['items']} of {summary['sampled_items']} sampled items every detector has scored"
    if summary.get("dataset"):
        half = summary.get("half", "all")
        scope = f"{summary['dataset']}" + (f", {half} half" if half != "all" else "") + f": {scope}"
    lines = [f"Detection quality — {scope}", "",
             "| detector | τ | P | R | F1 | acc | AUROC [95% CI] | PR-AUC | ECE | span P | span R | span F1 | calls "
             "| in tok | out tok | s (median) | errors |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, d in summary["detectors"].items():
        span = d.get("span", {})
        cost = d["cost"]
        lines.append("| " + " | ".join([
            name, _fmt(d["threshold"]),
            *(_fmt(d[k]) for k in ("precision", "recall", "f1", "accuracy")), _fmt(d["auroc"]) + _interval(d),
            _fmt(d["pr_auc"]), _fmt(d["ece"]),
            *(_fmt(span.get(k)) for k in ("precision", "recall", "f1")),
            _fmt(cost["llm_calls"], 1), _fmt(cost["input_tokens"], 0), _fmt(cost["output_tokens"], 0),
            _fmt(cost["seconds_median"], 1), str(d["errors"])]) + " |")
    if len(summary["tasks"]) > 1:
        lines += ["", "Per task (F1 / AUROC):", "",
                  "| detector | " + " | ".join(summary["tasks"]) + " |",
                  "|---|" + "---|" * len(summary["tasks"])]
        for name, d in summary["detectors"].items():
            cells = [f"{_fmt(d['per_task'].get(t, {}).get('f1'))} / {_fmt(d['per_task'].get(t, {}).get('auroc'))}"
                     f"{_interval(d['per_task'].get(t, {}))}" for t in summary["tasks"]]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", CAVEAT]
    return "\n".join(lines)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write(folder: Path, items: Sequence[Item], outcomes: Sequence[Outcome], summary: dict[str, Any]) -> list[Path]:
    """report.md, report.json, roc.png, pr.png, scores.png and (when any detector localizes) spans.html."""
    written = [folder / "report.md", folder / "report.json"]
    _atomic_write(written[0], markdown(summary) + "\n")
    _atomic_write(written[1], json.dumps(summary, indent=2))
    written += _plots(folder, outcomes, list(summary["detectors"]))
    if any(o.localizes and o.error is None for o in outcomes):
        path = folder / "spans.html"
        _atomic_write(path, spans_page(items, outcomes))
        written.append(path)
    return written


def _plots(folder: Path, outcomes: Sequence[Outcome], detectors: list[str]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Laid out as they are drawn (`constrained`): a tight bounding box at save time would draw each figure twice.
    first = {name: [o for o in outcomes if o.detector == name and o.error is None and o.repeat == 0]
             for name in detectors}
    paths = []
    for kind, points, axes in (("roc", metrics.roc_points, ("false positive rate", "true positive rate")),
                               ("pr", metrics.pr_points, ("recall", "precision"))):
        fig, ax = plt.subplots(figsize=(5, 5), layout="constrained")
        for name, group in first.items():
            if group:
                xy = points([o.hallucinated for o in group], [o.score or 0.0 for o in group])
                ax.plot([p[0] for p in xy], [p[1] for p in xy], marker=".", label=name,
                        drawstyle="default" if kind == "roc" else "steps-post")
        if kind == "roc":
            ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
        ax.set(xlabel=axes[0], ylabel=axes[1], xlim=(0, 1), ylim=(0, 1.02),
               title="ROC" if kind == "roc" else "precision–recall")
        ax.legend(loc="lower right" if kind == "roc" else "lower left")
        paths.append(folder / f"{kind}.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    fig, axs = plt.subplots(1, len(detectors), figsize=(4 * len(detectors), 3.2), squeeze=False,
                            layout="constrained")
    for ax, (name, group) in zip(axs[0], first.items(), strict=False):
        for label, colour in ((False, "tab:green"), (True, "tab:red")):
            ax.hist([o.score or 0.0 for o in group if o.hallucinated == label], bins=20, range=(0, 1), alpha=0.6,
                    color=colour, label="hallucinated" if label else "faithful")
        ax.set(title=name, xlabel="score")
        ax.legend()
    paths.append(folder / "scores.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def _marked(answer: str, spans: list[tuple[int, int]], css: str) -> str:
    inside = [False] * len(answer)
    for start, end in spans:
        for i in range(max(start, 0), min(end, len(answer))):
            inside[i] = True
    out, i = [], 0
    while i < len(answer):
        j = i
        while j < len(answer) and inside[j] == inside[i]:
            j += 1
        text = html.escape(answer[i:j])
        out.append(f'<mark class="{css}">{text}</mark>' if inside[i] else text)
        i = j
    return "".join(out)


def spans_page(items: Sequence[Item], outcomes: Sequence[Outcome]) -> str:
    """Each answer once with its gold spans, then once per span-producing detector with its flagged spans."""
    by_item: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        if o.error is None and o.repeat == 0 and o.localizes:
            by_item[o.item_id].append(o)
    blocks = []
    for item in items:
        if item.id not in by_item:
            continue
        gold = [(s.start, s.end) for s in item.spans or []]
        label = "hallucinated" if item.hallucinated else "faithful"
        rows = [f'<tr><th>gold ({label})</th><td>{_marked(item.answer, gold, "gold")}</td></tr>']
        for o in sorted(by_item[item.id], key=lambda o: o.detector):
            verdict = "flagged" if o.flagged else "passed"
            rows.append(f"<tr><th>{html.escape(o.detector)}<br><small>{o.score:.2f} {verdict}</small></th>"
                        f"<td>{_marked(item.answer, _predicted(o, None), 'pred')}</td></tr>")
        blocks.append(f"<section><h2>{html.escape(item.id)} · {html.escape(item.task)}</h2>"
                      f"<p class=q>{html.escape(item.question)}</p><table>{''.join(rows)}</table></section>")
    return f"""<!doctype html><meta charset="utf-8"><title>morphguard: gold and predicted spans</title>
<style>
body{{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}}
th{{text-align:left;vertical-align:top;width:9rem;padding:.3rem}} td{{padding:.3rem;white-space:pre-wrap}}
mark.gold{{background:#ffd54f}} mark.pred{{background:#ef9a9a}} .q{{color:#555}} section{{border-top:1px solid #ddd}}
</style>
<h1>Gold spans (yellow) and predicted spans (red)</h1>
<p>{html.escape(CAVEAT)}</p>
{''.join(blocks)}
"""
