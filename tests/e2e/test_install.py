"""A non-editable install works away from the repository: configs, launcher plugin, apps.

A fresh venv gets the main environment's dependencies through a `.pth` line (a directory
added that way does not have its own `.pth` files processed, so the main venv's editable
dflash stays invisible), then `pip install --no-deps --no-build-isolation` of a copy of
the repository. Everything then runs from a directory outside both copies.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from helpers import REPO


def _run(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DFLASH_ARTIFACTS", "PYTHONHOME")}
    env.update(PYTHONNOUSERSITE="1", HF_HUB_OFFLINE="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INDEX="1")
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _ok(run: subprocess.CompletedProcess) -> str:
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    return run.stdout


def _copy_of_the_repository(dest: Path) -> Path:
    """The tracked and untracked-but-not-ignored files (no .venv, artifacts, build outputs)."""
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in filter(None, listing.split("\0")):
        source = REPO / name
        if source.is_file() and not source.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_non_editable_install_runs_outside_the_repository(tmp_path):
    if not (REPO / ".git").exists():
        pytest.skip("needs the repository's git metadata to copy its files")
    venv, outside = tmp_path / "venv", tmp_path / "elsewhere"
    outside.mkdir()
    _ok(_run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=outside))
    python = venv / "bin" / "python"
    site = Path(_ok(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=outside)).strip())
    (site / "main_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    # The main environment's packages are importable, its editable dflash is not.
    probe = "import hydra, torch; import importlib.util as u; print(u.find_spec('dflash'), u.find_spec('hydra_plugins'))"
    assert _ok(_run([str(python), "-c", probe], cwd=outside)).split() == ["None", "None"]

    source = _copy_of_the_repository(tmp_path / "source")
    _ok(
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(python),
                "install",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                str(source),
            ],
            cwd=outside,
        )
    )
    shutil.rmtree(source)  # nothing may read the copy after the install

    where = _ok(
        _run(
            [str(python), "-c", "import dflash, hydra_plugins.dflash_launcher as p; print(dflash.__file__); print(p.__file__)"],
            cwd=outside,
        )
    ).split()
    assert all(Path(path).is_relative_to(venv) for path in where), where
    package = Path(where[0]).parent
    shipped = {p.relative_to(package).as_posix() for p in (package / "conf").rglob("*") if p.is_file()}
    in_repo = {p.relative_to(REPO / "dflash").as_posix() for p in (REPO / "dflash" / "conf").rglob("*") if p.is_file()}
    assert in_repo <= shipped, sorted(in_repo - shipped)  # every config and data file of dflash/conf

    help_text = _ok(_run([str(python), "-m", "dflash.evaluate", "--help"], cwd=outside))
    groups = help_text.split("Config groups", 1)[-1]
    assert "\n  benchmark " in groups and "* smoke " in groups and "\n  target " in groups, help_text[-2000:]
    # the console script, `dflash <command>`, is the same app
    assert _ok(_run([str(venv / "bin" / "dflash"), "evaluate", "--help"], cwd=outside)) == help_text

    # The sweeps' configs compose from the installed package, and the launcher plugin is found.
    dry = _ok(_run([str(python), "-m", "dflash.sweep", "block_size", "--scale", "cpu", "--dry-run"], cwd=outside))
    assert "+sweep=block_size_infer sweep/eval_scale=cpu" in dry
    cfg = _ok(
        _run(
            [str(python), "-m", "dflash.train", "+sweep=depth", "sweep/scale=cpu", "--cfg", "hydra", "-p", "hydra.launcher"],
            cwd=outside,
        )
    )
    assert "GpuPoolLauncher" in cfg

    run_dir, artifacts = tmp_path / "run", tmp_path / "artifacts"
    _ok(
        _run(
            [
                str(python),
                "-m",
                "dflash.evaluate",
                f"hydra.run.dir={run_dir}",
                f"paths.artifacts={artifacts}",
                "benchmark.max_samples=1",
                "decoding.max_new_tokens=4",
                "warmup_tokens=0",
                "hf_generate=false",
            ],
            cwd=outside,
        )
    )
    results = json.loads((run_dir / "results.json").read_text())
    assert results["tau"] >= 1 and results["config"]["benchmark"]["max_samples"] == 1
