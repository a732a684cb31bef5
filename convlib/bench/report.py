"""Results: flat records per (shape, candidate), a summary per candidate, JSON, CSV and a table.

A record is one candidate (an algorithm on a device, or a baseline) on one case of a suite. To the
timings of :func:`convlib.bench.runner.run_problem` it adds the case (suite, label, weight, the
problem's fields) and what the timings mean: GFLOP/s (``problem.flops / median``), the time ratio
to PyTorch (and to OpenCV, where it ran) on the same shape, the fraction of the machine's FMA peak and of the memory floor
(``problem.bytes_moved / bandwidth``, divided by the median: 1.0 means the kernel moves data as fast
as a plain copy could), and ``x_floor``: the median over the larger of the memory floor and the compute
floor (``problem.flops / peak``), the time no kernel on this machine can beat (1.0 at best).
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

#: Version of the JSON layout written by :func:`write_json`.
FORMAT_VERSION = 1

#: Baselines every record gets a time ratio to (``ratio_vs_torch``, ``ratio_vs_opencv``).
RATIO_BASELINES = ("torch", "opencv")

#: Record fields written to CSV, in order (the JSON has these plus ``times_s`` and ``reason``).
CSV_FIELDS = (
    "suite", "case", "weight", "name", "device", "kind", "status", "picked",
    "N", "C", "H", "W", "K", "R", "S", "stride", "padding", "dilation", "groups", "dtype", "has_bias",
    "P", "Q", "flops", "bytes_moved",
    "median_s", "min_s", "q25_s", "q75_s", "iqr_s", "repeats", "first_s", "compile_s",
    "gflops", "ratio_vs_torch", "ratio_vs_opencv", "frac_fma_peak", "memory_floor_s", "frac_memory_floor",
    "compute_floor_s", "x_floor",
    "rel_error", "reference", "note",
)


def case_records(suite: str, case, records: list[dict], ceilings: dict | None) -> list[dict]:
    """``records`` of one case (from ``run_problem``) with the case's fields and derived figures."""
    p = case.problem
    baseline_s = {}
    for name in RATIO_BASELINES:
        rec = next((r for r in records if r["name"] == name and r["status"] in ("ok", "wrong")), None)
        baseline_s[name] = rec["median_s"] if rec else math.nan
    peak = (ceilings or {}).get("fma_peak_gflops")
    bandwidth = (ceilings or {}).get("memory_bandwidth_gbs")
    floor_s = p.bytes_moved / (bandwidth * 1e9) if bandwidth else math.nan
    compute_floor_s = p.flops / (peak * 1e9) if peak else math.nan
    # The machine's floor for this shape: it can neither move the bytes faster nor do the FMAs.
    machine_floor_s = max(f for f in (floor_s, compute_floor_s, 0.0) if f == f)
    out = []
    for rec in records:
        full = {
            "suite": suite, "case": case.label, "weight": case.weight, "sweep": case.sweep,
            "sweep_value": case.sweep_value,
            "N": p.N, "C": p.C, "H": p.H, "W": p.W, "K": p.K, "R": p.R, "S": p.S,
            "stride": "x".join(map(str, p.stride)), "padding": ",".join(map(str, p.padding)),
            "dilation": "x".join(map(str, p.dilation)), "groups": p.groups, "dtype": p.dtype,
            "has_bias": p.has_bias, "P": p.P, "Q": p.Q, "flops": p.flops, "bytes_moved": p.bytes_moved,
            "memory_floor_s": floor_s, "compute_floor_s": compute_floor_s,
        }
        full.update(rec)
        median = rec.get("median_s", math.nan)
        timed = rec["status"] in ("ok", "wrong") and median == median and median > 0
        full["gflops"] = p.flops / median / 1e9 if timed else math.nan
        for name, base_s in baseline_s.items():
            full[f"ratio_vs_{name}"] = median / base_s if timed and base_s == base_s else math.nan
        full["frac_fma_peak"] = full["gflops"] / peak if timed and peak else math.nan
        full["frac_memory_floor"] = floor_s / median if timed else math.nan
        full["x_floor"] = median / machine_floor_s if timed and machine_floor_s > 0 else math.nan
        out.append(full)
    return out


