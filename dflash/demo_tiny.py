"""`python -m dflash.demo_tiny`: see `dflash.cli.demo_tiny` and dflash/conf/demo_tiny.yaml."""

from dflash.usage import main

if __name__ == "__main__":
    main("demo_tiny")
