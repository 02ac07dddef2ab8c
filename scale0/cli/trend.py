"""``scale0-trend``: run the trending job over a directory of event logs (docs/trend.md)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from scale0.trend.job import RunResult

DEFAULT_ACCURACY = 10_000  # scale0.trend.job.DEFAULT_ACCURACY (imported late: it needs pyspark)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("source")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("trend-out"),
    show_default=True,
    help="Local directory for tables/, summary.json, report.html and the manifest.",
)
@click.option(
    "--master",
    default=None,
    help="Spark master: local[*] (the default), spark://host:7077, yarn... Under spark-submit, "
    "its --master is used unless this is given.",
)
@click.option("--full", is_flag=True, help="Forget the manifest and reprocess every file.")
@click.option(
    "--accuracy",
    type=click.IntRange(100, 10_000_000),
    default=DEFAULT_ACCURACY,
    show_default=True,
    help="percentile_approx accuracy: the rank error is at most 1/accuracy of the group.",
)
@click.option("--shuffle-partitions", type=click.IntRange(1, 100_000), default=8, show_default=True)
@click.option("--driver-memory", help="e.g. 4g (local mode: the memory the whole job gets).")
@click.option("--no-report", is_flag=True, help="Tables and summary only.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines.")
def main(
    source: str,
    out: Path,
    master: str | None,
    full: bool,
    accuracy: int,
    shuffle_partitions: int,
    driver_memory: str | None,
    no_report: bool,
    quiet: bool,
) -> None:
    """Turn the event logs under SOURCE (a path or any URI Spark reads) into trend tables,
    a JSON summary and an HTML report. Re-running processes only files not yet read."""
    started = time.monotonic()

    def progress(message: str) -> None:
        if not quiet:
            click.echo(f"[{time.monotonic() - started:6.1f}s] {message}", err=True)

    try:
        from scale0.trend import job  # noqa: PLC0415 (pyspark is an extra: say so if missing)
    except ImportError as exc:
        click.echo(
            f"scale0-trend: {exc.name or 'pyspark'} is not installed: "
            "`pip install 'scale0[trend]'` brings PySpark and matplotlib.",
            err=True,
        )
        sys.exit(2)
    try:
        progress(f"starting Spark ({master or 'the default master'})")
        spark = job.spark_session(
            master, shuffle_partitions=shuffle_partitions, driver_memory=driver_memory
        )
        try:
            result = job.run(
                spark,
                source,
                out,
                accuracy=accuracy,
                full=full,
                progress=progress,
                report=not no_report,
            )
        finally:
            spark.stop()
    except job.TrendError as exc:
        click.echo(f"scale0-trend: {exc}", err=True)
        sys.exit(2)
    except OSError as exc:  # a full or read-only --out while writing tables or the report
        click.echo(f"scale0-trend: {exc.filename or out}: {exc.strerror or exc}", err=True)
        sys.exit(1)
    click.echo(summary_screen(result))


def summary_screen(result: RunResult) -> str:
    """What the run did and found, on one screen."""
    s: dict[str, Any] = result.summary
    inp, totals = s["input"], s["totals"]
    lines = [
        f"scale0-trend: {result.files_new} new of {result.files_total} files in "
        f"{result.seconds:.1f} s; dates recomputed: {', '.join(result.dates) or 'none'}",
        f"records: {inp['good']} read, {inp['corrupt']} corrupt lines skipped, "
        f"{inp['invalid']} invalid, {inp['newer']} of a newer schema version not read"
        + (f" (v{', v'.join(map(str, inp['newer_versions']))})" if inp["newer"] else ""),
    ]
    if result.files_changed:
        lines.append(f"warning: {len(result.files_changed)} files changed since read (ignored)")
    rate = totals["error_rate"] or 0.0
    lines.append(f"requests: {totals['requests']}, failed {totals['errors']} ({100 * rate:.3f} %)")
    lines.append(
        f"{'service':16} {'requests':>10} {'err %':>7} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}"
    )
    for row in s["services"][:8]:
        lines.append(
            f"{row['service'][:16]:16} {row['requests']:>10} {100 * row['error_rate']:>7.3f} "
            f"{row['p50_ms']:>8.2f} {row['p95_ms']:>8.2f} {row['p99_ms']:>8.2f}"
        )
    if len(s["services"]) > 8:
        lines.append(f"... and {len(s['services']) - 8} more services")
    brokers = ", ".join(
        f"{b['broker']} {100 * b['availability']:.2f} %"
        for b in s["brokers"]
        if b.get("availability") is not None
    )
    lines.append(f"broker availability: {brokers or 'no lifecycle records'}")
    workers = [w for w in s["workers"] if w.get("availability") is not None]
    workers.sort(key=lambda w: w["availability"])
    if workers:
        lines.append(
            "least available workers: "
            + ", ".join(
                f"{w['broker']}/{w['worker']} {100 * w['availability']:.2f} %" for w in workers[:4]
            )
        )
    applied = sum(1 for c in s["config_changes"] if c["outcome"] == "applied")
    refused = len(s["config_changes"]) - applied
    lines.append(f"config: {applied} versions applied, {refused} refused")
    if s["tasks"]:
        done = sum(t["finished"] for t in s["tasks"])
        failed = sum(t["failed"] for t in s["tasks"])
        lines.append(f"tasks: {done} finished, {failed} failed")
    lines.append(f"out: {result.out}/report.html, summary.json, tables/")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
