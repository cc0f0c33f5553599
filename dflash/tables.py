"""`python -m dflash.tables`: see `dflash.cli.tables` and dflash/conf/tables.yaml."""

from dflash.usage import main

if __name__ == "__main__":
    main("tables")
