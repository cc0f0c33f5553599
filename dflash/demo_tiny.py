"""`python -m dflash.demo_tiny`: see `dflash.cli.demo_tiny` and dflash/conf/demo_tiny.yaml."""

from dflash.usage import exit_on_help


def main() -> None:
    exit_on_help("demo_tiny")  # `--help` answers before dflash.cli imports torch
    from dflash.cli.demo_tiny import main as run

    run()


if __name__ == "__main__":
    main()
