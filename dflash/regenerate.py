"""`python -m dflash.regenerate`: see `dflash.cli.regenerate` and dflash/conf/regenerate.yaml."""

from dflash.usage import main

if __name__ == "__main__":
    main("regenerate")
