"""convlib: batched 2-D convolution for Python, several algorithms on several devices.

>>> import numpy as np, convlib
>>> x = np.random.rand(8, 3, 32, 32).astype(np.float32)
>>> w = np.random.rand(16, 3, 3, 3).astype(np.float32)
>>> convlib.conv2d(x, w, padding=1).shape
(8, 16, 32, 32)

Public names: :func:`conv2d`, :func:`algorithms`, :func:`devices`, :func:`choose_algorithm`,
:class:`ConvProblem`.
"""

from .api import algorithms, build_problem, conv2d, devices
from .config import option_context, options
from .problem import ConvProblem
from .select import Choice, choose_algorithm

__version__ = "0.1.0"

__all__ = ["conv2d", "algorithms", "devices", "choose_algorithm", "Choice", "ConvProblem", "build_problem",
           "options", "option_context"]
