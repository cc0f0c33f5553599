"""`python -m dflash.regenerate`: see `dflash.cli.regenerate` and dflash/conf/regenerate.yaml."""

from dflash.usage import exit_on_help


def main() -> None:
    exit_on_help("regenerate")  # `--help` answers before dflash.cli imports torch
    from dflash.cli.regenerate import main as run

    run()


if __name__ == "__main__":
    main()
