"""PNG figures of a run, with matplotlib's Agg backend (no display needed).

* Sweeps (``seed-batch``, ``seed-size``): time per call against N or H = W, one line per algorithm
  beside PyTorch (and scipy), log time axis, with the memory-traffic floor when the ceilings were
  measured; and each algorithm's time as a ratio to PyTorch's.
* Case lists (``resnet50``, ``custom``): GFLOP/s per case, grouped bars per candidate, with the
  machine's FMA peak (and numpy's SGEMM rate) as horizontal lines.

Wrong answers are drawn (they are measured) but marked with an ``x`` and "(WRONG)" in the legend.
"""

from __future__ import annotations

import math
from pathlib import Path

#: Line styles of the baselines.
BASELINE_STYLE = {"torch": dict(color="black", linestyle="--", marker="s"),
                  "scipy": dict(color="grey", linestyle=":", marker="v")}
#: One colour per algorithm name, the same in every figure (red is kept for the ceilings).
ALGORITHM_COLORS = {"direct": "C0", "im2col": "C1", "blis": "C2", "winograd": "C4", "winograd2": "C5",
                    "winograd4": "C6", "auto": "C9"}
#: Extra colours for algorithm names not in the table.
SPARE_COLORS = ("C7", "C8", "olive", "navy", "teal")
#: Line style and marker per device (in the order the devices appear), for runs on several.
DEVICE_STYLES = (("-", "o"), ("-.", "^"), (":", "D"), ("--", "P"))


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _candidates(records):
    """(name, device) of every candidate timed somewhere, in the order of the records."""
    seen = []
    for r in records:
        key = (r["name"], r["device"])
        if key not in seen:
            seen.append(key)
    timed = {(r["name"], r["device"]) for r in records if r["status"] in ("ok", "wrong")}
    return [key for key in seen if key in timed]


def _label(name, device, show_device, wrong):
    label = f"{name}@{device}" if show_device else name
    return label + (" (WRONG)" if wrong else "")


def _style(name, device, records):
    """Colour by algorithm, line style and marker by device."""
    if name in BASELINE_STYLE:
        return dict(BASELINE_STYLE[name])
    names = list(dict.fromkeys(r["name"] for r in records if r["name"] not in ALGORITHM_COLORS))
    color = ALGORITHM_COLORS.get(name) or SPARE_COLORS[names.index(name) % len(SPARE_COLORS)]
    devices = list(dict.fromkeys(r["device"] for r in records if r["kind"] == "convlib"))
    linestyle, marker = DEVICE_STYLES[devices.index(device) % len(DEVICE_STYLES)]
    return dict(color=color, linestyle=linestyle, marker=marker)


def _subtitle(machine, ceilings) -> str:
    cpu = machine["cpu"]
    text = f"{cpu['model']}, {machine['numba']['num_threads']} threads, {machine['date'][:10]}"
    if ceilings:
        text += f"; peak {ceilings['fma_peak_gflops']:.0f} GFLOP/s, {ceilings['memory_bandwidth_gbs']:.0f} GB/s"
    return text


