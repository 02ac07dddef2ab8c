"""The HTML report: one self-contained page (charts as inline PNG drawn by matplotlib), offline.

Input is plain data (the job's summary and its hourly rows), so the page can be rendered and
tested without Spark. Nothing is fetched when the page opens: no scripts, fonts or images from
elsewhere.
"""

from __future__ import annotations

import base64
import io
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: render to memory only

from matplotlib.dates import AutoDateLocator, ConciseDateFormatter, date2num
from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter

MAX_SERVICES = 6
CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1100px}
table{border-collapse:collapse;margin:1em 0;font-size:90%}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3} td.l,th.l{text-align:left}
.warn{background:#fff3cd;padding:.5em 1em;border-left:4px solid #e0a800}
img{max-width:100%}
"""


def _when(value: Any) -> float:
    """A time (datetime or ISO string, UTC if naive) as matplotlib's date number."""
    parsed = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return float(
        date2num(  # type: ignore[no-untyped-call]
            parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
        )
    )


def _png(fig: Figure) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img alt="chart" src="data:image/png;base64,{data}">'


def _time_axis(ax: Any) -> None:
    locator = AutoDateLocator()  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    ax.grid(True, alpha=0.3)


def _series(
    hourly: Sequence[dict[str, Any]], services: Sequence[str], key: str
) -> dict[str, tuple[list[float], list[float]]]:
    out: dict[str, tuple[list[float], list[float]]] = {s: ([], []) for s in services}
    for row in hourly:
        if row["service"] in out and row.get(key) is not None:
            xs, ys = out[row["service"]]
            xs.append(_when(row["hour"]))
            ys.append(float(row[key]))
    return out


def latency_chart(hourly: Sequence[dict[str, Any]], services: Sequence[str]) -> str:
    cols = 2
    rows = max(1, (len(services) + cols - 1) // cols)
    fig = Figure(figsize=(11, 2.6 * rows))
    for i, service in enumerate(services):
        ax = fig.add_subplot(rows, cols, i + 1)
        for key, style in (("p50_ms", "-"), ("p95_ms", "--"), ("p99_ms", ":")):
            xs, ys = _series(hourly, [service], key)[service]
            ax.plot(xs, ys, style, label=key[:-3])
        ax.set_title(f"{service}: latency per hour (ms)", fontsize=10)
        ax.set_yscale("log")
        # Plain numbers on the log axis (10, 20, 50), not 2x10^1.
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.tick_params(axis="y", which="minor", labelsize=7)
        _time_axis(ax)
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return _png(fig)


def throughput_chart(
    hourly: Sequence[dict[str, Any]], services: Sequence[str], changes: Sequence[dict[str, Any]]
) -> str:
    fig = Figure(figsize=(11, 3.5))
    ax = fig.add_subplot(1, 1, 1)
    for service, (xs, ys) in _series(hourly, services, "throughput_rps").items():
        ax.plot(xs, ys, label=service)
    for change in changes:
        if change.get("outcome") == "applied":
            ax.axvline(_when(change["at"]), color="grey", alpha=0.25, linewidth=1)
    ax.set_title("Throughput (requests/s, hourly mean); grey lines: config versions applied")
    _time_axis(ax)
    ax.legend(fontsize=8, ncol=3)
    return _png(fig)


def error_chart(hourly: Sequence[dict[str, Any]], services: Sequence[str]) -> str:
    fig = Figure(figsize=(11, 3.5))
    ax = fig.add_subplot(1, 1, 1)
    for service, (xs, ys) in _series(hourly, services, "error_rate").items():
        ax.plot(xs, [100 * y for y in ys], label=service)
    ax.set_title("Error rate per hour (% of requests with status >= 400)")
    _time_axis(ax)
    ax.legend(fontsize=8, ncol=3)
    return _png(fig)


def availability_chart(brokers: Sequence[dict[str, Any]], workers: Sequence[dict[str, Any]]) -> str:
    labels, values = [], []
    for b in brokers:
        if b.get("availability") is not None:
            labels.append(f"broker {b['broker']}")
            values.append(100 * float(b["availability"]))
    for w in workers:
        if w.get("availability") is not None:
            labels.append(f"{w['broker']}/{w['worker']}")
            values.append(100 * float(w["availability"]))
    fig = Figure(figsize=(11, max(2.0, 0.22 * len(labels) + 1)))
    ax = fig.add_subplot(1, 1, 1)
    ax.barh(range(len(labels)), values, color=["#4477aa" if v >= 99 else "#cc6677" for v in values])
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(min([*values, 90.0]) - 1, 100)
    ax.set_title("Availability (% of observed time up)")
    ax.grid(True, axis="x", alpha=0.3)
    return _png(fig)


def task_chart(tasks: Sequence[dict[str, Any]]) -> str:
    fig = Figure(figsize=(11, 3))
    ax = fig.add_subplot(1, 2, 1)
    xs = [_when(t["hour"]) for t in tasks]
    ax.plot(xs, [t["finished"] for t in tasks], label="finished")
    ax.plot(xs, [t["failed"] for t in tasks], label="failed")
    ax.set_title("Tasks finished per hour")
    _time_axis(ax)
    ax.legend(fontsize=8)
    ax2 = fig.add_subplot(1, 2, 2)
    ax2.plot(xs, [t["wait_p50_ms"] for t in tasks], label="wait p50")
    ax2.plot(xs, [t["wait_p95_ms"] for t in tasks], label="wait p95")
    ax2.set_title("Task wait, queued to running (ms)")
    _time_axis(ax2)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig)


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    head = "".join(
        f'<th class="{"l" if i == 0 else ""}">{escape(title)}</th>'
        for i, (_, title) in enumerate(columns)
    )
    body = []
    for row in rows:
        cells = []
        for i, (key, _) in enumerate(columns):
            value = row.get(key)
            if isinstance(value, float):
                text = (
                    f"{value:.4f}"
                    if "rate" in key or "share" in key or "avail" in key
                    else (f"{value:.2f}")
                )
            else:
                text = "" if value is None else str(value)
            cells.append(f'<td class="{"l" if i == 0 else ""}">{escape(text)}</td>')
        body.append(f"<tr>{''.join(cells)}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def render(
    summary: dict[str, Any],
    hourly: Sequence[dict[str, Any]],
    status_hour: Sequence[dict[str, Any]],
) -> str:
    """The whole page."""
    services = [s["service"] for s in summary["services"]][:MAX_SERVICES]
    window = summary["window"]
    start = datetime.fromtimestamp(window["start_ms"] / 1000, UTC).isoformat(timespec="minutes")
    end = datetime.fromtimestamp(window["end_ms"] / 1000, UTC).isoformat(timespec="minutes")
    inp, totals = summary["input"], summary["totals"]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>Scale0 trends {escape(start)} to {escape(end)}</title><style>{CSS}</style>",
        "</head><body>",
        f"<h1>Scale0 trends</h1><p>{escape(start)} to {escape(end)} (UTC) from "
        f"<code>{escape(summary['source'])}</code>, generated {escape(summary['generated_at'])}."
        f" Percentiles by Spark's <code>percentile_approx</code>, accuracy "
        f"{summary['percentile_accuracy']} (docs/trend.md).</p>",
        f"<p><b>{totals['requests']}</b> requests, <b>{totals['errors']}</b> failed "
        f"({100 * (totals['error_rate'] or 0):.3f} %), {totals['bytes_in']} bytes in, "
        f"{totals['bytes_out']} bytes out; {inp['files']} files, {inp['good']} records read.</p>",
    ]
    if inp["corrupt"] or inp["invalid"]:
        parts.append(
            f"<p class='warn'>{inp['corrupt']} corrupt lines (cut short or not JSON) and "
            f"{inp['invalid']} invalid records were skipped.</p>"
        )
    if inp["newer"]:
        parts.append(
            f"<p class='warn'>{inp['newer']} records of schema version "
            f"{', '.join(map(str, inp['newer_versions']))} were not read: this job reads "
            f"version {summary['schema_version']}. Upgrade scale0 to include them.</p>"
        )
    parts.append("<h2>Services</h2>")
    parts.append(
        _table(
            summary["services"],
            [
                ("service", "service"),
                ("requests", "requests"),
                ("errors", "errors"),
                ("error_rate", "error rate"),
                ("p50_ms", "p50 ms"),
                ("p95_ms", "p95 ms"),
                ("p99_ms", "p99 ms"),
                ("bytes_in", "bytes in"),
                ("bytes_out", "bytes out"),
            ],
        )
    )
    if hourly:
        parts.append("<h2>Latency</h2>" + latency_chart(hourly, services))
        parts.append(
            "<h2>Throughput</h2>" + throughput_chart(hourly, services, summary["config_changes"])
        )
        parts.append("<h2>Errors</h2>" + error_chart(hourly, services))
        failures: dict[tuple[str, int], int] = defaultdict(int)
        for row in status_hour:
            if row["status"] >= 400:
                failures[(row["service"], row["status"])] += row["requests"]
        parts.append(
            _table(
                [
                    {"service": s, "status": st, "requests": n}
                    for (s, st), n in sorted(failures.items())
                ],
                [("service", "service"), ("status", "status"), ("requests", "failed requests")],
            )
        )
    parts.append("<h2>Availability</h2>")
    if summary["brokers"] or summary["workers"]:
        parts.append(availability_chart(summary["brokers"], summary["workers"]))
    avail_cols = [
        ("availability", "availability"),
        ("up_ms", "up ms"),
        ("observed_ms", "observed ms"),
        ("transitions", "records"),
        ("requests", "requests"),
        ("load_share", "load share"),
    ]
    parts.append(_table(summary["brokers"], [("broker", "broker"), *avail_cols]))
    parts.append(
        _table(summary["workers"], [("broker", "broker"), ("worker", "worker"), *avail_cols])
    )
    parts.append("<h2>Config changes</h2>")
    parts.append(
        _table(
            summary["config_changes"],
            [
                ("at", "at"),
                ("broker", "broker"),
                ("outcome", "outcome"),
                ("config_version", "version"),
                ("reason", "reason"),
            ],
        )
    )
    parts.append("<h2>Management</h2>")
    parts.append(
        _table(
            summary["management"],
            [
                ("at", "at"),
                ("broker", "broker"),
                ("kind", "kind"),
                ("user", "user"),
                ("command", "command"),
                ("result", "result"),
                ("state", "state"),
            ],
        )
    )
    if summary["tasks"]:
        parts.append("<h2>Tasks</h2>" + task_chart(summary["tasks"]))
    parts.append("</body></html>")
    return "\n".join(parts)
