"""`python -m dflash.export`: see `dflash.cli.export` and dflash/conf/export.yaml."""

from dflash.cli.export import main

if __name__ == "__main__":
    main()
