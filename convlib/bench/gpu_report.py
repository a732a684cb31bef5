"""The tables of :mod:`convlib.bench.gpu_check`: its JSON report rendered as markdown."""

from __future__ import annotations

import math
import statistics

#: Our candidates in the tables, in column order (``im2col-own``: im2col with that GEMM engine;
#: Winograd's engine is chosen the same way, cuBLAS by default).
OUR_ALGOS = ("direct", "blis", "im2col-own", "im2col-cublas", "winograd2", "winograd4", "winograd4-own")
#: The report's key of the ResNet-50 table of each half precision.
HALF_TABLES = {"float16": "resnet50_float16", "bfloat16": "resnet50_bfloat16"}
#: Our candidates with ``allow_tf32=True`` (compared with cuDNN TF32, not in the exact columns).
TF32_ALGOS = ("blis-tf32", "im2col-cublas-tf32", "winograd4-cublas-tf32")
#: What a user gets, against cuDNN in the same precision: ``auto`` (exact FP32, or the half
#: dtype) against cuDNN, ``auto-tf32`` (``auto`` with ``allow_tf32=True``) against cuDNN TF32.
AUTO_PAIRS = {"auto": "cudnn", "auto-tf32": "cudnn-tf32"}


def _geomean(values) -> float | None:
    """The geometric mean of ``values``, None when there are none."""
    values = list(values)
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else None


def auto_geomeans(rows) -> dict:
    """Per :data:`AUTO_PAIRS` present in ``rows``: the geometric mean over the rows of cuDNN's
    time / ``auto``'s, and how many rows it is over."""
    out = {}
    for ours, theirs in AUTO_PAIRS.items():
        ratios = [row["results"][theirs]["gpu_ms"] / row["results"][ours]["gpu_ms"] for row in rows
                  if row["results"].get(ours, {}).get("gpu_ms") and row["results"].get(theirs, {}).get("gpu_ms")]
        if ratios:
            out[ours] = {"geomean": _geomean(ratios), "layers": len(ratios)}
    return out


def _auto_line(geo: dict) -> str:
    return "\n" + "; ".join(f"{name} against {AUTO_PAIRS[name]} (its time / ours, geometric mean over "
                            f"{v['layers']} layers): **{_fmt(v['geomean'])}**" for name, v in geo.items())


def _fmt(v, digits=3):
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}g}"


def seed_table(rows, ceil) -> str:
    lines = [
        "| shape | floor (ms): bytes / FLOPs | cuDNN (ms) | cuDNN TF32 (ms) | " + " | ".join(f"{a} (ms)" for a in OUR_ALGOS) + " | best ours vs cuDNN | wall/call ours (ms) |",
        "|---|---|---|---|" + "---|" * len(OUR_ALGOS) + "---|---|",
    ]
    for row in rows:
        res = row["results"]
        floor_b = row["mbytes"] * 1e6 / (ceil["copy_GBps"] * 1e9) * 1e3
        floor_f = row["gflop"] * 1e9 / (ceil["sgemm_TFLOPs"] * 1e12) * 1e3
        ours = {a: res.get(a, {}).get("gpu_ms") for a in OUR_ALGOS}
        best = min((v, a) for a, v in ours.items() if v) if any(ours.values()) else (None, None)
        cudnn = res.get("cudnn", {}).get("gpu_ms")
        lines.append(
            f"| {row['label']} | {_fmt(floor_b)} / {_fmt(floor_f)} | {_fmt(cudnn)} | {_fmt(res.get('cudnn-tf32', {}).get('gpu_ms'))} | "
            + " | ".join(_fmt(ours[a]) for a in OUR_ALGOS)
            + f" | {best[1]}: {_fmt(cudnn / best[0] if cudnn and best[0] else None)}x faster | "
            + f"{_fmt(res.get(best[1], {}).get('wall_ms') if best[1] else None)} |"
        )
    return "\n".join(lines)


