"""`python -m dflash.tables`: see `dflash.cli.tables` and dflash/conf/tables.yaml."""

from dflash.usage import exit_on_help


def main() -> None:
    exit_on_help("tables")  # `--help` answers before dflash.cli imports torch
    from dflash.cli.tables import main as run

    run()


if __name__ == "__main__":
    main()
