"""Running `helpers/loader_probe.py` under transformers 4.57, the side environment `.tf4`
that `make test` builds (the DFlash reference's pin)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import REPO

TF4 = REPO / ".tf4"


def probe_under_transformers_4(request_file: Path, out_file: Path) -> dict:
    """The probe's results for `request_file` (JSON, see `helpers.loader_probe`), run in a
    subprocess whose transformers is 4.57. Skips without `.tf4` (fails under CI=true)."""
    if not (TF4 / "transformers").is_dir():
        message = f"{TF4} (transformers 4.57 side environment) is missing; `make test` builds it"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    workdir = request_file.parent
    env = {
        **os.environ,
        "PYTHONPATH": str(TF4),
        "HF_HUB_OFFLINE": "1",
        "HF_MODULES_CACHE": str(workdir / "hf_modules"),
        "OMP_NUM_THREADS": "1",
    }
    command = [sys.executable, str(REPO / "tests" / "helpers" / "loader_probe.py"), str(request_file), str(out_file)]
    result = subprocess.run(command, env=env, cwd=workdir, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    results = torch.load(out_file)
    assert results["transformers"].startswith("4.57"), results["transformers"]
    return results