def sweep_table(rows, ceil) -> str:
    """The seed shape at other batch and image sizes: direct against cuDNN and the memory floor."""
    lines = [
        "| N, H=W (C=K=4, 3x3) | memory floor (ms) | cuDNN (ms) | direct (ms) | direct vs cuDNN | direct at % of copy bandwidth |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        res = row["results"]
        floor = row["mbytes"] * 1e6 / (ceil["copy_GBps"] * 1e9) * 1e3
        cudnn, direct = res.get("cudnn", {}).get("gpu_ms"), res.get("direct", {}).get("gpu_ms")
        lines.append(f"| {row['label']} | {_fmt(floor)} | {_fmt(cudnn)} | {_fmt(direct)} | "
                     f"{_fmt(cudnn / direct if cudnn and direct else None)}x | {_fmt(100 * floor / direct if direct else None)} |")
    return "\n".join(lines)


def resnet_table(rows) -> tuple[str, dict]:
    names = ["cudnn", "cudnn-tf32"] + [a for a in OUR_ALGOS if any(a in r["results"] for r in rows)]
    lines = [
        "| layer (batch 128) | GFLOP | " + " | ".join(f"{n} TFLOP/s" for n in names) + " | best ours / cuDNN |",
        "|---|---|" + "---|" * len(names) + "---|",
    ]
    ratios = {n: [] for n in names}
    best_ratios = []
    winograd_ratios = {n: [] for n in ("best ours", "winograd4", "winograd2")}
    for row in rows:
        res = row["results"]
        rate = {n: (row["gflop"] / res[n]["gpu_ms"] if res.get(n, {}).get("gpu_ms") else None) for n in names}
        cudnn = rate["cudnn"]
        for n in names:
            if rate[n] and cudnn:
                ratios[n].append(rate[n] / cudnn)
        ours = [rate[a] for a in OUR_ALGOS if a in rate and rate[a]]
        best = max(ours) / cudnn if ours and cudnn else None
        if best:
            best_ratios.append(best)
        if row.get("winograd_shape") and cudnn:
            winograd_ratios["best ours"].append(best)
            for n in ("winograd4", "winograd2"):
                if rate.get(n):
                    winograd_ratios[n].append(rate[n] / cudnn)
        lines.append(f"| {row['label']} | {row['gflop']:.1f} | " + " | ".join(_fmt(rate[n]) for n in names)
                     + f" | {_fmt(best)} |")
    geo = {n: _geomean(v) for n, v in ratios.items()}
    geo["best ours"] = _geomean(best_ratios)
    lines.append("| **geometric mean of throughput / cuDNN FP32** | | " + " | ".join(_fmt(geo[n]) for n in names)
                 + f" | **{_fmt(geo['best ours'])}** |")
    tf32 = []
    for row in rows:
        res = row["results"]
        theirs = res.get("cudnn-tf32", {}).get("gpu_ms")
        ours = [res[a]["gpu_ms"] for a in TF32_ALGOS if res.get(a, {}).get("gpu_ms")]
        if theirs and ours:
            tf32.append(theirs / min(ours))
    geo["tf32 best ours"] = _geomean(tf32)
    lines.append(f"\nTF32 allowed (allow_tf32=True; {', '.join(TF32_ALGOS)}): best ours / cuDNN TF32, "
                 f"geometric mean over {len(tf32)} layers: {_fmt(geo['tf32 best ours'])}")
    geo["auto"] = auto_geomeans(rows)
    if geo["auto"]:
        lines.append(_auto_line(geo["auto"]))
    wino = {n: _geomean(v) for n, v in winograd_ratios.items()}
    geo["3x3 stride 1"] = wino
    lines.append("\n3x3 stride-1 layers, throughput / cuDNN FP32, geometric mean: "
                 + ", ".join(f"{n} {_fmt(v)}" for n, v in wino.items()))
    return "\n".join(lines), geo


def render(report) -> str:
    env = report["environment"]
    parts = [f"GPU: {env['gpu']} ({env['multiprocessors']} SMs, driver/clock/memory {env['driver']}); "
             f"numba {env['numba']}, numba-cuda {env['numba_cuda']}, torch {env['torch']}, cuDNN {env['cudnn']}, CuPy {env['cupy']}"]
    if "tests" in report:
        parts.append(f"tests: {report['tests']['summary']} ({report['tests']['seconds']:.0f} s; rc {report['tests']['returncode']})")
    if "ceilings" in report:
        c = report["ceilings"]
        parts.append(f"ceilings: copy {c['copy_GBps']:.0f} GB/s (read + write); FP32 matmul (TF32 off) {c['sgemm_TFLOPs']:.1f} TFLOP/s")
        if report["seed"]:
            parts.append(seed_table(report["seed"], c))
        if report.get("seed_sweeps"):
            parts.append(sweep_table(report["seed_sweeps"], c))
        if report.get("resnet50"):
            table, geo = resnet_table(report["resnet50"])
            report["geomean"] = geo
            parts.append(table)
        for dtype, key in HALF_TABLES.items():
            if report.get(key):
                table, report[f"geomean_{dtype}"] = half_table(report[key], dtype)
                parts.append(table)
        all_rows = (report["seed"] + report.get("seed_sweeps", []) + report.get("resnet50", [])
                    + [row for key in HALF_TABLES.values() for row in report.get(key, [])])
        errors = [(r["label"], f"{n} {r['problem'].split()[-1]}", e["rel_error"])
                  for r in all_rows for n, e in r["results"].items() if "rel_error" in e]
        worst = {}
        for label, n, e in errors:
            worst[n] = max(worst.get(n, 0.0), e)
        parts.append("worst relative error vs cuDNN float64: " + ", ".join(f"{n} {e:.1e}" for n, e in worst.items()))
        failures = [(r["label"], n, e["error"]) for r in all_rows for n, e in r["results"].items() if "error" in e]
        if failures:
            parts.append("failures: " + "; ".join(f"{l}/{n}: {e}" for l, n, e in failures))
    for row in report.get("tile_sweep", []):
        best = sorted((v["gpu_ms"], k) for k, v in row["results"].items() if "gpu_ms" in v)
        parts.append(f"sweep {row['label']}: " + ", ".join(f"{k} {ms:.3f}ms" for ms, k in best[:8]))
    return "\n\n".join(parts) + "\n"


def half_table(rows, dtype) -> tuple[str, float | None]:
    """ResNet-50 in ``dtype``: our candidates' throughput against cuDNN's in the same dtype."""
    names = ["cudnn"] + [a for a in OUR_ALGOS if any(a in r["results"] for r in rows)]
    lines = [
        f"| layer (batch 128, {dtype}) | GFLOP | " + " | ".join(f"{n} TFLOP/s" for n in names) + f" | best ours / cuDNN {dtype} |",
        "|---|---|" + "---|" * len(names) + "---|",
    ]
    best_ratios = []
    for row in rows:
        res = row["results"]
        rate = {n: (row["gflop"] / res[n]["gpu_ms"] if res.get(n, {}).get("gpu_ms") else None) for n in names}
        ours = [rate[a] for a in names[1:] if rate[a]]
        best = max(ours) / rate["cudnn"] if ours and rate["cudnn"] else None
        if best:
            best_ratios.append(best)
        lines.append(f"| {row['label']} | {row['gflop']:.1f} | " + " | ".join(_fmt(rate[n]) for n in names) + f" | {_fmt(best)} |")
    geo = _geomean(best_ratios)
    lines.append(f"| **geometric mean, best ours / cuDNN {dtype}** | | " + " | ".join("" for _ in names) + f" | **{_fmt(geo)}** |")
    if auto := auto_geomeans(rows):
        lines.append(_auto_line(auto))
    return "\n".join(lines), geo