def sweep_plot(path: Path, records, *, title: str, machine: dict, ceilings: dict | None) -> Path:
    """Time vs the swept parameter (N or H = W), and the ratio to PyTorch, for every candidate."""
    plt = _pyplot()
    sweep = records[0]["sweep"]
    xlabel = {"N": "batch size N", "H": "image size H = W"}.get(sweep, sweep)
    show_device = len({r["device"] for r in records if r["kind"] == "convlib"}) > 1
    fig, (ax_time, ax_ratio) = plt.subplots(1, 2, figsize=(13, 5.2))
    for name, device in _candidates(records):
        mine = sorted((r for r in records if r["name"] == name and r["device"] == device
                       and r["status"] in ("ok", "wrong")), key=lambda r: r["sweep_value"])
        xs = [r["sweep_value"] for r in mine]
        times = [r["median_s"] for r in mine]
        wrong = any(r["status"] == "wrong" for r in mine)
        style = _style(name, device, records)
        label = _label(name, device, show_device, wrong)
        ax_time.plot(xs, times, label=label, **style)
        ratios = [(x, r["ratio_vs_torch"]) for x, r in zip(xs, mine) if _finite(r["ratio_vs_torch"])]
        if name != "torch" and ratios:
            ax_ratio.plot(*zip(*ratios), label=label, **style)
        for r in mine:
            if r["status"] == "wrong":
                ax_time.plot([r["sweep_value"]], [r["median_s"]], "x", color="red", markersize=12)
    floors = sorted({(r["sweep_value"], r["memory_floor_s"]) for r in records if _finite(r.get("memory_floor_s"))})
    if floors:
        ax_time.plot(*zip(*floors), color="red", linewidth=1, linestyle="-.", label="memory floor (bytes / bandwidth)")
    ax_time.set_yscale("log")
    ax_time.set_ylabel("median time per call (s)")
    ax_ratio.axhline(1.0, color="black", linestyle="--", linewidth=1)
    ax_ratio.set_yscale("log")
    ax_ratio.set_ylabel("time / PyTorch's time (lower is faster)")
    values = sorted({r["sweep_value"] for r in records if r["sweep_value"] is not None})
    for ax in (ax_time, ax_ratio):
        ax.set_xlabel(xlabel)
        if sweep == "H":
            ax.set_xscale("log", base=2)
        ax.set_xticks(values, [str(v) for v in values], minor=False)
        ax.set_xticks([], minor=True)
        ax.grid(True, which="both", alpha=0.3)
    ax_time.legend(fontsize=8)
    if ax_ratio.lines[1:]:
        ax_ratio.legend(fontsize=8)
    fig.suptitle(f"{title}\n{_subtitle(machine, ceilings)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def cases_plot(path: Path, records, *, title: str, machine: dict, ceilings: dict | None) -> Path:
    """GFLOP/s per case (grouped bars per candidate) with the FMA peak as a horizontal line."""
    plt = _pyplot()
    cases = list(dict.fromkeys(r["case"] for r in records))
    candidates = _candidates(records)
    show_device = len({r["device"] for r in records if r["kind"] == "convlib"}) > 1
    width = 0.8 / max(1, len(candidates))
    fig, ax = plt.subplots(figsize=(max(8.0, 0.42 * len(cases) * max(2, len(candidates)) ** 0.6 + 3), 5.8))
    devices = list(dict.fromkeys(r["device"] for r in records if r["kind"] == "convlib"))
    for j, (name, device) in enumerate(candidates):
        by_case = {r["case"]: r for r in records if r["name"] == name and r["device"] == device}
        xs, ys, wrong_xs = [], [], []
        for i, case in enumerate(cases):
            r = by_case.get(case)
            if r is not None and r["status"] in ("ok", "wrong") and _finite(r["gflops"]):
                xs.append(i + (j - (len(candidates) - 1) / 2) * width)
                ys.append(r["gflops"])
                if r["status"] == "wrong":
                    wrong_xs.append((xs[-1], ys[-1]))
        style = _style(name, device, records)
        # A second device's bars are hatched; the colour still names the algorithm.
        hatch = "//" if name not in BASELINE_STYLE and devices.index(device) % 2 else None
        ax.bar(xs, ys, width=width, color=style["color"], label=_label(name, device, show_device, bool(wrong_xs)),
               hatch=hatch, edgecolor="white" if hatch else None, linewidth=0)
        for x, y in wrong_xs:
            ax.plot([x], [y], "x", color="red", markersize=10)
    if ceilings:
        ax.axhline(ceilings["fma_peak_gflops"], color="red", linestyle="-", linewidth=1.2,
                   label=f"fp32 FMA peak {ceilings['fma_peak_gflops']:.0f} GFLOP/s")
        ax.axhline(ceilings["numpy_sgemm_gflops"], color="red", linestyle=":", linewidth=1,
                   label=f"numpy SGEMM 2048^3 {ceilings['numpy_sgemm_gflops']:.0f} GFLOP/s")
    weights = {r["case"]: r["weight"] for r in records}
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([c + (f" (x{weights[c]})" if weights[c] != 1 else "") for c in cases], rotation=50,
                       ha="right", fontsize=8)
    ax.set_ylabel("GFLOP/s (2 x multiply-adds / median time)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    ax.set_title(f"{title}\n{_subtitle(machine, ceilings)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_run(out_stem: Path, suite: str, records, machine: dict, ceilings: dict | None) -> list[Path]:
    """The figures that suit ``suite``; returns the paths written (``<out_stem>-<what>.png``).

    ``records`` are all of the run's records; untimed ones (unsupported, errors) are not drawn but
    keep the candidates' order and colours the same from figure to figure.
    """
    timed = [r for r in records if r["status"] in ("ok", "wrong")]
    if not timed:
        return []
    first = timed[0]
    dtype = first["dtype"]
    if first.get("sweep"):
        what = {"N": "time-vs-N", "H": "time-vs-HW"}.get(first["sweep"], f"time-vs-{first['sweep']}")
        fixed = (f"C={first['C']} K={first['K']} {first['R']}x{first['S']}, "
                 + (f"H=W={first['H']}" if first["sweep"] == "N" else f"N={first['N']}"))
        path = out_stem.with_name(f"{out_stem.name}-{what}.png")
        return [sweep_plot(path, records, title=f"{suite}: time per call ({fixed}, {dtype})", machine=machine,
                           ceilings=ceilings)]
    batch = sorted({r["N"] for r in records})
    title = f"{suite}: GFLOP/s per layer (batch {', '.join(map(str, batch))}, {dtype})"
    path = out_stem.with_name(f"{out_stem.name}-gflops.png")
    return [cases_plot(path, records, title=title, machine=machine, ceilings=ceilings)]


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)