def _finite(values):
    return [v for v in values if v is not None and isinstance(v, (int, float)) and math.isfinite(v)]


def summarize(records: list[dict]) -> list[dict]:
    """One row per candidate (name, device) over every case of the run.

    Returns
    -------
    list of dict
        ``name, device, kind``; ``cases``, ``ok`` and ``wrong`` (counts); ``geomean_ratio_vs_torch``
        and ``worst_ratio_vs_torch`` (with ``worst_case``) over the cases both ran, and
        ``geomean_ratio_vs_opencv``;
        ``weighted_total_s`` (sum of weight x median, only when every case ran, as ResNet-50's
        per-network total); ``mean_frac_fma_peak``; for ``auto``: ``within_10pct_of_best`` (the
        fraction of cases where the algorithm it picked took at most 1.1x the fastest explicit
        algorithm of its device: the picked algorithm's own timing when the run timed it, else
        auto's).
    """
    keys = []
    for r in records:
        if (r["name"], r["device"]) not in keys:
            keys.append((r["name"], r["device"]))
    cases = list(dict.fromkeys(r["case"] for r in records))
    rows = []
    for name, device in keys:
        mine = [r for r in records if r["name"] == name and r["device"] == device]
        timed = [r for r in mine if r["status"] in ("ok", "wrong")]
        ratios = [(r["ratio_vs_torch"], r["case"]) for r in timed if _finite([r.get("ratio_vs_torch")])]
        row = {
            "name": name, "device": device, "kind": mine[0]["kind"], "cases": len(cases),
            "ok": sum(r["status"] == "ok" for r in mine), "wrong": sum(r["status"] == "wrong" for r in mine),
            "geomean_ratio_vs_torch": _geomean(v for v, _ in ratios),
            "worst_ratio_vs_torch": max(ratios)[0] if ratios else math.nan,
            "worst_case": max(ratios)[1] if ratios and name != "torch" else None,
            "weighted_total_s": (sum(r["weight"] * r["median_s"] for r in timed) if len(timed) == len(cases)
                                 else math.nan),
            "geomean_ratio_vs_opencv": _geomean(r.get("ratio_vs_opencv") for r in timed),
            "mean_frac_fma_peak": _mean(r.get("frac_fma_peak") for r in timed),
        }
        if name == "auto":
            hits = total = 0
            for case in cases:
                auto = next((r for r in timed if r["case"] == case), None)
                explicit = {r["name"]: r["median_s"] for r in records if r["case"] == case and r["device"] == device
                            and r["kind"] == "convlib" and r["name"] != "auto" and r["status"] == "ok"}
                if auto is None or not explicit:
                    continue
                total += 1
                # The choice is what is judged: the algorithm auto picked, as timed on its own in the
                # same run, against the fastest (auto's own timing of that same kernel differs from it
                # by noise alone); auto's own time where its pick was not timed.
                chosen = explicit.get(auto.get("picked"), auto["median_s"])
                hits += chosen <= 1.1 * min(explicit.values())
            row["within_10pct_of_best"] = hits / total if total else math.nan
        rows.append(row)
    return rows


def _geomean(values) -> float:
    values = _finite(values)
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else math.nan


def _mean(values) -> float:
    values = _finite(values)
    return statistics.fmean(values) if values else math.nan


def _uses_winograd(record: dict) -> bool:
    return any(str(record.get(key) or "").startswith("winograd") for key in ("name", "picked"))


