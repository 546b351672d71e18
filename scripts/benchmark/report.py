"""Turns the measured cells into the summary, the tables and the headline the benchmark prints."""

from __future__ import annotations

import json
import math
import statistics
from typing import Any

from benchmark.constants import PATH_LABEL, PATHS, STAGING_TARGET_MB


def websocket_report(ws: dict[str, Any]) -> str:
    lines = [
        (f"### Responses over WebSocket: {ws['turns']} turns per path of {ws['messages_per_turn']} messages, "
         "one connection per path and round"),
        "",
        "| path | first delta, median (ms) | turn, median (ms) | proxy CPU per message (µs) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for path in PATHS:
        e = ws[path]
        ms = [None if e[k] is None else e[k] * 1000 for k in ("ttft_median_s", "ttlb_median_s")]
        lines.append(f"| {PATH_LABEL[path]} | {_fmt(ms[0])} | {_fmt(ms[1])} | {_fmt(e['cpu_us_per_message'], 1)} |")
    if "cpu_ratio" in ws:
        lines.append("")
        lines.append(f"WebSocket: switchyard / plain mitmdump CPU per message **{ws['cpu_ratio']:.2f}x**; added "
                     f"latency to the first delta {ws.get('added_ttft_ms', 0):+.2f} ms, to the turn's end "
                     f"{ws.get('added_ttlb_ms', 0):+.2f} ms (medians).")
    for path in PATHS:
        if ws[path]["errors"]:
            lines.append(f"{PATH_LABEL[path]} WebSocket errors: " + json.dumps(ws[path]["errors"][:5]))
    return "\n".join(lines)


def staging_verdict(staging: dict[str, Any]) -> dict[str, Any]:
    plain, sw = staging.get("plain"), staging.get("switchyard")
    if not plain or not sw:
        return {"verdict": "n/a"}
    diff = sw["rss_peak_minus_before_mb"] - plain["rss_peak_minus_before_mb"]
    held = [sw.get("rss_peak_held_mb"), plain.get("rss_peak_held_mb")]
    held_diff = None if None in held else ((sw["rss_peak_held_mb"] - sw["rss_before_mb"])
                                           - (plain["rss_peak_held_mb"] - plain["rss_before_mb"]))
    if plain["error_count"] or sw["error_count"]:
        verdict = "FAIL (streams failed or were not all held: the figure is not valid)"
    else:
        verdict = "PASS" if diff < STAGING_TARGET_MB else "FAIL"
    return {"switchyard_minus_plain_mb": diff, "switchyard_minus_plain_held_mb": held_diff,
            "target_mb": STAGING_TARGET_MB, "verdict": verdict}


def staging_report(staging: dict[str, Any]) -> str:
    n = next(iter(v["streams"] for k, v in staging.items() if k in ("plain", "switchyard")), 0)
    hold = next(iter(v["hold_s"] for k, v in staging.items() if k in ("plain", "switchyard")), 0)
    lines = [
        (f"### Staging memory: {n} concurrent streams held {hold:g} s after all reached the upstream "
         "(role + lifecycle frames only), proxy RSS sampled every 50 ms"),
        "",
        ("| proxy | complete / failed | first frame before release | RSS before (MB) | peak while all held (MB) "
         "| peak, whole phase (MB) | held peak − before (MB) | peak − before (MB) |"),
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for path in ("plain", "switchyard"):
        e = staging.get(path)
        if not e:
            continue
        held = None if e["rss_peak_held_mb"] is None else e["rss_peak_held_mb"] - e["rss_before_mb"]
        lines.append(f"| {PATH_LABEL[path]} | {e['complete']} / {e['failed']} | {e['first_data_before_release']} "
                     f"| {e['rss_before_mb']:.1f} | {_fmt(e['rss_peak_held_mb'], 1)} | {e['rss_peak_mb']:.1f} "
                     f"| {'—' if held is None else f'{held:+.1f}'} | {e['rss_peak_minus_before_mb']:+.1f} |")
    v = staging.get("verdict", {})
    if "switchyard_minus_plain_mb" in v:
        held_diff = v["switchyard_minus_plain_held_mb"]
        lines.append(f"| switchyard − plain | | | | | | {'—' if held_diff is None else f'{held_diff:+.1f}'} "
                     f"| **{v['switchyard_minus_plain_mb']:+.1f}** |")
        lines.append("")
        lines.append(f"Target: switchyard's peak − before at most {v['target_mb']:g} MB beyond plain "
                     f"mitmdump's: **{v['verdict']}** ({v['switchyard_minus_plain_mb']:+.1f} MB).")
    for path in ("plain", "switchyard"):
        e = staging.get(path)
        if e and e["errors"]:
            lines.append(f"{PATH_LABEL[path]} staging errors ({e['error_count']}): " + json.dumps(e["errors"]))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# Statistics and the report
# --------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(cells: list[dict[str, Any]], rss_peak_kb: dict[tuple[str, int], int], concurrency: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in concurrency:
        for kind in ("happy", "burst", "fallback", "translated", "continue"):
            for path in PATHS:
                mine = [cell for cell in cells if cell["path"] == path and cell["kind"] == kind and cell["concurrency"] == c]
                if not mine:
                    continue
                samples = [s for cell in mine for s in cell["samples"]]
                good = [s for s in samples if s["ok"]]
                streams = sum(cell["streams"] for cell in mine)

                def col(name: str) -> list[float]:
                    return [s[name] for s in good if s[name] is not None]

                entry: dict[str, Any] = {
                    "streams": streams,
                    "failed": len(samples) - len(good),
                    "errors": sorted({s["error"] for s in samples if s["error"]})[:5],
                }
                for name in ("ttfb", "ttft", "ttlb", "tte", "backup_ttft", "cut_gap"):
                    values = col(name)
                    if values:
                        entry[name] = {"median": median(values), "p90": percentile(values, 90),
                                       "p99": percentile(values, 99), "n": len(values)}
                if mine[0]["proxy_cpu_s"] is not None:
                    entry["proxy_cpu_s_per_stream"] = sum(cell["proxy_cpu_s"] for cell in mine) / streams
                    entry["proxy_cpu_s_per_stream_by_round"] = [cell["proxy_cpu_s"] / cell["streams"] for cell in mine]
                    entry["proxy_kernel_cpu_s_per_stream"] = sum(cell["proxy_kernel_cpu_s"] for cell in mine) / streams
                    entry["proxy_wakeups_per_stream"] = sum(cell["proxy_wakeups"] for cell in mine) / streams
                    entry["proxy_busy_pct"] = 100 * sum(cell["proxy_cpu_s"] for cell in mine) / sum(cell["wall_s"] for cell in mine)
                entry["upstream_cpu_s_per_stream"] = sum(cell["upstream_cpu_s"] for cell in mine) / streams
                entry["client_cpu_s_per_stream"] = sum(cell["client_cpu_s"] for cell in mine) / streams
                if path != "direct":
                    entry["proxy_rss_peak_mb"] = rss_peak_kb.get((path, c), 0) / 1024
                out[f"{kind}/c{c}/{path}"] = entry
    return out


def _fmt(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _ratio(sw: float | None, plain: float | None) -> str:
    if sw is None or plain is None or abs(plain) < 1e-9:
        return "—"
    if plain < 0 or sw < 0:
        return "n/a (negative)"
    return f"{sw / plain:.2f}x"


def _diff(sw: float | None, plain: float | None, digits: int = 2) -> str:
    if sw is None or plain is None:
        return "—"
    return f"{sw - plain:+.{digits}f}"


def _less(value: float | None, *others: float | None) -> float | None:
    """`value` minus the others; None when any of them is missing."""
    for other in others:
        if value is None or other is None:
            return None
        value -= other
    return value


def report(summary: dict[str, Any], concurrency: list[int]) -> str:
    lines = [
        "| c | figure | direct | plain mitmdump | switchyard | switchyard / plain | switchyard − plain |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]

    def row(c: int, label: str, values: dict[str, float | None], digits: int = 2, diff: bool = True) -> None:
        sw, plain = values.get("switchyard"), values.get("plain")
        lines.append(
            f"| {c} | {label} | {_fmt(values.get('direct'), digits)} | {_fmt(plain, digits)} | {_fmt(sw, digits)} "
            f"| {_ratio(sw, plain)} | {_diff(sw, plain, digits) if diff else '—'} |"
        )

    def get(kind: str, c: int, path: str, *keys: str, scale: float = 1.0) -> float | None:
        node: Any = summary.get(f"{kind}/c{c}/{path}")
        for key in keys:
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return None if node is None else node * scale

    for c in concurrency:
        for label, key in (("TTFB", "ttfb"), ("TTFT (first content)", "ttft"), ("TTLB", "ttlb")):
            for stat in ("median", "p99"):
                row(c, f"{label} {stat} (ms)", {p: get("happy", c, p, key, stat, scale=1000) for p in PATHS})
        row(c, "proxy CPU per stream (ms)", {p: get("happy", c, p, "proxy_cpu_s_per_stream", scale=1000) for p in PATHS})
        row(c, "… of which in the kernel (stime, ms)",
            {p: get("happy", c, p, "proxy_kernel_cpu_s_per_stream", scale=1000) for p in PATHS})
        row(c, "proxy wake-ups per stream (schedstat)", {p: get("happy", c, p, "proxy_wakeups_per_stream") for p in PATHS}, 0)
        row(c, "proxy CPU busy (% of one core, over the cells)", {p: get("happy", c, p, "proxy_busy_pct") for p in PATHS}, 0)
        row(c, "proxy peak RSS (MB, sampled; RSS never shrinks, so this is the high-water mark so far)", {p: get("happy", c, p, "proxy_rss_peak_mb") for p in PATHS}, 1)
        row(c, "failed streams", {p: get("happy", c, p, "failed") for p in PATHS}, 0)
        if f"burst/c{c}/plain" in summary:
            for stat in ("median", "p90", "p99"):
                row(c, f"burst of {c} started together: TTFT {stat} from the burst's start (ms)",
                    {p: get("burst", c, p, "ttft", stat, scale=1000) for p in PATHS})
            row(c, f"burst of {c}: TTLB median (ms)", {p: get("burst", c, p, "ttlb", "median", scale=1000) for p in PATHS})
            row(c, f"burst of {c}: proxy CPU per stream (ms)",
                {p: get("burst", c, p, "proxy_cpu_s_per_stream", scale=1000) for p in PATHS})
            row(c, f"burst of {c}: failed streams", {p: get("burst", c, p, "failed") for p in PATHS}, 0)
        # fallback
        ref_tte = get("fallback", c, "direct", "tte", "median", scale=1000)
        ref_backup = get("fallback", c, "direct", "backup_ttft", "median", scale=1000)
        ref = None if ref_tte is None or ref_backup is None else ref_tte + ref_backup
        fb = {p: get("fallback", c, p, "ttft", "median", scale=1000) for p in PATHS}
        row(c, "fallback: time to backup's first content, median (ms)", fb)
        row(c, "fallback: time to backup's first content, p99 (ms)",
            {p: get("fallback", c, p, "ttft", "p99", scale=1000) for p in PATHS})
        row(c, "fallback: failing upstream's time-to-error, median (ms)",
            {p: get("fallback", c, p, "tte", "median", scale=1000) for p in PATHS})
        row(c, "fallback: added beyond direct time-to-error + direct backup TTFT (ms)",
            {p: _less(fb[p], ref) for p in PATHS})
        row(c, "fallback: extra over the same path's happy TTFT, beyond direct time-to-error (ms)",
            {p: _less(fb[p], get("happy", c, p, "ttft", "median", scale=1000), ref_tte) for p in PATHS})
        row(c, "fallback: proxy CPU per stream (ms)",
            {p: get("fallback", c, p, "proxy_cpu_s_per_stream", scale=1000) for p in PATHS})
        row(c, "fallback: failed streams", {p: get("fallback", c, p, "failed") for p in PATHS}, 0)
        if f"translated/c{c}/switchyard" in summary:  # --translated: the backup speaks Anthropic Messages
            row(c, "translated fallback (backup: Anthropic Messages): time to backup's first content, median (ms)",
                {p: get("translated", c, p, "ttft", "median", scale=1000) for p in PATHS}, diff=False)
            row(c, "translated fallback: time to backup's first content, p99 (ms)",
                {p: get("translated", c, p, "ttft", "p99", scale=1000) for p in PATHS}, diff=False)
            row(c, "translated fallback: TTLB median (ms)",
                {p: get("translated", c, p, "ttlb", "median", scale=1000) for p in PATHS}, diff=False)
            row(c, "translated fallback: proxy CPU per stream (ms)",
                {p: get("translated", c, p, "proxy_cpu_s_per_stream", scale=1000) for p in PATHS}, diff=False)
            row(c, "translated fallback: failed streams", {p: get("translated", c, p, "failed") for p in PATHS}, 0,
                diff=False)
        row(c, "continue after cut: cut to first continued content, median (ms)",
            {p: get("continue", c, p, "cut_gap", "median", scale=1000) for p in PATHS}, diff=False)
        row(c, "continue after cut: cut to first continued content, p99 (ms)",
            {p: get("continue", c, p, "cut_gap", "p99", scale=1000) for p in PATHS}, diff=False)
        row(c, "continue after cut: added beyond direct backup TTFT (ms)",
            {p: _less(get("continue", c, p, "cut_gap", "median", scale=1000), ref_backup) for p in PATHS}, diff=False)
        row(c, "continue after cut: failed streams", {p: get("continue", c, p, "failed") for p in PATHS}, 0, diff=False)
    return "\n".join(lines)


def translated_report(summary: dict[str, Any], concurrency: list[int]) -> str | None:
    """Switchyard's translated fallback (the backup speaks Anthropic Messages) against its
    same-API fallback, measured in the same run; None without --translated."""
    rows = []
    for c in concurrency:
        same, other = summary.get(f"fallback/c{c}/switchyard"), summary.get(f"translated/c{c}/switchyard")
        if not same or not other:
            continue
        for label, keys in (("time to backup's first content, median (ms)", ("ttft", "median")),
                            ("time to backup's first content, p99 (ms)", ("ttft", "p99")),
                            ("proxy CPU per stream (ms)", ("proxy_cpu_s_per_stream",))):
            values: list[float | None] = []
            for entry in (same, other):
                node: Any = entry
                for key in keys:
                    node = node.get(key) if isinstance(node, dict) else None
                values.append(None if node is None else node * 1000)
            rows.append(f"| {c} | {label} | {_fmt(values[0])} | {_fmt(values[1])} | {_ratio(values[1], values[0])} "
                        f"| {_diff(values[1], values[0])} |")
        rows.append(f"| {c} | failed streams | {same['failed']} | {other['failed']} | | |")
    if not rows:
        return None
    return "\n".join(["### Fallback to a backup of another API (switchyard; client: Chat Completions, backup: "
                      "Anthropic Messages, translated) against a same-API fallback, same run", "",
                      "| c | figure | same-API fallback | translated fallback | translated / same | translated − same |",
                      "| --- | --- | ---: | ---: | ---: | ---: |", *rows])


def _by_round(cells: list[dict[str, Any]], kind: str, c: int, figure: Any) -> dict[str, list[float]]:
    """figure(cells of one path in one round) per round, for plain and switchyard."""
    out: dict[str, list[float]] = {}
    for path in ("plain", "switchyard"):
        rounds = sorted({cell["round"] for cell in cells if cell["kind"] == kind and cell["concurrency"] == c})
        values = []
        for r in rounds:
            mine = [cell for cell in cells if cell["kind"] == kind and cell["concurrency"] == c
                    and cell["path"] == path and cell["round"] == r]
            value = figure(mine) if mine else None
            if value is not None:
                values.append(value)
        out[path] = values
    return out


def _ttft_stat(q: float) -> Any:
    def figure(cells: list[dict[str, Any]]) -> float | None:
        return percentile([s["ttft"] for cell in cells for s in cell["samples"] if s["ok"] and s["ttft"] is not None], q)
    return figure


def _cpu_per_stream(cells: list[dict[str, Any]]) -> float | None:
    streams = sum(cell["streams"] for cell in cells)
    return sum(cell["proxy_cpu_s"] for cell in cells) / streams if streams else None


def headline(summary: dict[str, Any], cells: list[dict[str, Any]], concurrency: list[int], bursts: list[int]) -> str:
    """The figures a user compares first: first content under a burst and CPU per stream,
    each against plain mitmdump in this run (with the ratio of every round)."""
    lines = [
        "| figure | plain mitmdump | switchyard | switchyard / plain | by round |",
        "| --- | ---: | ---: | ---: | --- |",
    ]

    def add(label: str, kind: str, c: int, keys: tuple[str, ...], figure: Any) -> None:
        values = []
        for path in ("plain", "switchyard"):
            node: Any = summary.get(f"{kind}/c{c}/{path}")
            for key in keys:
                node = node.get(key) if isinstance(node, dict) else None
            values.append(None if node is None else node * 1000)
        if values[0] is None and values[1] is None:
            return
        per_round = _by_round(cells, kind, c, figure)
        rounds = ", ".join(_ratio(sw, pl) for sw, pl in zip(per_round["switchyard"], per_round["plain"]))
        lines.append(f"| {label} | {_fmt(values[0])} ms | {_fmt(values[1])} ms | {_ratio(values[1], values[0])} "
                     f"| {rounds} |")

    for c in bursts:
        for stat, q in (("median", 50), ("p90", 90)):
            add(f"time to first content, {c} requests started together, {stat}", "burst", c, ("ttft", stat),
                _ttft_stat(q))
    if 1 in concurrency:
        add("time to first content, concurrency 1, median", "happy", 1, ("ttft", "median"), _ttft_stat(50))
    for c in concurrency:
        add(f"proxy CPU per stream, concurrency {c}", "happy", c, ("proxy_cpu_s_per_stream",), _cpu_per_stream)
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
