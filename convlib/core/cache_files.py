"""Where convlib keeps what it learns about a machine, and how those files are written.

The tuning cache of measured choices (:mod:`convlib.dispatch.tuning`) and the CPU profiles of
``python -m convlib.tune`` (:mod:`convlib.cpu.profile`) live under one folder,
:func:`cache_root`, and are replaced whole and atomically (:func:`write_json_atomically`), so a
reader never sees half a file and two processes writing at once leave one complete file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def cache_root() -> Path:
    """``$CONVLIB_CACHE_DIR``, else ``$XDG_CACHE_HOME/convlib``, else ``~/.cache/convlib``."""
    root = os.environ.get("CONVLIB_CACHE_DIR")
    if root is None:
        root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "convlib"
    return Path(root)


def write_json_atomically(path: Path, payload) -> None:
    """Write ``payload`` as JSON to ``path``: into a temporary file beside it, then renamed over
    it. Raises ``OSError`` when that fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
