"""The newcomer examples' smoke modes run and check their own results (no timing asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_image_filters_smoke_checks_against_scipy(tmp_path):
    pytest.importorskip("skimage")
    pytest.importorskip("scipy")
    pytest.importorskip("matplotlib")
    done = subprocess.run([sys.executable, str(EXAMPLES / "image_filters.py"), "--smoke", "--repeats", "1",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok" in done.stdout and "MISMATCH" not in done.stdout
    # 5 images x (edges, blur, sharpened).
    assert len(list(tmp_path.glob("*.png"))) == 15


def test_image_filters_filters_are_the_textbook_ones():
    sys.path.insert(0, str(EXAMPLES))
    try:
        import image_filters
    finally:
        sys.path.remove(str(EXAMPLES))
    names, w = image_filters.filters()
    assert names == ["sobel_x", "sobel_y", "gaussian_blur", "sharpen"] and w.shape == (4, 1, 5, 5)
    assert abs(float(w[2].sum()) - 1) < 1e-6 and float(w[3].sum()) == 1.0  # blur and sharpen keep the mean
    assert float(w[0].sum()) == 0.0 and (w[1, 0] == w[0, 0].T).all()
