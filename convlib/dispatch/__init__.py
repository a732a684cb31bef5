"""Dispatch: from a validated problem and ``device=`` to the implementation that runs it.

- :mod:`.devices`: ``device=`` or where the data lives -> a backend and its device handle;
- :mod:`.registry`: ``(operation, backend, algorithm)`` -> implementation, imported lazily;
- :mod:`.tuning`: measured choices, kept per device identity;
- :mod:`.select`: ``algo="auto"``: rules, the tuning cache, a cost model;
- :mod:`.plan`: :class:`~.plan.Plan`, one resolved call, the one way a call runs;
- :mod:`.measure`: ``choose_algorithm(measure=True)``, timing candidate plans.

Imports only :mod:`convlib.core` and the backends below it.
"""
