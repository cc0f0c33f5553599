"""`python -m dflash.demo`: see `dflash.cli.demo` and dflash/conf/demo.yaml."""

from dflash.usage import exit_on_help


def main() -> None:
    exit_on_help("demo")  # `--help` answers before dflash.cli imports torch
    from dflash.cli.demo import main as run

    run()


if __name__ == "__main__":
    main()
