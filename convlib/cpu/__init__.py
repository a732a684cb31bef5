"""The CPU backend: numba kernels, one module per algorithm, and the toolkit they share.

Rooms: :mod:`.backend` (data in and out), :mod:`.tables` (every tuning knob), :mod:`.isa` (what
the CPU compiles for); the algorithms :mod:`.direct`, :mod:`.im2col`, :mod:`.blis` (with its
:mod:`.packing` and :mod:`.micro_kernels`) and :mod:`.winograd` (with
:mod:`.winograd_transforms`); the toolkit :mod:`.intrinsics`, :mod:`.codegen`,
:mod:`.stack_buffer` and :mod:`.work_queue`. Every algorithm module is an implementation in the
sense of :mod:`convlib.core.contracts`. Kernels are compiled with ``cache=True`` where numba
allows it, so a new process pays the compile cost only once per machine.
"""
