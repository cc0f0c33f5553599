"""`python -m dflash.demo`: see `dflash.cli.demo` and dflash/conf/demo.yaml."""

from dflash.usage import main

if __name__ == "__main__":
    main("demo")
