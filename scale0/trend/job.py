"""The PySpark trending job: event logs in, trend tables (Parquet), a JSON summary and a report out.

Steps (docs/trend.md): list the closed ``*.jsonl`` files under the source (any URI Hadoop's
FileSystem reads: a local path, ``file://``, ``hdfs://``, ``s3a://``...); keep those the
manifest has not seen; parse them with an explicit schema, sorting every line into good,
corrupt (not JSON, cut short, a field of the wrong type), newer (a schema version above ours,
reported and never read as ours) and invalid (a version 1 record missing a required field or
of an unknown kind), and write every line in one pass to the ``events`` table, partitioned by
class, date and kind (the analysis reads ``class=good``); recompute the per-minute and
per-hour service tables for the dates that got new records, and availability, load share, the
config timeline and tasks from all events; write the summary and the report; then, last, the
manifest. Each run appends its events under its own
``run=<id>`` partition; a run that fails part-way leaves the manifest as it was, and the next
run deletes the partition the manifest does not name and starts again from the same files, so
nothing is counted twice.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from scale0.trend.report import render
from scale0.trend.schema import FIELDS, KINDS, SCHEMA_VERSION

MANIFEST = "manifest.json"
DEFAULT_ACCURACY = 10_000
WORKER_STATES = {"worker_join": (1, 2), "heartbeat_gap": (1, 1), "worker_leave": (0, 0)}
# (state after, order at equal ts: down events first, then gaps, then up events)
BROKER_STATES = {
    "broker_start": (1, 2),
    "peer_up": (1, 2),
    "heartbeat_gap": (1, 1),
    "broker_stop": (0, 0),
    "peer_down": (0, 0),
}


class TrendError(Exception):
    """A problem the user can fix, said in one or two plain sentences (no Java stack trace)."""


@dataclass(frozen=True, slots=True)
class SourceFile:
    path: str  # as Spark names it (file:/..., hdfs://...)
    size: int
    mtime_ms: int


@dataclass
class RunResult:
    source: str
    out: Path
    files_total: int = 0
    files_new: int = 0
    files_changed: list[str] = field(default_factory=list)
    lines: dict[str, int] = field(default_factory=dict)  # class -> count, this run
    dates: list[str] = field(default_factory=list)  # dates recomputed this run
    summary: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


# ---- Java and the session -------------------------------------------------------------------


def java_version(java: str | None = None) -> int:
    """The major version of the ``java`` Spark will start (JAVA_HOME's, else PATH's)."""
    if java is None:
        home = os.environ.get("JAVA_HOME")
        java = str(Path(home) / "bin" / "java") if home else (shutil.which("java") or "")
    if not java or not Path(java).exists():
        raise TrendError(
            "Java not found: Spark needs Java 17 or 21. Install it (e.g. "
            "`apt-get install openjdk-17-jre-headless`) and put `java` on PATH or set JAVA_HOME."
        )
    try:
        done = subprocess.run(  # noqa: S603 (the user's own java, no shell)
            [java, "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TrendError(f"{java} -version failed: {exc}") from exc
    match = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if not match:
        raise TrendError(f"{java} -version: cannot tell the version from {done.stderr!r}")
    major = int(match.group(1))
    if major == 1 and match.group(2):
        major = int(match.group(2))  # "1.8.0" is Java 8
    if major < 17:
        raise TrendError(f"{java} is Java {major}; Spark 4 needs Java 17 or 21.")
    return major


def spark_session(
    master: str | None = "local[*]",
    *,
    shuffle_partitions: int = 8,
    driver_memory: str | None = None,
    extra_conf: dict[str, str] | None = None,
) -> SparkSession:
    """A session for the job: UI off, UTC, dynamic partition overwrite; errors made plain.

    ``master=None``: the one spark-submit chose (it started the JVM and says so in
    PYSPARK_GATEWAY_PORT), else ``local[*]``."""
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    if not submitted:
        java_version()
    if master is None and not submitted:
        master = "local[*]"
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master is not None and master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder if master is None else SparkSession.builder.master(master)
    builder = (
        builder.appName("scale0-trend")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.sources.partitionOverwriteMode", "dynamic")
        # Partition values stay strings: "2026-11-18" must not turn into a date column.
        .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
    )
    if driver_memory:
        builder = builder.config("spark.driver.memory", driver_memory)
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TrendError(
            f"Spark did not start (master {master or 'from spark-submit'}): {first}"
        ) from exc
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def event_schema() -> Any:
    """The explicit read schema: every field of version 1, plus the corrupt-line column."""

    types = {
        "string": T.StringType(),
        "long": T.LongType(),
        "int": T.IntegerType(),
        "double": T.DoubleType(),
        "array<string>": T.ArrayType(T.StringType()),
    }
    fields = [T.StructField(f.name, types[f.type], True) for f in FIELDS]
    return T.StructType([*fields, T.StructField("_corrupt", T.StringType(), True)])


class StageProgress:
    """While a step runs, report Spark's active stages every ``every_s`` seconds (tasks done of
    total), so a long parse shows it is moving. A daemon thread that only reads the tracker."""

    def __init__(self, spark: SparkSession, progress: Callable[[str], None], every_s: float = 5.0):
        self.tracker = spark.sparkContext.statusTracker()
        self.progress = progress
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trend-progress", daemon=True)

    def __enter__(self) -> StageProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self.every_s + 5)

    def _run(self) -> None:
        last = ""
        while not self._stop.wait(self.every_s):
            try:
                stages = [self.tracker.getStageInfo(i) for i in self.tracker.getActiveStageIds()]
            except Exception:  # the session is stopping: nothing more to report
                return
            text = ", ".join(
                f"stage {st.stageId}: {st.numCompletedTasks}/{st.numTasks} tasks"
                for st in stages
                if st is not None
            )
            if text and text != last:
                self.progress(f"  {text}")
                last = text


# ---- listing and the manifest ---------------------------------------------------------------


def spark_uri(source: str) -> str:
    """A local path becomes an absolute file: URI; a URI stays as it is."""
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", source):
        return source
    return Path(source).resolve().as_uri()


def list_source(spark: SparkSession, source: str) -> list[SourceFile]:
    """Closed event log files under ``source``, through Hadoop's FileSystem (any scheme)."""
    jvm = spark._jvm
    if jvm is None:
        raise TrendError("no JVM behind this Spark session (Spark Connect is not supported)")
    uri = spark_uri(source)
    try:
        root = jvm.org.apache.hadoop.fs.Path(uri)
        fs = root.getFileSystem(spark._jsc.hadoopConfiguration())
        if not fs.exists(root):
            raise TrendError(f"event log directory {source}: does not exist")
        if not fs.getFileStatus(root).isDirectory():
            raise TrendError(f"event log directory {source}: not a directory")
        found = []
        entries = fs.listFiles(root, True)
        while entries.hasNext():
            status = entries.next()
            path = status.getPath()
            name = str(path.getName())
            if name.endswith(".jsonl") and not name.startswith((".", "_")):
                parents = str(path.toString())[len(str(root.toString())) :].split("/")
                if any(part.startswith((".", "_")) for part in parents[:-1] if part):
                    continue  # Spark would skip a hidden directory too
                found.append(
                    SourceFile(
                        str(path.toString()),
                        int(status.getLen()),
                        int(status.getModificationTime()),
                    )
                )
    except TrendError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TrendError(f"event log directory {source}: cannot list it: {first}") from exc
    return sorted(found, key=lambda f: f.path)


