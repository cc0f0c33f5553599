"""The `dflash` console script (dflash.console): subcommands run the `python -m dflash.<name>`
apps in-process, found by name and imported only when run."""

from __future__ import annotations

import sys

import pytest

from dflash import console


def _main(argv, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        console.main(argv)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def test_help_lists_every_command(capsys):
    code, out, _ = _main(["--help"], capsys)
    assert code == 0
    for name in ("train", "evaluate", "regenerate", "export", "sweep", "tables", "demo", "bench"):
        assert f"\n  {name} " in out


def test_an_unknown_command_is_one_line(capsys):
    code, _, err = _main(["trian", "seed=1"], capsys)
    assert code == 2 and err.strip().splitlines() == [
        "error: command: unknown 'trian'; choose one of "
        "['train', 'evaluate', 'regenerate', 'export', 'sweep', 'tables', 'demo', 'bench']"
    ]


def test_a_command_runs_its_app_with_the_rest_of_the_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["dflash", "train", "+training.lr=1"])
    code, _, err = _main(None, capsys)
    assert code == 2 and err.strip().startswith("error: training.lr: unknown key")
    code, out, _ = _main(["export", "--help"], capsys)
    assert code == 0 and out.startswith("python -m dflash.export")


def test_bench_is_dispatched_by_name_without_importing_it_first(monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(console.runpy, "run_module", lambda module, **kw: ran.append((module, list(sys.argv[1:]))))
    monkeypatch.setattr(console.importlib.util, "find_spec", lambda module: object())
    monkeypatch.setattr(sys, "argv", ["dflash", "bench", "--quick"])
    console.main()
    assert ran == [("dflash.bench", ["--quick"])]
    monkeypatch.undo()
    monkeypatch.setattr(console.importlib.util, "find_spec", lambda module: None)  # an install without it
    code, _, err = _main(["bench"], capsys)
    assert code == 2 and "needs the module dflash.bench, which this install does not have" in err
