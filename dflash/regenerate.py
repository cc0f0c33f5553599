"""`python -m dflash.regenerate`: see `dflash.cli.regenerate` and conf/regenerate.yaml."""

from dflash.cli.regenerate import main

if __name__ == "__main__":
    main()
