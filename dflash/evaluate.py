"""`python -m dflash.evaluate`: see `dflash.cli.evaluate` and dflash/conf/evaluate.yaml."""

from dflash.usage import main

if __name__ == "__main__":
    main("evaluate")
