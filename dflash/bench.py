"""`python -m dflash.bench`: see `dflash.cli.bench`."""

from dflash.cli.bench import main

if __name__ == "__main__":
    main()
