"""What one benchmark shape times: convlib's algorithms as :class:`~convlib.dispatch.plan.Plan`
objects on each device, and the baselines (PyTorch, OpenCV, scipy).

A convlib candidate's call is :meth:`Plan.timed_call`: the inputs are put on the device once, here,
and each timed call runs the plan and synchronises the device, exactly what
``choose_algorithm(measure=True)`` times. ``auto`` runs the plan it chose: ``conv2d(algo="auto")``
chooses once per call signature and keeps the plan (:data:`convlib.dispatch.plan.PLANS`), so a
repeated call costs what the chosen algorithm's does. (Until 2026-11-26 the bench chose inside every
timed call: 50-100 us of Python that ``conv2d`` no longer pays, and which made ``auto`` 10-30%
slower than the very algorithm it ran on MobileNetV2's sub-millisecond layers.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..core.host_memory import available_memory_bytes
from ..core.problem import ConvProblem
from ..dispatch import registry
from ..dispatch.devices import resolve_device
from ..dispatch.plan import Plan, plan_for
from ..testing import conv2d_reference_for

#: A CPU algorithm is skipped when its workspace plus its output would take more than this share of
#: the memory available (Winograd's workspace on the 4096^2 seed shape is ~10-17 GB): an out-of-
#: memory kill would end the whole run, and hurt whoever else uses the machine.
MEMORY_HEADROOM = 0.8

#: The baselines a run can time beside convlib, all on the CPU.
BASELINES = ("torch", "opencv", "scipy")


@dataclass
class Candidate:
    """Something to time on one shape.

    Attributes
    ----------
    name : str
        The algorithm (``"direct"``, ..., ``"auto"``) or baseline (``"torch"``, ``"scipy"``).
    device : str
        Where it runs (``"cpu"``, a SYCL filter string, ``"cuda:0"``).
    kind : str
        ``"convlib"`` or ``"baseline"``.
    call : callable
        Runs once and returns the result, synchronised.
    to_host : callable
        Turns a result into a numpy array (for the correctness check).
    picked : str or None
        For ``auto``: the algorithm it ran, and ``reason`` why.
    """

    name: str
    device: str
    kind: str
    call: Callable[[], Any]
    to_host: Callable[[Any], np.ndarray] = np.asarray
    picked: str | None = None
    reason: str | None = None

    @property
    def key(self) -> str:
        return f"{self.name}@{self.device}"


@dataclass
class Skipped:
    """A candidate that was not timed on a shape, and why (``status``: unsupported, unavailable, skipped)."""

    name: str
    device: str
    kind: str
    status: str
    note: str


def memory_shortfall(plan: Plan) -> str | None:
    """Why a CPU plan should not run here for lack of memory, or None (the plan's workspace plus
    its output against ``MemAvailable``)."""
    need = plan.workspace_bytes() + plan.problem.output_bytes
    available = available_memory_bytes()
    if available is None or need <= MEMORY_HEADROOM * available:
        return None
    return (f"needs ~{need / 1e9:.1f} GB (workspace + output) but only {available / 1e9:.1f} GB are available; "
            f"skipped rather than risk the out-of-memory killer")


def convlib_candidates(problem: ConvProblem, device: str, algos, *inputs) -> list[Candidate | Skipped]:
    """One candidate per algorithm of ``algos`` (``"auto"`` allowed) on ``device``, computing
    ``problem.operation`` on ``inputs`` (its arrays: ``x, w, bias`` for ``conv2d``).

    Inputs are placed on the device here, once. Algorithms that cannot serve the problem, or
    whose module cannot be imported, come back as :class:`Skipped`, and so do CPU algorithms
    whose workspace would not fit in memory (:func:`memory_shortfall`).
    """
    target = resolve_device(device)
    backend, handle = target.backend, target.handle
    operation = problem.operation
    arrays = None

    def to_host(y):
        return np.asarray(backend.finish(y, inputs[0], handle))

    out: list[Candidate | Skipped] = []
    for algo in algos:
        try:
            why_not = None if algo == "auto" else registry.unsupported_reason(operation, backend.name, algo, problem)
            if why_not is not None:
                out.append(Skipped(algo, device, "convlib", "unsupported", why_not))
                continue
            plan = plan_for(operation, problem, target, algo)
            short = memory_shortfall(plan) if backend.name == "cpu" else None
            if short is not None:
                note = f"-> {plan.algorithm}: {short}" if algo == "auto" else short
                out.append(Skipped(algo, device, "convlib", "skipped", note))
                continue
            if arrays is None:
                arrays = plan.prepare(*inputs)
            if algo == "auto":
                # conv2d(algo="auto") chooses once per call signature and keeps the plan
                # (dispatch.plan.PLANS): a repeated call runs the chosen plan, as timed here.
                out.append(Candidate("auto", device, "convlib", plan.timed_call(*arrays), to_host, plan.algorithm,
                                     plan.reason))
            else:
                out.append(Candidate(algo, device, "convlib", plan.timed_call(*arrays), to_host))
        except NotImplementedError as exc:  # auto, when nothing serves
            out.append(Skipped(algo, device, "convlib", "unsupported", str(exc)))
        except ImportError as exc:
            out.append(Skipped(algo, device, "convlib", "unavailable", f"cannot import: {exc}"))
    return out


def torch_conv(problem: ConvProblem, x, w, bias, dtype=None) -> Callable[[], Any]:
    """``torch.nn.functional.conv2d`` on the CPU for ``problem``; inputs shared with numpy, not copied.

    Asymmetric padding, which ``conv2d`` cannot express, is an explicit ``F.pad`` inside the call.
    ``dtype`` (e.g. ``"float64"``) converts the inputs first (reference answers).
    """
    import torch
    import torch.nn.functional as F

    def tensor(a):
        if a is None:
            return None
        return torch.from_numpy(a if dtype is None else a.astype(dtype))

    xt, wt, bt = tensor(x), tensor(w), tensor(bias)
    top, bottom, left, right = problem.padding
    if top == bottom and left == right:
        def call():
            with torch.no_grad():
                return F.conv2d(xt, wt, bt, problem.stride, (top, left), problem.dilation, problem.groups)
    else:
        def call():
            with torch.no_grad():
                return F.conv2d(F.pad(xt, (left, right, top, bottom)), wt, bt, problem.stride, 0,
                                problem.dilation, problem.groups)
    return call


def torch_gradient_unsupported(problem: ConvProblem) -> str | None:
    """Why ``torch.nn.grad`` cannot compute ``problem`` (a backward pass), or None."""
    top, bottom, left, right = problem.padding
    if problem.operation == "conv2d_backward_bias":
        return None
    if top != bottom or left != right:
        return f"torch.nn.grad takes symmetric padding only, got {problem.padding}"
    return None


def torch_gradient(problem: ConvProblem, *arrays, dtype=None) -> Callable[[], Any]:
    """PyTorch's own kernels for a backward pass: ``torch.nn.grad.conv2d_input`` (oneDNN's
    backward data), ``conv2d_weight`` (backward weights), ``dy.sum((0, 2, 3))`` for the bias;
    inputs shared with numpy, not copied (``dtype`` converts them first, for references)."""
    import torch

    tensors = [torch.from_numpy(a if dtype is None else a.astype(dtype)) for a in arrays if a is not None]
    geometry = dict(stride=problem.stride, padding=(problem.padding[0], problem.padding[2]),
                    dilation=problem.dilation, groups=problem.groups)
    if problem.operation == "conv2d_backward_data":
        dy, w = tensors[:2]
        bias = tensors[2] if len(tensors) > 2 else None

        def call():
            dx = torch.nn.grad.conv2d_input(problem.x_shape, w, dy, **geometry)
            return dx if bias is None else dx + bias[None, :, None, None]
    elif problem.operation == "conv2d_backward_weight":
        x, dy = tensors

        def call():
            return torch.nn.grad.conv2d_weight(x, problem.w_shape, dy, **geometry)
    else:
        (dy,) = tensors

        def call():
            return dy.sum((0, 2, 3))
    return call


def opencv_unsupported(problem: ConvProblem) -> str | None:
    """Why ``cv2.filter2D`` cannot compute ``problem``, or None.

    filter2D correlates one channel with one kernel: it serves ``C == K == 1`` and per-channel
    filters (``groups == C == K``), one plane at a time.
    """
    if not (problem.C == problem.K == 1 or problem.groups == problem.C == problem.K):
        return (f"cv2.filter2D filters one channel with one kernel: needs C == K == 1 or groups == C == K, "
                f"got C={problem.C}, K={problem.K}, groups={problem.groups}")
    return None


def opencv_filter(problem: ConvProblem, x, w, bias) -> Callable[[], Any]:
    """``cv2.filter2D`` over every plane of ``x``, as an OpenCV user writes it.

    With ``padding = R // 2`` on odd filters (the output keeps the image's size) filter2D pads by
    itself (``BORDER_CONSTANT``, zeros); other padding is an explicit ``copyMakeBorder`` and the kernel
    is anchored at its corner. A stride keeps every ``stride``-th output (a view); a dilation spreads
    the kernel with zeros. The bias is added afterwards.
    """
    import cv2

    dh, dw = problem.dilation
    kernels = np.zeros((problem.K, (problem.R - 1) * dh + 1, (problem.S - 1) * dw + 1), w.dtype)
    kernels[:, ::dh, ::dw] = w[:, 0]
    top, bottom, left, right = problem.padding
    kh, kw = kernels.shape[1:]
    same = kh % 2 == 1 and kw % 2 == 1 and (top, bottom, left, right) == (kh // 2, kh // 2, kw // 2, kw // 2)
    sh, sw = problem.stride
    P, Q = problem.P, problem.Q

    def call():
        y = np.empty(problem.y_shape, x.dtype)
        for n in range(problem.N):
            for k in range(problem.K):
                plane = x[n, k if problem.C > 1 else 0]
                if same:
                    full = cv2.filter2D(plane, -1, kernels[k], borderType=cv2.BORDER_CONSTANT)
                    y[n, k] = full[::sh, ::sw][:P, :Q]
                else:
                    padded = cv2.copyMakeBorder(plane, top, bottom, left, right, cv2.BORDER_CONSTANT, value=0)
                    full = cv2.filter2D(padded, -1, kernels[k], anchor=(0, 0), borderType=cv2.BORDER_CONSTANT)
                    y[n, k] = full[:(P - 1) * sh + 1:sh, :(Q - 1) * sw + 1:sw]
                if bias is not None:
                    y[n, k] += bias[k]
        return y

    return call


def scipy_estimate_s(problem: ConvProblem, x, w) -> float:
    """Seconds the scipy baseline would take: one image and one filter, times ``N * K``."""
    t0 = time.perf_counter()
    conv2d_reference_for(problem, x[:1], w[:1], None, problem.dtype)
    return (time.perf_counter() - t0) * problem.N * problem.K


def gradient_baselines(problem: ConvProblem, baselines, *inputs) -> list[Candidate | Skipped]:
    """The baselines of a backward pass: PyTorch's (:func:`torch_gradient`); OpenCV and scipy
    have none."""
    out: list[Candidate | Skipped] = []
    for name in baselines:
        if name != "torch":
            out.append(Skipped(name, "cpu", "baseline", "unsupported", f"{name} has no {problem.operation}"))
            continue
        why_not = torch_gradient_unsupported(problem)
        if why_not is not None:
            out.append(Skipped("torch", "cpu", "baseline", "unsupported", why_not))
            continue
        try:
            out.append(Candidate("torch", "cpu", "baseline", torch_gradient(problem, *inputs), lambda y: y.numpy()))
        except ImportError as exc:
            out.append(Skipped("torch", "cpu", "baseline", "unavailable", f"cannot import torch: {exc}"))
    return out


def baseline_candidates(problem: ConvProblem, baselines, *inputs, scipy_max_seconds: float = 10.0
                        ) -> list[Candidate | Skipped]:
    """Candidates for the baselines named in ``baselines`` (of :data:`BASELINES`), on the CPU.

    scipy is skipped when one call is estimated to take more than ``scipy_max_seconds``; OpenCV on
    problems ``filter2D`` cannot express (:func:`opencv_unsupported`).
    """
    out: list[Candidate | Skipped] = []
    if problem.operation != "conv2d":
        return out + gradient_baselines(problem, baselines, *inputs)
    x, w, bias = inputs
    for name in baselines:
        if name == "torch":
            try:
                out.append(Candidate("torch", "cpu", "baseline", torch_conv(problem, x, w, bias), lambda y: y.numpy()))
            except ImportError as exc:
                out.append(Skipped("torch", "cpu", "baseline", "unavailable", f"cannot import torch: {exc}"))
        elif name == "opencv":
            why_not = opencv_unsupported(problem)
            if why_not is not None:
                out.append(Skipped("opencv", "cpu", "baseline", "unsupported", why_not))
                continue
            try:
                out.append(Candidate("opencv", "cpu", "baseline", opencv_filter(problem, x, w, bias)))
            except ImportError as exc:
                out.append(Skipped("opencv", "cpu", "baseline", "unavailable",
                                   f"cannot import cv2 (pip install opencv-python-headless): {exc}"))
        elif name == "scipy":
            estimate = scipy_estimate_s(problem, x, w)
            if estimate > scipy_max_seconds:
                out.append(Skipped("scipy", "cpu", "baseline", "skipped",
                                   f"estimated {estimate:.3g} s per call > --scipy-max-seconds {scipy_max_seconds:g}"))
            else:
                out.append(Candidate("scipy", "cpu", "baseline", lambda: conv2d_reference_for(problem, x, w, bias, problem.dtype)))
        else:
            raise ValueError(f"unknown baseline {name!r}; known baselines are {', '.join(BASELINES)}")
    return out


def default_algorithms(device: str, operation: str = "conv2d") -> list[str]:
    """Every algorithm ``device`` offers for ``operation``, each implementation once
    (``winograd`` and ``winograd4`` would be timed twice for nothing), then ``auto``."""
    return registry.distinct_algorithm_names(resolve_device(device).name, operation) + ["auto"]