def load_manifest(out: Path) -> dict[str, Any]:
    path = out / MANIFEST
    if not path.exists():
        return {"schema_version": SCHEMA_VERSION, "files": {}, "runs": []}
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TrendError(
            f"{path}: unreadable manifest ({exc}); move it away to start over"
        ) from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise TrendError(f"{path}: not a scale0-trend manifest; move it away to start over")
    return manifest


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


# ---- the job --------------------------------------------------------------------------------


def run(
    spark: SparkSession,
    source: str,
    out: Path,
    *,
    accuracy: int = DEFAULT_ACCURACY,
    full: bool = False,
    progress: Callable[[str], None] = lambda _: None,
    report: bool = True,
) -> RunResult:
    """Process the new files under ``source`` into ``out`` (a local directory)."""

    started = time.monotonic()
    if out.exists() and not out.is_dir():
        raise TrendError(f"--out {out}: exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrendError(f"--out {out}: cannot create it: {exc.strerror or exc}") from exc
    tables = out / "tables"
    if full:
        shutil.rmtree(tables, ignore_errors=True)
        (out / MANIFEST).unlink(missing_ok=True)
    manifest = load_manifest(out)
    result = RunResult(source=source, out=out)

    with StageProgress(spark, progress):
        return _run(
            spark, source, out, manifest, result, tables, accuracy, progress, report, started
        )


def _run(
    spark: SparkSession,
    source: str,
    out: Path,
    manifest: dict[str, Any],
    result: RunResult,
    tables: Path,
    accuracy: int,
    progress: Callable[[str], None],
    report: bool,
    started: float,
) -> RunResult:
    progress(f"listing {source}")
    files = list_source(spark, source)
    if not files and not manifest["files"]:
        raise TrendError(f"event log directory {source}: no closed event log files (*.jsonl)")
    seen: dict[str, Any] = manifest["files"]
    new = [f for f in files if f.path not in seen]
    result.files_changed = [
        f.path for f in files if f.path in seen and seen[f.path]["size"] != f.size
    ]
    result.files_total, result.files_new = len(files), len(new)
    progress(
        f"{len(files)} files, {len(new)} new ({sum(f.size for f in new) / 1e6:.1f} MB)"
        + (
            f", {len(result.files_changed)} changed since read (ignored)"
            if result.files_changed
            else ""
        )
    )

    events_dir = tables / "events"
    events_path = str(events_dir)
    committed = {int(r) for r in manifest.get("event_runs", [])}
    if events_dir.exists():
        for stale in events_dir.glob("run=*"):
            if not stale.name[4:].isdigit() or int(stale.name[4:]) not in committed:
                progress(f"removing {stale.name}, left by a run that did not finish")
                shutil.rmtree(stale)
    run_id = max(committed, default=0) + 1
    dates: list[str] = []
    if new:
        progress(f"parsing {len(new)} files")
        raw = (
            spark.read.schema(event_schema())
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", "_corrupt")
            .json([f.path for f in new])
        )
        raw_version = F.expr("try_cast(get_json_object(_corrupt, '$.v') AS INT)")
        version = F.coalesce(F.col("v"), raw_version)
        required = (
            F.col("v").isNull()
            | F.col("ts_ms").isNull()
            | F.col("kind").isNull()
            | F.col("broker").isNull()
            | ~F.col("kind").isin(*KINDS)
            | (
                (F.col("kind") == "request")
                & (
                    F.col("service").isNull()
                    | F.col("status").isNull()
                    | F.col("latency_ms").isNull()
                )
            )
        )
        klass = (
            F.when(version > SCHEMA_VERSION, "newer")
            .when(F.col("_corrupt").isNotNull(), "corrupt")
            .when(required | (F.col("v") < 1), "invalid")
            .otherwise("good")
        )
        good_date = F.date_format(F.timestamp_millis(F.col("ts_ms")), "yyyy-MM-dd")
        staged = raw.select(
            *[F.col(f.name) for f in FIELDS],
            F.col("_metadata.file_path").alias("file"),
            klass.alias("class"),
            F.when(version > SCHEMA_VERSION, version).alias("newer_v"),
            F.col("_corrupt").alias("line"),
        ).withColumn("date", F.when(F.col("class") == "good", good_date))
        # One pass over the JSON: every line lands in its class partition (the rejected ones
        # keep their raw line, for whoever wants to look), then it is counted from Parquet.
        run_dir = events_dir / f"run={run_id}"
        staged.write.mode("append").parquet(str(run_dir), partitionBy=["class", "date", "kind"])
        counted = (
            spark.read.parquet(str(run_dir))
            .groupBy("file", "class", "date", "newer_v")
            .count()
            .collect()
        )
        progress(
            f"appended {sum(r['count'] for r in counted if r['class'] == 'good')} records "
            "to the events table"
        )
        per_file: dict[str, dict[str, Any]] = {
            f.path: {
                "size": f.size,
                "mtime_ms": f.mtime_ms,
                "good": 0,
                "corrupt": 0,
                "newer": 0,
                "invalid": 0,
                "newer_versions": [],
            }
            for f in new
        }
        for row in counted:
            entry = per_file.setdefault(
                row["file"],
                {
                    "size": -1,
                    "mtime_ms": -1,
                    "good": 0,
                    "corrupt": 0,
                    "newer": 0,
                    "invalid": 0,
                    "newer_versions": [],
                },
            )
            entry[row["class"]] += row["count"]
            result.lines[row["class"]] = result.lines.get(row["class"], 0) + row["count"]
            if row["newer_v"] is not None and row["newer_v"] not in entry["newer_versions"]:
                entry["newer_versions"].append(row["newer_v"])
            if row["date"] is not None and row["date"] not in dates:
                dates.append(row["date"])
        seen.update(per_file)
    dates.sort()
    result.dates = dates
    if not any(events_dir.glob("run=*/class=good/date=*/kind=*/*.parquet")):
        raise TrendError(f"event log directory {source}: no valid version 1 records in any file")

    events = spark.read.parquet(events_path).filter(F.col("class") == "good")
    if dates:
        progress(
            f"service tables for {len(dates)} dates: {', '.join(dates[:5])}"
            + (" ..." if len(dates) > 5 else "")
        )
        requests = events.filter((F.col("kind") == "request") & F.col("date").isin(*dates))
        for grain, ms in (("minute", 60_000), ("hour", 3_600_000)):
            _service_table(requests, grain, ms, accuracy).write.mode("overwrite").partitionBy(
                "date"
            ).parquet(str(tables / f"service_{grain}"))
            _status_table(requests, grain, ms).write.mode("overwrite").partitionBy("date").parquet(
                str(tables / f"status_{grain}")
            )

    progress("availability, load share, config timeline, tasks")
    data_end = events.agg(F.max("ts_ms")).collect()[0][0]
    data_start = events.agg(F.min("ts_ms")).collect()[0][0]
    small = {
        "worker_availability": worker_availability(events, data_end),
        "broker_availability": broker_availability(events, data_end),
        "config_timeline": config_timeline(events),
        "management": management(events),
        "task_hour": task_hour(events, accuracy),
    }
    collected: dict[str, list[dict[str, Any]]] = {}
    for name, frame in small.items():
        frame.write.mode("overwrite").parquet(str(tables / name))
        collected[name] = _collect(frame)

    progress("summary and report")
    totals = _service_totals(events, accuracy)
    hourly = _read_rows(spark, tables / "service_hour", ["hour", "service"])
    status_hour = _read_rows(spark, tables / "status_hour", ["hour", "service", "status"])
    input_totals: dict[str, Any] = {"files": len(seen), "new_files": len(new)}
    for key in ("good", "corrupt", "newer", "invalid"):
        input_totals[key] = sum(int(v.get(key, 0)) for v in seen.values())
    input_totals["newer_versions"] = sorted(
        {int(x) for v in seen.values() for x in v.get("newer_versions", [])}
    )
    input_totals["newer_files"] = sorted(p for p, v in seen.items() if v.get("newer"))[:20]
    input_totals["corrupt_files"] = sorted(p for p, v in seen.items() if v.get("corrupt"))[:20]
    summary = {
        "schema_version": SCHEMA_VERSION,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "source": source,
        "window": {"start_ms": data_start, "end_ms": data_end},
        "percentile_accuracy": accuracy,
        "input": input_totals,
        "totals": _grand_totals(totals),
        "services": totals,
        "workers": collected["worker_availability"],
        "brokers": collected["broker_availability"],
        "config_changes": collected["config_timeline"],
        "management": collected["management"],
        "tasks": collected["task_hour"],
        "tables": {p.name: str(p) for p in sorted(tables.iterdir()) if p.is_dir()},
    }
    write_json_atomic(out / "summary.json", summary)
    if report:
        html = render(summary, hourly, status_hour)
        tmp = out / ".report.html.tmp"
        tmp.write_text(html)
        os.replace(tmp, out / "report.html")
    manifest["files"] = seen
    manifest["schema_version"] = SCHEMA_VERSION
    if new:
        manifest["event_runs"] = sorted(committed | {run_id})
    manifest["runs"] = [
        *manifest.get("runs", [])[-49:],
        {
            "at": summary["generated_at"],
            "new_files": len(new),
            "lines": result.lines,
            "dates": dates,
        },
    ]
    write_json_atomic(out / MANIFEST, manifest)
    result.summary = summary
    result.seconds = time.monotonic() - started
    return result


def _read_rows(spark: SparkSession, path: Path, order: list[str]) -> list[dict[str, Any]]:
    """A small table's rows, or [] when no run has written any (no requests yet)."""
    if not any(path.glob("date=*/*.parquet")):
        return []
    return _collect(spark.read.parquet(str(path)).orderBy(*order))


def _collect(frame: DataFrame) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts. Timestamps become ISO strings in Spark, in the session's UTC:
    collected as Python datetimes they would be naive and in the local zone of this process."""
    columns = [
        F.date_format(F.col(f.name), "yyyy-MM-dd'T'HH:mm:ss'Z'").alias(f.name)
        if isinstance(f.dataType, T.TimestampType)
        else F.col(f.name)
        for f in frame.schema.fields
    ]
    return [row.asDict() for row in frame.select(*columns).collect()]


def _service_table(requests: DataFrame, grain: str, ms: int, accuracy: int) -> DataFrame:

    bucket = (F.floor(F.col("ts_ms") / ms) * ms).cast("long")
    pct = F.percentile_approx("latency_ms", [0.5, 0.95, 0.99], accuracy)
    return (
        requests.withColumn("bucket_ms", bucket)
        .groupBy("date", "service", "bucket_ms")
        .agg(
            F.count(F.lit(1)).alias("requests"),
            F.sum(F.when(F.col("status") >= 400, 1).otherwise(0)).alias("errors"),
            pct.alias("pct"),
            F.avg("latency_ms").alias("mean_ms"),
            F.max("latency_ms").alias("max_ms"),
            F.sum("bytes_in").alias("bytes_in"),
            F.sum("bytes_out").alias("bytes_out"),
        )
        .select(
            "date",
            "service",
            F.timestamp_millis("bucket_ms").alias(grain),
            "requests",
            (F.col("requests") / (ms / 1000)).alias("throughput_rps"),
            "errors",
            (F.col("errors") / F.col("requests")).alias("error_rate"),
            F.col("pct")[0].alias("p50_ms"),
            F.col("pct")[1].alias("p95_ms"),
            F.col("pct")[2].alias("p99_ms"),
            "mean_ms",
            "max_ms",
            "bytes_in",
            "bytes_out",
        )
    )


def _status_table(requests: DataFrame, grain: str, ms: int) -> DataFrame:

    bucket = (F.floor(F.col("ts_ms") / ms) * ms).cast("long")
    counts = (
        requests.withColumn("bucket_ms", bucket)
        .groupBy("date", "service", "bucket_ms", "status")
        .agg(F.count(F.lit(1)).alias("requests"))
    )
    total = F.sum("requests").over(Window.partitionBy("service", "bucket_ms"))
    return counts.select(
        "date",
        "service",
        F.timestamp_millis("bucket_ms").alias(grain),
        "status",
        "requests",
        (F.col("requests") / total).alias("share"),
    )


def _timeline(rows: DataFrame, data_end: int, keys: list[str]) -> DataFrame:
    """Up time per entity from (keys..., ts_ms, up_after, order, gap_ms) rows (docs/trend.md)."""

    ordered = Window.partitionBy(*keys).orderBy("ts_ms", "order", "seq")
    segments = rows.select(
        *keys,
        "ts_ms",
        "up_after",
        "gap_ms",
        F.lag("up_after").over(ordered).alias("prev_up"),
        F.lag("ts_ms").over(ordered).alias("prev_ts"),
        F.coalesce(F.lead("ts_ms").over(ordered), F.lit(data_end)).alias("next_ts"),
    )
    up_ms = F.when(F.col("up_after") == 1, F.col("next_ts") - F.col("ts_ms")).otherwise(0)
    gap_down = F.when(
        F.col("gap_ms").isNotNull() & (F.col("prev_up") == 1),
        F.least(F.col("gap_ms"), F.col("ts_ms") - F.col("prev_ts")),
    ).otherwise(0)
    per = segments.groupBy(*keys).agg(
        F.min("ts_ms").alias("first_ms"),
        F.sum(up_ms).alias("up_sum"),
        F.sum(gap_down).alias("gap_sum"),
        F.count(F.lit(1)).alias("transitions"),
    )
    observed = F.lit(data_end) - F.col("first_ms")
    return per.select(
        *keys,
        F.timestamp_millis("first_ms").alias("first_seen"),
        observed.alias("observed_ms"),
        (F.col("up_sum") - F.col("gap_sum")).cast("long").alias("up_ms"),
        F.when(observed > 0, (F.col("up_sum") - F.col("gap_sum")) / observed).alias("availability"),
        "transitions",
    )


def _states(kinds: dict[str, tuple[int, int]], column: str) -> tuple[Any, Any]:

    up_after = order = None
    for kind, (up, rank) in kinds.items():
        cond = F.col(column) == kind
        up_after = F.when(cond, up) if up_after is None else up_after.when(cond, up)
        order = F.when(cond, rank) if order is None else order.when(cond, rank)
    return up_after, order


def worker_availability(events: DataFrame, data_end: int) -> DataFrame:
    """Per (broker, worker): availability from joins, leaves and heartbeat gaps; load share."""

    up_after, order = _states(WORKER_STATES, "kind")
    rows = events.filter(F.col("kind").isin(*WORKER_STATES) & F.col("worker").isNotNull()).select(
        "broker",
        "worker",
        "ts_ms",
        up_after.alias("up_after"),
        order.alias("order"),
        "gap_ms",
        F.monotonically_increasing_id().alias("seq"),
    )
    timeline = _timeline(rows, data_end, ["broker", "worker"])
    served = (
        events.filter((F.col("kind") == "request") & F.col("worker").isNotNull())
        .groupBy("broker", "worker")
        .agg(F.count(F.lit(1)).alias("requests"))
    )
    share = served.withColumn(
        "load_share", F.col("requests") / F.sum("requests").over(Window.partitionBy("broker"))
    )
    return (
        timeline.join(share, ["broker", "worker"], "full_outer")
        .fillna({"requests": 0})
        .orderBy("broker", "worker")
    )


def broker_availability(events: DataFrame, data_end: int) -> DataFrame:
    """Per broker: availability from its starts and stops and its peers' up/down; load share."""

    up_after, order = _states(BROKER_STATES, "kind")
    about = F.when(F.col("kind").isin("peer_up", "peer_down", "heartbeat_gap"), F.col("peer"))
    rows = (
        events.filter(
            F.col("kind").isin("broker_start", "broker_stop", "peer_up", "peer_down")
            | ((F.col("kind") == "heartbeat_gap") & F.col("peer").isNotNull())
        )
        .select(
            F.coalesce(about, F.col("broker")).alias("subject"),
            "ts_ms",
            up_after.alias("up_after"),
            order.alias("order"),
            "gap_ms",
            F.monotonically_increasing_id().alias("seq"),
        )
        .withColumnRenamed("subject", "broker")
    )
    timeline = _timeline(rows, data_end, ["broker"])
    served = (
        events.filter(F.col("kind") == "request")
        .groupBy("broker")
        .agg(F.count(F.lit(1)).alias("requests"))
    )
    share = served.withColumn(
        "load_share", F.col("requests") / F.sum("requests").over(Window.partitionBy())
    )
    return timeline.join(share, ["broker"], "full_outer").fillna({"requests": 0}).orderBy("broker")


def config_timeline(events: DataFrame) -> DataFrame:

    return (
        events.filter(F.col("kind").isin("config_applied", "config_refused"))
        .select(
            F.timestamp_millis("ts_ms").alias("at"),
            "broker",
            F.when(F.col("kind") == "config_applied", "applied")
            .otherwise("refused")
            .alias("outcome"),
            "config_version",
            "sha256",
            "reason",
        )
        .orderBy("at", "broker")
    )


def management(events: DataFrame) -> DataFrame:

    return (
        events.filter(F.col("kind").isin("mgmt_command", "state_change"))
        .select(
            F.timestamp_millis("ts_ms").alias("at"),
            "broker",
            "kind",
            "user",
            "command",
            "result",
            "state",
            "prev_state",
            "reason",
        )
        .orderBy("at", "broker")
    )


def task_hour(events: DataFrame, accuracy: int) -> DataFrame:
    """Per hour (of the task's end): tasks done and failed, throughput, wait and run times."""

    tasks = (
        events.filter((F.col("kind") == "task") & F.col("task_id").isNotNull())
        .groupBy("broker", "task_id")
        .agg(
            F.min(F.when(F.col("state") == "queued", F.col("ts_ms"))).alias("queued_ms"),
            F.min(F.when(F.col("state") == "running", F.col("ts_ms"))).alias("running_ms"),
            F.min(F.when(F.col("state").isin("done", "failed"), F.col("ts_ms"))).alias("end_ms"),
            F.max(F.when(F.col("state") == "failed", 1).otherwise(0)).alias("failed"),
        )
        .filter(F.col("end_ms").isNotNull())
    )
    wait = F.col("running_ms") - F.col("queued_ms")
    runtime = F.col("end_ms") - F.col("running_ms")
    return (
        tasks.withColumn("hour_ms", (F.floor(F.col("end_ms") / 3_600_000) * 3_600_000).cast("long"))
        .groupBy("hour_ms")
        .agg(
            F.count(F.lit(1)).alias("finished"),
            F.sum("failed").alias("failed"),
            F.percentile_approx(wait.cast("double"), [0.5, 0.95], accuracy).alias("wait"),
            F.percentile_approx(runtime.cast("double"), [0.5, 0.95], accuracy).alias("run"),
        )
        .select(
            F.timestamp_millis("hour_ms").alias("hour"),
            "finished",
            "failed",
            (F.col("finished") / 3600.0).alias("throughput_per_s"),
            F.col("wait")[0].alias("wait_p50_ms"),
            F.col("wait")[1].alias("wait_p95_ms"),
            F.col("run")[0].alias("run_p50_ms"),
            F.col("run")[1].alias("run_p95_ms"),
        )
        .orderBy("hour")
    )


def _service_totals(events: DataFrame, accuracy: int) -> list[dict[str, Any]]:

    rows = (
        events.filter(F.col("kind") == "request")
        .groupBy("service")
        .agg(
            F.count(F.lit(1)).alias("requests"),
            F.sum(F.when(F.col("status") >= 400, 1).otherwise(0)).alias("errors"),
            F.percentile_approx("latency_ms", [0.5, 0.95, 0.99], accuracy).alias("pct"),
            F.sum("bytes_in").alias("bytes_in"),
            F.sum("bytes_out").alias("bytes_out"),
        )
        .orderBy(F.desc("requests"), "service")
        .collect()
    )
    return [
        {
            "service": r["service"],
            "requests": r["requests"],
            "errors": r["errors"],
            "error_rate": r["errors"] / r["requests"],
            "p50_ms": r["pct"][0],
            "p95_ms": r["pct"][1],
            "p99_ms": r["pct"][2],
            "bytes_in": r["bytes_in"],
            "bytes_out": r["bytes_out"],
        }
        for r in rows
    ]


def _grand_totals(services: Iterable[dict[str, Any]]) -> dict[str, Any]:
    services = list(services)
    requests = sum(s["requests"] for s in services)
    errors = sum(s["errors"] for s in services)
    return {
        "requests": requests,
        "errors": errors,
        "error_rate": errors / requests if requests else None,
        "bytes_in": sum(s["bytes_in"] or 0 for s in services),
        "bytes_out": sum(s["bytes_out"] or 0 for s in services),
    }
