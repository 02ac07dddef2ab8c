"""tools/scale: run the scale simulator (scale0/sim/scale.py) for several N; table and plots.

    tools/scale                         # N = 10, 50, 200, mesh and gossip; plots in docs/scaling/
    tools/scale --brokers 10,50 --workers 50 --clients 100 --plots /tmp/plots
    tools/scale --topology gossip       # one topology only

Each N is one simulated family (brokers, workers, clients, traffic, then the faults); the
table has one row per N. Times are simulated seconds; the last column is this machine's wall
time for the run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from scale0.sim.scale import Options, Result, run

COLUMNS = (
    ("N", "N", "{:d}"),
    ("topology", "topology", "{}"),
    ("peer msg/s/broker", "peer msg/s/b", "{:.0f}"),
    ("peer B/s/broker", "peer B/s/b", "{:.0f}"),
    ("gossip msg/s/broker", "gsp msg/s/b", "{:.0f}"),
    ("gossip B/s/broker", "gsp B/s/b", "{:.0f}"),
    ("hb msg/s/broker", "hb msg/s/b", "{:.0f}"),
    ("hb B/s/broker", "hb B/s/b", "{:.0f}"),
    ("table msg/s/broker", "tbl msg/s/b", "{:.0f}"),
    ("table B/s/broker", "tbl B/s/b", "{:.0f}"),
    ("peer B/s family", "peer B/s fam", "{:.3g}"),
    ("cpu ms/s/broker", "cpu ms/s/b", "{:.1f}"),
    ("cpu s/s family", "cpu s/s fam", "{:.2f}"),
    ("tables KiB/broker", "tables KiB/b", "{:.0f}"),
    ("config s", "config s", "{}"),
    ("config lost-pub s", "cfg nopub s", "{}"),
    ("config msgs family", "cfg msgs fam", "{:d}"),
    ("config KiB family", "cfg KiB fam", "{:.0f}"),
    ("config cpu s family", "cfg cpu s", "{:.2f}"),
    ("start s", "start s", "{}"),
    ("new table s", "new tbl s", "{}"),
    ("dead seen s", "dead s", "{}"),
    ("pause down/up s", "pause dn/up s", "{}"),
    ("cut down/up s", "cut dn/up s", "{}"),
    ("false susp.", "false susp", "{:d}"),
    ("requests", "answered", "{:d}"),
    ("failed", "failed", "{:d}"),
    ("fwd to worker s", "fwd s", "{}"),
    ("run s", "run s", "{:.0f}"),
)


def show(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, tuple):
        return "/".join(show(v, fmt) for v in value)
    if isinstance(value, float) and fmt == "{}":
        return f"{value:.2f}"
    if isinstance(value, str):
        return value
    return fmt.format(value)


def table(results: list[Result]) -> str:
    rows = [[show(r.row()[key], fmt) for key, _, fmt in COLUMNS] for r in results]
    heads = [head for _, head, _ in COLUMNS]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(heads)]
    lines = [" | ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True))]
    lines.append("-|-".join("-" * w for w in widths))
    for row in rows:
        lines.append(" | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    return "\n".join(lines)


#: Figures whose values span orders of magnitude between the topologies: a log y axis.
LOG_Y = ("per_broker_traffic.png", "per_broker_messages.png", "family_traffic.png")


def plot(results: list[Result] | list[dict[str, Any]], directory: Path) -> list[Path]:
    """Small PNGs of what grows with N: per-broker peer traffic, CPU, table memory, times,
    and the whole family's peer traffic and cost of one config change. ``results`` are runs
    or their rows (``--replot`` reads rows from a ``--json`` file)."""
    import matplotlib  # noqa: PLC0415 (only when plotting)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    import matplotlib.ticker  # noqa: PLC0415

    directory.mkdir(parents=True, exist_ok=True)
    rows = [r.row() if isinstance(r, Result) else r for r in results]
    topologies = sorted({row.get("topology", "mesh") for row in rows})
    figures = {
        "per_broker_traffic.png": (
            "peer traffic per broker",
            "bytes / simulated s",
            [
                ("all", "peer B/s/broker"),
                ("heartbeat", "hb B/s/broker"),
                ("table", "table B/s/broker"),
                ("gossip", "gossip B/s/broker"),
            ],
        ),
        "per_broker_messages.png": (
            "peer messages per broker",
            "messages / simulated s",
            [
                ("all", "peer msg/s/broker"),
                ("heartbeat", "hb msg/s/broker"),
                ("table", "table msg/s/broker"),
                ("gossip", "gossip msg/s/broker"),
            ],
        ),
        "per_broker_cpu.png": (
            "core CPU per broker",
            "CPU ms / simulated s",
            [("cpu", "cpu ms/s/broker")],
        ),
        "per_broker_tables.png": (
            "peer tables per broker",
            "KiB",
            [("peer tables", "tables KiB/broker")],
        ),
        "family_traffic.png": (
            "whole family",
            "MB/s, MB, CPU s",
            [
                ("peer MB/s", "peer B/s family"),
                ("one config change: MB", "config KiB family"),
                ("one config change: core CPU s", "config cpu s family"),
            ],
        ),
        "times.png": (
            "times after a fault",
            "simulated s",
            [
                ("dead broker seen by all", "dead seen s"),
                ("new worker in all tables", "new table s"),
                ("config (publications lost)", "config lost-pub s"),
            ],
        ),
    }
    written = []
    for filename, (title, ylabel, series) in figures.items():
        fig, ax = plt.subplots(figsize=(5.0, 3.2), dpi=80)
        lines = 0
        for topology in topologies:
            mine = [row for row in rows if row.get("topology", "mesh") == topology]
            ns = [row["N"] for row in mine]
            style = "-" if topology == "mesh" else "--"
            for color, (label, key) in enumerate(series):
                scale = {"peer B/s family": 1e-6, "config KiB family": 1024e-6}.get(key, 1.0)
                ys = [
                    row[key] * scale if row.get(key) is not None else float("nan") for row in mine
                ]
                # All zero or missing: a series of the other topology.
                if not any(y for y in ys if not math.isnan(y)):
                    continue
                if filename in LOG_Y:
                    ys = [y if y > 0 else float("nan") for y in ys]
                ax.plot(
                    ns,
                    ys,
                    style,
                    marker="o",
                    color=f"C{color}",
                    label=f"{label} ({topology})" if len(topologies) > 1 else label,
                )
                lines += 1
        ax.set_xscale("log")
        if filename in LOG_Y:
            ax.set_yscale("log")
        ax.set_xticks(sorted({row["N"] for row in rows}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("brokers in the family (N)", fontsize=9)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if lines > 1:
            ax.legend(fontsize=6)
        fig.tight_layout()
        path = directory / filename
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--brokers", default="10,50,200", help="N values, comma separated")
    parser.add_argument(
        "--topology", default="mesh,gossip", help="family_topology values, comma separated"
    )
    parser.add_argument("--workers", type=int, default=50, help="workers per broker")
    parser.add_argument("--clients", type=int, default=100, help="clients per broker")
    parser.add_argument("--rate", type=float, default=10.0, help="requests/s per broker")
    parser.add_argument("--warmup", type=float, default=3.0, help="simulated s before measuring")
    parser.add_argument("--measure", type=float, default=5.0, help="simulated s measured")
    parser.add_argument("--step", type=float, default=0.05, help="simulated s per step")
    parser.add_argument("--plots", type=Path, default=Path("docs/scaling"), help="PNG directory")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument("--replot", type=Path, help="only draw the plots of a --json file")
    args = parser.parse_args(argv)
    if args.replot:
        for path in plot(json.loads(args.replot.read_text()), args.plots):
            print(f"# wrote {path}")
        return 0
    try:
        ns = [int(n) for n in args.brokers.split(",") if n.strip()]
    except ValueError:
        parser.error(f"--brokers {args.brokers!r}: a comma-separated list of integers")
    if not ns or min(ns) < 2:
        parser.error("--brokers: every N must be at least 2")
    topologies = [t.strip() for t in args.topology.split(",") if t.strip()]
    if not topologies or set(topologies) - {"mesh", "gossip"}:
        parser.error(f"--topology {args.topology!r}: mesh, gossip or both")
    results = []
    began = time.perf_counter()
    for n, topology in ((n, t) for t in topologies for n in ns):
        options = Options(
            topology=topology,
            brokers=n,
            workers=args.workers,
            clients=args.clients,
            rate=args.rate,
            warmup_s=args.warmup,
            measure_s=args.measure,
            step_s=args.step,
        )
        result = run(options, lambda text: print(f"# {text}", file=sys.stderr, flush=True))
        results.append(result)
        print(f"# {topology} N={n}: {result.run_s:.0f} s wall", file=sys.stderr, flush=True)
    print(table(results))
    print(
        f"# {args.workers} workers and {args.clients} clients per broker, "
        f"{args.rate:g} requests/s per broker; total wall {time.perf_counter() - began:.0f} s"
    )
    if args.json:
        rows = [r.row() | {"sim_s": r.sim_s, "phases_s": r.phases_s} for r in results]
        args.json.write_text(json.dumps(rows, indent=1))
    if not args.no_plots:
        for path in plot(results, args.plots):
            print(f"# wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
