"""`python -m dflash.evaluate`: see `dflash.cli.evaluate` and dflash/conf/evaluate.yaml."""

from dflash.usage import exit_on_help


def main() -> None:
    exit_on_help("evaluate")  # `--help` answers before dflash.cli imports torch
    from dflash.cli.evaluate import main as run

    run()


if __name__ == "__main__":
    main()
