"""spark/report.py: the one-page HTML report from audit tables."""

from __future__ import annotations

import pandas as pd

from spark import report

WHEN = pd.Timestamp("2026-01-01T12:00:00")


def tables() -> dict[str, pd.DataFrame]:
    return {
        "summary": pd.DataFrame([("g", "t", "accepted", "none", 90, 3), ("g", "t", "archived", "rejected", 10, 1)],
                                columns=["group", "topic", "kind", "reason", "records", "events"]),
        "throughput": pd.DataFrame([("g", "t", 0, WHEN, 100, 90, 0, 10, 10)],
                                   columns=["group", "topic", "partition", "window_start", "acquired", "accepted",
                                            "released", "rejected", "archived"]),
        "ack_latency": pd.DataFrame([("g", 5.0, 80), ("g", None, 10)], columns=["group", "le_ms", "records"]),
        "ack_latency_summary": pd.DataFrame([("g", 90, 3.0, 4.0, 7000.0, 7000.0)],
                                            columns=["group", "records", "p50_ms", "p90_ms", "p99_ms", "max_ms"]),
        "delivery_counts": pd.DataFrame([("g", 1, 90, 5, 95)],
                                        columns=["group", "delivery_count", "accepted", "archived", "records"]),
        "dead_letters_by_reason": pd.DataFrame([("g", "t", "rejected", 10, 10)],
                                               columns=["group", "topic", "reason", "archived_records",
                                                        "dead_lettered_records"]),
        "redelivery": pd.DataFrame([("g", "t", 0, 100, 5, 0.05)],
                                   columns=["group", "topic", "partition", "delivered", "redelivered",
                                            "redelivery_rate"]),
    }


def test_report_has_totals_latency_and_a_plot_per_table() -> None:
    page = report.render(tables(), title="Audit <g>")
    assert page.startswith("<!doctype html>") and page.endswith("</html>")
    assert "Audit &lt;g&gt;" in page
    assert page.count("<svg") == 4  # throughput, latency, delivery counts, reasons (no spso/in_progress data)
    assert "7000.0" in page and "0.05" in page


def test_report_without_events_says_so() -> None:
    page = report.render({"summary": pd.DataFrame(columns=["group", "topic", "kind", "reason", "records"])},
                         title="Audit")
    assert "No events in the range read." in page
    assert "<svg" not in page
