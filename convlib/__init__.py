"""convlib: batched 2-D convolution for Python, several algorithms on several devices.

>>> import numpy as np, convlib
>>> x = np.random.rand(8, 3, 32, 32).astype(np.float32)
>>> w = np.random.rand(16, 3, 3, 3).astype(np.float32)
>>> convlib.conv2d(x, w, padding=1).shape
(8, 16, 32, 32)

Public names: :func:`conv2d` and its gradients :func:`conv2d_backward_data`,
:func:`conv2d_backward_weight`, :func:`conv2d_backward_bias`, :func:`conv_transpose2d`,
:func:`choose_algorithm` (:class:`Choice`), :func:`algorithms`,
:func:`devices`, :func:`build_problem` (:class:`ConvProblem`), :data:`options` and
:func:`option_context`, :class:`BackendUnavailable`, :func:`tune` (measure the CPU kernels'
block sizes and ``auto``'s thresholds on this machine; also ``python -m convlib.tune``).
"""

from .api import (
    algorithms, build_problem, choose_algorithm, conv2d, conv2d_backward_bias, conv2d_backward_data,
    conv2d_backward_weight, conv_transpose2d, devices,
)
from .core.contracts import BackendUnavailable
from .core.options import option_context, options
from .core.problem import ConvProblem
from .core.version import __version__
from .dispatch.select import Choice
from . import tune  # noqa: E402 -- a callable module: convlib.tune() tunes this machine's CPU kernels

__all__ = ["conv2d", "conv2d_backward_data", "conv2d_backward_weight", "conv2d_backward_bias", "conv_transpose2d",
           "algorithms", "devices", "choose_algorithm", "Choice", "ConvProblem", "build_problem",
           "options", "option_context", "BackendUnavailable", "tune", "__version__"]
