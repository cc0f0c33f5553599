"""`python -m dflash.export`: see `dflash.cli.export` and dflash/conf/export.yaml."""

from dflash.usage import exit_on_help


def main() -> None:
    exit_on_help("export")  # `--help` answers before dflash.cli imports torch
    from dflash.cli.export import main as run

    run()


if __name__ == "__main__":
    main()