def warnings_for(records: list[dict], ceilings: dict | None) -> list[str]:
    """Things a reader of the run must know: wrong answers, rates above the measured ceilings."""
    out = []
    wrong = [f"{r['name']}@{r['device']} on {r['case']}" for r in records if r["status"] == "wrong"]
    if wrong:
        out.append(f"{len(wrong)} result(s) failed the correctness check: {', '.join(wrong)}")
    # Winograd does fewer multiplications than the direct FLOP count its rate is quoted in, so
    # only the other methods' rates can show that the ceilings were measured too low.
    above = [r for r in records if _finite([r.get("frac_fma_peak")]) and r["frac_fma_peak"] > 1.05
             and not _uses_winograd(r)]
    if above and ceilings:
        out.append(f"{len(above)} rate(s) exceed the measured FMA peak ({ceilings['fma_peak_gflops']} GFLOP/s; "
                   f"1 thread {ceilings.get('fma_peak_1thread_gflops', '?')}): the ceilings were measured while "
                   f"the machine was busy (load average then {ceilings.get('load_average')}); measure them again")
    return out


# ------------------------------------------------------------------------------------------
# Files
# ------------------------------------------------------------------------------------------
def _jsonable(value):
    """NaN and infinities become None (strict JSON); everything else as is."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_json(path: Path, payload: dict) -> None:
    """``payload`` (suite, command, config, machine, ceilings, records, summary) as strict JSON."""
    payload = {"format": FORMAT_VERSION, **payload}
    path.write_text(json.dumps(_jsonable(payload), indent=1) + "\n")


def read_json(path: Path) -> dict:
    """A results file written by :func:`write_json` (None where NaN was)."""
    data = json.loads(Path(path).read_text())
    if data.get("format") != FORMAT_VERSION:
        raise ValueError(f"{path}: results format {data.get('format')!r}, this version reads {FORMAT_VERSION}")
    for rec in data["records"]:
        for k, v in rec.items():
            if v is None and (k.endswith(("_s", "gflops", "frac_fma_peak", "frac_memory_floor", "rel_error"))
                              or k.startswith("ratio_vs_")):
                rec[k] = math.nan
    return data


def write_csv(path: Path, records: list[dict]) -> None:
    """One row per record, the columns of :data:`CSV_FIELDS` (empty cells where there is no value)."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for rec in records:
            writer.writerow({k: ("" if v is None or (isinstance(v, float) and not math.isfinite(v)) else v)
                             for k, v in rec.items()})


# ------------------------------------------------------------------------------------------
# Text
# ------------------------------------------------------------------------------------------
def _num(value, fmt, scale=1.0) -> str:
    if value is None or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "-"
    return format(value * scale, fmt)


def case_table(records: list[dict], *, show_device: bool) -> str:
    """A readable table of one case's records (headed by the shape)."""
    first = records[0]
    head = (f"{first['case']}  [N={first['N']} C={first['C']} H={first['H']} W={first['W']} K={first['K']} "
            f"{first['R']}x{first['S']} stride={first['stride']} pad={first['padding']}"
            + (f" dil={first['dilation']}" if first["dilation"] != "1x1" else "")
            + (f" groups={first['groups']}" if first["groups"] != 1 else "")
            + f" {first['dtype']}]  {first['flops'] / 1e9:.3g} GFLOP"
            + (f", memory floor {_num(first['memory_floor_s'], '.3g', 1e3)} ms"
               if _finite([first.get("memory_floor_s")]) else "")
            + (f", compute floor {_num(first['compute_floor_s'], '.3g', 1e3)} ms"
               if _finite([first.get("compute_floor_s")]) else "")
            + (f", x{first['weight']} in the network" if first["weight"] != 1 else ""))
    opencv = any(_finite([r.get("ratio_vs_opencv")]) for r in records)
    columns = ("candidate", "status", "median ms", "min ms", "IQR ms", "GFLOP/s", "x torch") + (
        ("x opencv",) if opencv else ()) + ("%peak", "%floor", "x floor", "compile s", "rel.err", "note")
    rows = []
    for r in records:
        name = f"{r['name']}@{r['device']}" if show_device else r["name"]
        note = r.get("note") or ""
        if r.get("picked"):
            cached = " (tuning cache)" if "tuning cache" in (r.get("reason") or "") else ""
            note = f"-> {r['picked']}{cached}" + (f"; {note}" if note else "")
        rows.append((
            name, r["status"], _num(r.get("median_s"), ".4g", 1e3), _num(r.get("min_s"), ".4g", 1e3),
            _num(r.get("iqr_s"), ".3g", 1e3), _num(r.get("gflops"), ".1f"), _num(r.get("ratio_vs_torch"), ".3f"),
        ) + ((_num(r.get("ratio_vs_opencv"), ".3f"),) if opencv else ()) + (
            _num(r.get("frac_fma_peak"), ".0%"), _num(r.get("frac_memory_floor"), ".0%"),
            _num(r.get("x_floor"), ".2f"), _num(r.get("compile_s"), ".2f"), _num(r.get("rel_error"), ".1e"), note[:90],
        ))
    return head + "\n" + _grid(columns, rows)


