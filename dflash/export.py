"""`python -m dflash.export`: see `dflash.cli.export` and dflash/conf/export.yaml."""

from dflash.usage import main

if __name__ == "__main__":
    main("export")
