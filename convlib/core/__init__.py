"""The bottom floor: values and contracts every other layer shares; imports nothing above it.

- :mod:`.problem`: :class:`~.problem.ConvProblem`, the validated problem value, and
  :func:`~.problem.make_problem`, the one place user arguments are checked;
- :mod:`.options`: library-wide options a user sets (memory caps), :func:`~.options.option_context`;
- :mod:`.knobs`: the tuning-knob tables each backend keeps, and their one override mechanism;
- :mod:`.contracts`: what a backend and an implementation must provide;
- :mod:`.timing`: the one timing loop (warm-up, interleaved repeats, medians);
- :mod:`.winograd_math`: the Winograd transform matrices every backend uses;
- :mod:`.output_cache`: the caching allocator for large results.
"""
