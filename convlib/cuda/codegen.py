"""Kernel source generation: straight-line register tiles that NVVM cannot fail to keep in registers.

Why generate source at all: numba lowers ``for i in range(TM)`` over a local array into loops that
NVVM unrolls only when small, and it computes every index in signed 64-bit arithmetic with a
negative-index wrap-around check. Written as loops, the GEMM's inner step measured about two
integer instructions per FMA in the PTX (see docs/gpu.md). Generated source instead names every
accumulator (``acc_3_5``), unrolls the register-tile loops in Python, and does all index arithmetic
in unsigned 64-bit integers (no wrap-around checks), so each shared-memory read is one load at a
constant offset from a per-step base.

Generated kernels stay ordinary numba-cuda Python: ``exec`` defines the function in a namespace
holding ``cuda`` (so numba-cuda's simulator can swap it for its fake module), the unsigned
constants and the dtype; the result goes through ``cuda.jit`` like any other kernel.
"""

from __future__ import annotations

import re
import textwrap

import numpy as np

from .launch import cuda, scalar_type


def unsigned_constants(**values) -> dict:
    """``values`` as ``numpy.uint64`` scalars: numba types such globals as uint64 constants."""
    return {name: np.uint64(v) for name, v in values.items()}


def indent(lines, level: int) -> str:
    """Join generated ``lines`` with ``level`` levels (4 spaces each) of indentation."""
    pad = "    " * level
    return "\n".join(pad + line for line in lines)


def compile_kernel(source: str, name: str, namespace: dict, *, simulator: bool, launch_bounds=None):
    """``exec`` the generated ``source`` and return ``cuda.jit`` of its function ``name``.

    Parameters
    ----------
    source : str
        Python source defining ``name`` (dedented here).
    namespace : dict
        Globals of the generated function: constants, ``dtype``, ``zero``.
    simulator : bool
        numba-cuda's simulator takes no launch bounds.
    launch_bounds : int or tuple, optional
        ``(max threads per block, min blocks per SM)``: caps registers so that many blocks fit.
    """
    scope = {"cuda": cuda, "U": np.uint64 if cuda is None else _uint64(), "I": _int64()}
    scope.update(namespace)
    # U(123) -> u123, a uint64 global: numba freezes it as a constant without typing a call each
    # time (typing thousands of casts dominated the compile time).
    literals = {int(n) for n in _UNSIGNED_LITERAL.findall(source)}
    scope.update({f"u{n}": np.uint64(n) for n in literals})
    source = _UNSIGNED_LITERAL.sub(lambda m: f"u{m.group(1)}", source)
    code = compile(textwrap.dedent(source), f"<convlib.cuda generated {name}>", "exec")
    exec(code, scope)  # noqa: S102 - our own generated source
    function = scope[name]
    function.__convlib_source__ = textwrap.dedent(source)
    if simulator or launch_bounds is None:
        return cuda.jit(function)
    return cuda.jit(function, launch_bounds=launch_bounds)


_UNSIGNED_LITERAL = re.compile(r"\bU\((\d+)\)")


def _uint64():
    return scalar_type("uint64")


def _int64():
    return scalar_type("int64")
