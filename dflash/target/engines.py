"""The forwards a target decodes with (`target.engine`, `TargetModel.load(engine=...)`), named apart from
`dflash.target.model` so the config schema (`dflash.specs.TargetSpec`) checks them without torch."""

ENGINES = ("auto", "fast", "graphs", "eager")
