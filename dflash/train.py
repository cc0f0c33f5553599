"""`python -m dflash.train`: see `dflash.cli.train` and dflash/conf/train.yaml."""

from dflash.usage import exit_on_help


def main() -> None:
    exit_on_help("train")  # `--help` answers before dflash.cli imports torch
    from dflash.cli.train import main as run

    run()


if __name__ == "__main__":
    main()