def summary_table(summary: list[dict], *, show_device: bool) -> str:
    """The per-candidate summary as a table."""
    opencv = any(_finite([s.get("geomean_ratio_vs_opencv")]) for s in summary)
    columns = ("candidate", "ok/cases", "wrong", "geomean x torch", "worst x torch", "worst case") + (
        ("geomean x opencv",) if opencv else ()) + ("weighted total ms", "mean %peak", "auto within 10%")
    rows = []
    for s in summary:
        name = f"{s['name']}@{s['device']}" if show_device else s["name"]
        rows.append((
            name, f"{s['ok']}/{s['cases']}", str(s["wrong"]), _num(s["geomean_ratio_vs_torch"], ".3f"),
            _num(s["worst_ratio_vs_torch"], ".3f"), s["worst_case"] or "-",
        ) + ((_num(s.get("geomean_ratio_vs_opencv"), ".3f"),) if opencv else ()) + (
            _num(s["weighted_total_s"], ".4g", 1e3),
            _num(s["mean_frac_fma_peak"], ".0%"), _num(s.get("within_10pct_of_best"), ".0%"),
        ))
    return ("summary (ratios: median time / the baseline's median time on the same shape)\n"
            + _grid(columns, rows))


def machine_lines(machine: dict, ceilings: dict | None) -> str:
    """Two or three lines saying where and with what the run was made."""
    cpu = machine["cpu"]
    v = machine["versions"]
    lines = [
        f"{cpu['model']} ({', '.join(cpu['flags'])}; LLVM: {cpu['llvm_cpu_name']}), "
        f"{machine['numba']['num_threads']} numba threads ({machine['numba']['threading_layer']}), "
        f"torch threads {machine['torch']['num_threads'] if machine.get('torch') else '-'}, "
        f"load average {machine.get('load_average')}",
        f"convlib {v.get('convlib')} ({machine.get('git')}), numba {v.get('numba')}, numpy {v.get('numpy')} "
        f"({machine.get('numpy_blas')}), torch {v.get('torch')}, scipy {v.get('scipy')}; "
        f"env: {' '.join(f'{k}={val}' for k, val in machine['env'].items()) or '-'}",
    ]
    if ceilings:
        lines.append(f"ceilings: fp32 FMA peak {ceilings['fma_peak_gflops']} GFLOP/s, memory bandwidth "
                     f"{ceilings['memory_bandwidth_gbs']} GB/s, numpy SGEMM 2048^3 {ceilings['numpy_sgemm_gflops']} "
                     f"GFLOP/s ({ceilings['threads']} threads)")
    return "\n".join(lines)


def _grid(columns, rows) -> str:
    widths = [max(len(str(c)), *(len(str(r[i])) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]
    # Names left-aligned, numbers right-aligned, the note free-running.
    def line(cells):
        out = []
        for i, (cell, width) in enumerate(zip(cells, widths)):
            if i in (0, 1) or i == len(cells) - 1:
                out.append(str(cell).ljust(width))
            else:
                out.append(str(cell).rjust(width))
        return "  ".join(out).rstrip()

    return "\n".join([line(columns), line(["-" * w for w in widths])] + [line(r) for r in rows])
