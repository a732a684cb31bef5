"""Source generation for the CPU micro-kernels: templates whose marked lines repeat per row and
per vector, rendered to Python source and compiled with numba.

Why generate: numba unrolls no loops, and a register tile stays in registers only when every
row and vector of it is its own statement (a loop over rows kept the accumulators in memory).
The generated functions have no source file, so they have no numba cache of their own: they are
compiled into, and cached with, the jitted caller. Editing a template does not invalidate that
cache (numba checks only the caller's bytecode): clear ``__pycache__`` after.
"""

from __future__ import annotations

#: Line markers of a template: the line is repeated for each row ``i``, for each vector ``v`` then
#: row, or for each row then vector (see :func:`render`).
PER_ROW = "#: per row"
PER_VECTOR_ROW = "#: per vector, row"
PER_ROW_VECTOR = "#: per row, vector"


def render(template: str, MR: int, NR: int = 0, L: int = 1, **constants: int) -> str:
    """Source from ``template``: lines marked ``#: per row`` repeated for each row ``i`` in
    ``range(MR)``, ``#: per vector, row`` for each vector ``v`` in ``range(NR // L)`` and row,
    ``#: per row, vector`` likewise rows outer. ``{MR}``, ``{NR}``, ``{L}`` and the names of
    ``constants`` are replaced, and in the repeated lines ``{i}``, ``{j} = v*L`` (the vector's
    first column) and ``{o} = i*NR + v*L`` (its offset in the MR x NR tile)."""
    sizes = dict(MR=MR, NR=NR, L=L, **constants)

    def at(i, v):
        return dict(i=i, j=v * L, o=i * NR + v * L)

    repeats = {
        PER_ROW: [dict(i=i) for i in range(MR)],
        PER_VECTOR_ROW: [at(i, v) for v in range(NR // L) for i in range(MR)],
        PER_ROW_VECTOR: [at(i, v) for i in range(MR) for v in range(NR // L)],
    }
    lines = []
    for line in template.splitlines():
        marker = next((m for m in repeats if line.endswith(m)), None)
        if marker is None:
            lines.append(line.format(**sizes))
        else:
            body = line[: -len(marker)].rstrip()
            lines.extend(body.format(**sizes, **index) for index in repeats[marker])
    return "\n".join(lines) + "\n"


def exec_function(source: str, name: str, namespace: dict, origin: str):
    """Compile ``source`` (rendered by :func:`render`) with the globals ``namespace`` and return
    its function ``name``; ``origin`` names the generator in tracebacks."""
    namespace = dict(namespace)
    exec(compile(source, f"<convlib {origin} {name}>", "exec"), namespace)
    return namespace[name]


def with_fma_rows_outer(template: str) -> str:
    """``template`` with its FMA lines (``vector_fma(...)`` marked ``#: per vector, row``) repeated
    row by row instead: each broadcast's FMAs together (see
    :func:`convlib.cpu.micro_kernels.fma_rows_outer` for when that pays)."""
    lines = []
    for line in template.splitlines(keepends=True):
        if line.strip().startswith("vector_fma(") and line.rstrip("\n").endswith(PER_VECTOR_ROW):
            line = line.replace(PER_VECTOR_ROW, PER_ROW_VECTOR)
        lines.append(line)
    return "".join(lines)
