"""report.html: one page a person reads at a glance: totals, then plots (inline SVG from matplotlib)."""

from __future__ import annotations

import html
import io
from collections.abc import Mapping

import matplotlib

matplotlib.use("Agg")  # no display: render to SVG strings only

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

MAX_IN_PROGRESS_ROWS = 100_000  # the report plots a sample of a larger in_progress table


def in_progress_frame(table: object) -> pd.DataFrame:
    """The in_progress table for plotting, at most MAX_IN_PROGRESS_ROWS rows (a Spark DataFrame in)."""
    return table.limit(MAX_IN_PROGRESS_ROWS).toPandas()  # type: ignore[attr-defined]


def _svg(figure: plt.Figure) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    plt.close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def _empty(frame: pd.DataFrame | None) -> bool:
    return frame is None or frame.empty


def _throughput_plot(frame: pd.DataFrame) -> str:
    per_minute = frame.groupby("window_start")[["acquired", "accepted", "released", "rejected", "archived"]].sum()
    figure, axes = plt.subplots(figsize=(9, 3.2))
    per_minute.plot(ax=axes, marker=".")
    axes.set_ylabel("records / minute")
    axes.set_xlabel("")
    axes.set_title("Throughput, all share-partitions")
    return _svg(figure)


def _latency_plot(frame: pd.DataFrame) -> str:
    totals = (frame.assign(bound=frame["le_ms"].fillna(float("inf"))).groupby("bound")["records"].sum()
              .sort_index())
    labels = [f"≤{int(bound)}" if bound != float("inf") else "more" for bound in totals.index]
    figure, axes = plt.subplots(figsize=(9, 3.2))
    axes.bar(labels, totals.values)
    axes.set_ylabel("accepted records")
    axes.set_xlabel("acquire → accept latency (ms)")
    axes.set_title("Acknowledgement latency, all groups")
    return _svg(figure)


def _delivery_count_plot(frame: pd.DataFrame) -> str:
    totals = frame.groupby("delivery_count")[["accepted", "archived"]].sum().sort_index()
    figure, axes = plt.subplots(figsize=(5, 3.2))
    totals.plot.bar(ax=axes, stacked=True)
    axes.set_xlabel("final delivery count")
    axes.set_ylabel("records")
    axes.set_title("Delivery counts of finished records")
    return _svg(figure)


def _spso_plot(frame: pd.DataFrame) -> str:
    figure, axes = plt.subplots(figsize=(9, 3.2))
    for (group, topic, partition), rows in frame.sort_values("written_at").groupby(["group", "topic", "partition"]):
        axes.step(rows["written_at"], rows["lag"].fillna(0), where="post", label=f"{group} {topic}-{partition}")
    axes.set_ylabel("lag (records)")
    axes.set_title("Lag behind the event log at each state write")
    if len(axes.get_lines()) <= 12:
        axes.legend(fontsize="small")
    return _svg(figure)


def _reasons_plot(frame: pd.DataFrame) -> str:
    totals = frame.groupby("reason")[["archived_records", "dead_lettered_records"]].sum()
    figure, axes = plt.subplots(figsize=(5, 3.2))
    totals.plot.barh(ax=axes)
    axes.set_xlabel("records")
    axes.set_title("Archived records by reason")
    return _svg(figure)


def _in_progress_plot(frame: pd.DataFrame) -> str:
    figure, axes = plt.subplots(figsize=(5, 3.2))
    finished = frame.dropna(subset=["duration_ms"])
    for outcome, rows in finished.groupby("outcome"):
        axes.hist(rows["duration_ms"] / 1000, bins=30, alpha=0.6, label=str(outcome))
    axes.set_xlabel("seconds IN_PROGRESS")
    axes.set_ylabel("records")
    axes.set_title("In-progress durations by outcome")
    axes.legend(fontsize="small")
    return _svg(figure)


def _table(frame: pd.DataFrame, columns: list[str]) -> str:
    return frame[columns].to_html(index=False, border=0, classes="numbers")


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
.grid { display: flex; flex-wrap: wrap; gap: 1em; } svg { max-width: 100%; height: auto; }
table.numbers { border-collapse: collapse; font-size: 0.9em; } .numbers td, .numbers th { padding: 2px 10px; }
.numbers td { text-align: right; } .numbers tr:nth-child(even) { background: #f4f4f4; }
.note { color: #666; font-size: 0.9em; }
"""


def render(tables: Mapping[str, pd.DataFrame], *, title: str) -> str:
    """The report page from the audit tables (pandas frames named as in audit.tables)."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"]
    summary = tables.get("summary")
    if _empty(summary):
        parts.append("<p>No events in the range read.</p></body></html>")
        return "".join(parts)
    assert summary is not None
    pivot = summary.pivot_table(index="group", columns="kind", values="records", aggfunc="sum", fill_value=0)
    parts.append("<h2>Records by event, per group</h2>")
    parts.append(pivot.reset_index().to_html(index=False, border=0, classes="numbers"))
    latency = tables.get("ack_latency_summary")
    if not _empty(latency):
        assert latency is not None
        parts.append("<h2>Acknowledgement latency (acquire → accept)</h2>")
        parts.append(_table(latency, ["group", "records", "p50_ms", "p90_ms", "p99_ms", "max_ms"]))
    plots = []
    for name, plot in (("throughput", _throughput_plot), ("ack_latency", _latency_plot),
                       ("delivery_counts", _delivery_count_plot), ("dead_letters_by_reason", _reasons_plot),
                       ("spso", _spso_plot), ("in_progress", _in_progress_plot)):
        frame = tables.get(name)
        if not _empty(frame):
            plots.append(plot(frame))
    parts.append("<h2>Plots</h2><div class='grid'>" + "".join(f"<div>{svg}</div>" for svg in plots) + "</div>")
    redelivery = tables.get("redelivery")
    if not _empty(redelivery):
        assert redelivery is not None
        worst = redelivery.sort_values("redelivery_rate", ascending=False).head(10)
        parts.append("<h2>Highest redelivery rates</h2>")
        parts.append(_table(worst, ["group", "topic", "partition", "delivered", "redelivered", "redelivery_rate"]))
    parts.append("<p class='note'>Tables: the Parquet directories beside this file (docs/spark.md).</p>")
    parts.append("</body></html>")
    return "".join(parts)
