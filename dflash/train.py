"""`python -m dflash.train`: see `dflash.cli.train` and dflash/conf/train.yaml."""

from dflash.usage import main

if __name__ == "__main__":
    main("train")
