"""Sphinx configuration of convlib's documentation site.

Build it with the ``docs`` extra::

    pip install -e ".[docs]"
    python -m sphinx -W --keep-going -b html docs docs/_build/html

The pages are the markdown files of this folder (read by myst-parser); the API reference
(``api.rst``) is generated from the docstrings (autodoc, numpydoc). Optional dependencies that a
documented module imports at import time are mocked, so the site builds without them.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

from convlib import __version__  # noqa: E402

project = "convlib"
author = "the convlib authors"
copyright = "2026, the convlib authors"
release = __version__
version = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "numpydoc",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# Links such as [benchmarks](benchmarks.md#self-tuning) in the markdown pages: anchors from headings.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

# convlib.torch / convlib.jax / convlib.dask import their framework at import time: mock what is
# not installed (the docs extra does not pull PyTorch, JAX or Dask in).
autodoc_mock_imports = []
for _name in ("torch", "jax", "dask", "distributed"):
    try:
        __import__(_name)
    except ImportError:
        autodoc_mock_imports.append(_name)
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # numpydoc's Parameters sections say the types

numpydoc_show_class_members = False  # members are listed by autodoc's :members:, once
numpydoc_xref_param_type = False
numpydoc_validation_checks: set[str] = set()

# No intersphinx: a build without network would warn, and CI builds with warnings as errors.

html_theme = "pydata_sphinx_theme"
html_title = f"convlib {version}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
html_static_path: list[str] = []


# The markdown pages link to source files (``[`convlib/cpu/blis.py`](../convlib/cpu/blis.py)``),
# which work when the pages are read on the repository but are not pages of this site: keep the
# link's text, drop the link, in the site's copy only.
_SOURCE_LINK = __import__("re").compile(r"\[([^\]]+)\]\(\.\./(?:convlib|examples|tests|\.ci)/[^)]*\)")


def _unlink_source_files(app, docname, source):
    source[0] = _SOURCE_LINK.sub(r"\1", source[0])


def setup(app):
    app.connect("source-read", _unlink_source_files)
