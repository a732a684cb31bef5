"""Straight-line Python source for the Winograd transforms, shared by the GPU-style backends.

The SYCL and CUDA kernels compute each tile's transform with named scalars, one per matrix
entry, generated from the matrices of :mod:`convlib.core.winograd_math`: zero entries dropped,
+-1 entries as additions, other entries as fused multiply-adds with constants of the working
dtype. Every product the matrices do not need is gone and float32 kernels stay in float32 (a bare
Python float in the source would promote them to float64 in numba's typing).

Only the source text lives here; each backend ``exec``s it in a namespace that supplies its own
fused multiply-add (numba-dpex's or numba-cuda's) and the constants collected by :class:`TransformSource`.
"""

from __future__ import annotations

import numpy as np


class TransformSource:
    """Collects generated source lines and the typed constants they use.

    Parameters
    ----------
    dtype : str
        The working dtype: every constant becomes a global of this scalar type.
    fma : str
        What the source calls a fused multiply-add (``"cuda.fma"`` where the CUDA simulator must
        be able to swap the module).
    """

    def __init__(self, dtype: str, fma: str = "fma"):
        self.fma = fma
        self.lines: list[str] = []
        self.constants: dict[str, object] = {}
        self._names: dict[float, str] = {}
        self.scalar = np.dtype(dtype).type

    def constant(self, value: float) -> str:
        """The name of a global holding ``value`` in the working dtype."""
        value = float(value)
        if value not in self._names:
            self._names[value] = f"K{len(self._names)}"
            self.constants[self._names[value]] = self.scalar(value)
        return self._names[value]

    def combination(self, target: str, coefficients, names) -> None:
        """``target = sum_j coefficients[j] * names[j]``, zero terms dropped, +-1 as additions."""
        plus = [n for c, n in zip(coefficients, names) if c == 1]
        minus = [n for c, n in zip(coefficients, names) if c == -1]
        scaled = [(c, n) for c, n in zip(coefficients, names) if c not in (0, 1, -1)]
        if plus:
            expr = " + ".join(plus)
            if minus:
                expr += " - " + " - ".join(minus)
        elif minus:
            expr = "-" + " - ".join(minus)
        elif scaled:
            c, n = scaled.pop(0)
            expr = f"{self.constant(c)} * {n}"
        else:
            expr = self.constant(0.0)
        for c, n in scaled:
            expr = f"{self.fma}({self.constant(c)}, {n}, {expr})"
        self.lines.append(f"{target} = {expr}")

    def two_sided(self, left: np.ndarray, right_t: np.ndarray, name_in, name_tmp, name_out) -> None:
        """``out = left @ in @ right_t.T`` on named scalars, as two 1-D passes (columns, then rows).

        ``name_in(i, j)``, ``name_tmp(i, j)`` and ``name_out(i, j)`` name the scalars.
        """
        rows_in, cols_in = left.shape[1], right_t.shape[1]
        for i in range(left.shape[0]):
            for j in range(cols_in):
                self.combination(name_tmp(i, j), left[i], [name_in(k, j) for k in range(rows_in)])
        for i in range(left.shape[0]):
            for l in range(right_t.shape[0]):
                self.combination(name_out(i, l), right_t[l], [name_tmp(i, j) for j in range(cols_in)])


def indent(lines, depth: int) -> str:
    """Join ``lines`` with ``depth`` levels (4 spaces each) of indentation."""
    return "\n".join(" " * (4 * depth) + line for line in lines)
