"""One evaluation, many methods: the registry, per-method records in results.json, the app."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import pytest
import torch

import dflash.eval.evaluator as evaluator
from dflash.decoding import ChainVerifier, SamplingConfig, generate
from dflash.drafter import DFlashDrafter, DrafterConfig, save_drafter
from dflash.errors import ConfigError
from dflash.eval import DecodingSettings, EvalSettings, Sample, evaluate, format_results
from dflash.layout import Results
from dflash.methods import METHODS, Method, MethodSetup, build_method, check_method_names
from dflash.specs import DrafterSpec, build_drafter
from dflash.toy.tiny import tiny_config
from helpers.apps import assert_one_error_line, run_cli, run_main
from helpers.decoding import PartialOracleProposer

SAMPLES = [Sample(turns=["def add(a, b):\n    return a + b\n\ndef add"], index=0), Sample(turns=["aaaa", "bbbb"], index=3)]
METHOD_KEYS = {
    "method", "label", "block_size", "drafter_block_size", "tau", "tau_per_prompt_mean", "acceptance_histogram",
    "tokens_per_s", "speedup", "speedup_decode_only", "lossless", "first_mismatch", "lossless_up_to_ties",
    "divergences", "settings",
}  # fmt: skip


@dataclass(frozen=True)
class FakeSettings:
    wrong_at: int | None = None  # output position the fake verifier corrupts (None: lossless)


class FakeVerifier(ChainVerifier):
    """A verifier of the method's own (as tree verification is): the chain, emitting the
    target's token + 1 at output position `wrong_at` (greedy; None: lossless)."""

    def __init__(self, wrong_at: int | None):
        self.wrong_at = wrong_at

    def check(self, target, sampling) -> None:
        self.emitted = 1  # a new generation: the prefill's token

    def accept(self, drafts, target_logits, sampling, generator):
        kept_rows, next_token = super().accept(drafts, target_logits, sampling, generator)
        cut = -1 if self.wrong_at is None else self.wrong_at - self.emitted  # kept rows before the wrong token
        if 0 <= cut < len(kept_rows):
            kept_rows, next_token = kept_rows[: cut + 1], (int(target_logits[cut].argmax()) + 1) % target_logits.shape[-1]
        self.emitted += len(kept_rows)
        return kept_rows, next_token


def build_fake(target, settings: FakeSettings) -> MethodSetup:
    return MethodSetup(PartialOracleProposer(target, seed=2), FakeVerifier(settings.wrong_at), block_size=3, label="fake")


calls: list = []


@pytest.fixture
def with_fake_method(monkeypatch):
    """Registers method "fake" and logs every generation: (method, generator seed, stop ids)."""
    monkeypatch.setitem(
        METHODS,
        "fake",
        Method(
            name="fake", label="Fake", build=lambda target, settings, context: build_fake(target, settings), settings=FakeSettings
        ),
    )
    calls.clear()

    def logged_generate(target, input_ids, *, block_size=1, proposer=None, generator=None, stop_token_ids=(), **kwargs):
        name = "autoregressive" if proposer is None else type(proposer).__name__
        calls.append((name, None if generator is None else generator.initial_seed(), tuple(stop_token_ids)))
        return generate(target, input_ids, block_size=block_size, proposer=proposer, generator=generator,
                        stop_token_ids=stop_token_ids, **kwargs)  # fmt: skip

    monkeypatch.setattr(evaluator, "generate", logged_generate)
    return calls


def run(target, methods, drafter=None, temperature=0.0, method_settings=None, hf_generate=False):
    decoding = DecodingSettings(block_size=4, max_new_tokens=16, temperature=temperature)
    settings = EvalSettings(decoding=decoding, hf_generate=hf_generate, warmup_tokens=0, methods=methods,
                            method_settings=method_settings or {})  # fmt: skip
    return evaluate(target, drafter, SAMPLES, settings, drafter_label="random", progress=False)


def check_accounting(results: Results, method: str) -> None:
    """tau and the histogram of `method` agree with its output lengths (independent of results.py)."""
    record = results.methods[method]
    histogram = record["acceptance_histogram"]
    assert len(histogram) == record["block_size"]
    emitted = sum(length * count for length, count in enumerate(histogram, start=1))
    assert emitted + results.num_generations == sum(p["num_tokens"][method] for p in results.per_prompt)
    assert record["tau"] == pytest.approx(emitted / sum(histogram))
    taus = [p["taus"][method] for p in results.per_prompt]
    assert record["tau_per_prompt_mean"] == pytest.approx(sum(taus) / len(taus))


def test_registry_names_are_one_line_errors():
    for names, text in [([], "non-empty list"), (["dflash", "nope"], "unknown method 'nope'"),
                        (["ngram", "ngram"], "listed twice"), ("dflash", "non-empty list")]:  # fmt: skip
        with pytest.raises(ConfigError, match=text) as info:
            check_method_names(names)
        assert info.value.key == "methods"
    assert list(METHODS) == ["dflash", "dflash2", "dflash_lookup", "dflash_tree", "dspark", "eagle3", "ngram"]


def test_eagle3_entry_builds_through_the_packages_builder_lazily(qwen3_target, monkeypatch):
    seen = []

    class FakeEagle3:
        @staticmethod
        def build_eagle3_proposer(path, target, num_draft_tokens):
            seen.append((path, target, num_draft_tokens))
            return "proposer"

    monkeypatch.setitem(sys.modules, "dflash.eagle3", FakeEagle3)
    setup = build_method("eagle3", qwen3_target, METHODS["eagle3"].settings(path="/d", num_draft_tokens=5))
    assert seen == [("/d", qwen3_target, 5)]
    assert (setup.proposer, setup.block_size, setup.label, setup.verifier.name) == ("proposer", 6, "/d", "chain")
    assert METHODS["eagle3"].settings().num_draft_tokens == 7


def test_every_method_runs_on_the_same_prompts_interleaved_and_is_recorded(qwen3_target, with_fake_method):
    drafter = build_drafter(DrafterSpec(num_layers=1, num_target_features=2, block_size=4), qwen3_target)
    results = run(qwen3_target, ["dflash", "dflash_lookup", "ngram", "fake"], drafter, hf_generate=True)
    assert list(results.methods) == ["dflash", "dflash_lookup", "ngram", "fake"]
    # interleaved per generation, in the listed order, each with the run's stop ids
    names = [name for name, _, _ in calls]
    proposers = ["autoregressive", "DFlashProposer", "LookupFirst", "NgramProposer", "PartialOracleProposer"]
    assert names == proposers * results.num_generations
    assert len({stops for _, _, stops in calls}) == 1
    # the top level is the primary method's (dflash), as before
    dflash = results.methods["dflash"]
    assert results.method == "dflash" and results.drafter == dflash["label"] == "random"
    assert results.of_method("dflash") == results
    view = results.of_method("ngram")  # as the tables read it
    assert (view.method, view.block_size, view.tau) == ("ngram", 11, results.methods["ngram"]["tau"])
    assert set(results.tokens_per_s) == {"dflash", "dflash_lookup", "ngram", "fake", "autoregressive", "hf_generate"}
    for name, record in results.methods.items():
        assert set(record) == METHOD_KEYS
        assert record["lossless"] is True and record["divergences"]["bug"] == 0, name
        assert record["speedup"]["vs_hf_generate"] is not None
        check_accounting(results, name)
    ngram = results.methods["ngram"]
    assert ngram["block_size"] == 11 and ngram["drafter_block_size"] is None
    assert ngram["settings"] == {"max_ngram": 2, "min_ngram": 1, "num_draft_tokens": 10}
    assert ngram["tau"] > 1.2, "prompt lookup accepted almost nothing: the repetitive prompts should feed it"
    lookup = results.methods["dflash_lookup"]
    assert (lookup["block_size"], lookup["drafter_block_size"], lookup["label"]) == (4, 4, "random")
    assert lookup["settings"] == {"block_size": 4, "draft_threshold": 0.0, "ngram": 3, "lookup_tokens": None}
    assert lookup["tau"] > dflash["tau"], "lookup first did not help a random drafter on repetitive prompts"
    assert results.methods["fake"]["block_size"] == 3 and results.methods["fake"]["tau"] > 1.0
    text = format_results(results)
    assert "every method on the same prompts" in text and "\nngram " in text


@pytest.mark.parametrize("name", ["dspark", "dflash2"])
def test_dspark_and_dflash2_run_behind_prompt_lookup_when_asked(qwen3_target, with_fake_method, name):
    from helpers.decoding import dflash2_drafter, dspark_drafter

    drafter = {"dspark": dspark_drafter, "dflash2": dflash2_drafter}[name](qwen3_target, block_size=4)
    alone = run(qwen3_target, [name], drafter).methods[name]
    looked_up = run(qwen3_target, [name], drafter, method_settings={name: METHODS[name].settings(lookup_ngram=2)}).methods[name]
    assert {proposer for proposer, _, _ in calls} == {
        "autoregressive",
        "DSparkProposer" if name == "dspark" else "DFlash2Proposer",
        "LookupFirst",
    }
    assert alone["lossless"] is looked_up["lossless"] is True
    assert (alone["settings"]["lookup_ngram"], looked_up["settings"]["lookup_ngram"]) == (None, 2)
    assert looked_up["tau"] > alone["tau"], "lookup first did not help a random drafter on repetitive prompts"
    with pytest.raises(ConfigError, match=r"lookup_ngram: must be >= 1") as info:
        METHODS[name].settings(lookup_ngram=0)
    assert info.value.key == "lookup_ngram"


def test_a_lossy_method_is_reported_alone_and_seeds_are_shared_when_sampling(qwen3_target, with_fake_method):
    greedy = run(qwen3_target, ["ngram", "fake"], method_settings={"fake": FakeSettings(wrong_at=5)})
    fake = greedy.methods["fake"]
    assert fake["lossless"] is False and fake["first_mismatch"]["position"] == 5
    assert fake["divergences"]["bug"] >= 1  # replayed from the loop's record: the corrupted token is a bug
    assert greedy.methods["ngram"]["lossless"] is True
    # with no dflash listed, the primary method is the first one and no drafter is needed
    assert (greedy.method, greedy.block_size, greedy.drafter_block_size) == ("ngram", 11, None)

    calls.clear()
    sampled = run(qwen3_target, ["ngram", "fake"], temperature=1.0)
    assert sampled.methods["ngram"]["lossless"] is None
    seeds = [seed for _, seed, _ in calls]
    per_generation = [seeds[i : i + 3] for i in range(0, len(seeds), 3)]
    assert all(len(set(group)) == 1 for group in per_generation)  # one seed for every method of a generation
    assert len({group[0] for group in per_generation}) == len(per_generation)  # a new seed per generation
    check_accounting(sampled, "ngram")


def test_a_token_proposer_that_drafts_too_many_is_a_clear_error(qwen3_target):
    class Greedy:
        target_layer_ids = None

        def reset(self):
            pass

        def draft(self, committed_ids, new_features, block_size, num_drafts, sampling, generator):
            from dflash.decoding import Drafts

            return Drafts(tokens=torch.zeros(num_drafts + 1, dtype=torch.long))

    ids = qwen3_target.tokenizer("x", return_tensors="pt").input_ids
    with pytest.raises(RuntimeError, match="k <= 3"):
        generate(qwen3_target, ids, max_new_tokens=8, block_size=4, proposer=Greedy(), sampling=SamplingConfig())


@pytest.mark.slow
def test_app_runs_dflash_and_ngram_side_by_side(tmp_path, artifacts):
    args = ["methods=[dflash,ngram,dflash_lookup]", "ngram.max_ngram=3", "dflash_lookup.ngram=2", "dflash_lookup.tokens=20", "benchmark.max_samples=2", "decoding.max_new_tokens=8",
            "warmup_tokens=0", "hf_generate=false"]  # fmt: skip
    proc = run_cli(args, tmp_path, artifacts)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert list(results["methods"]) == ["dflash", "ngram", "dflash_lookup"] and results["method"] == "dflash"
    assert results["methods"]["ngram"]["settings"]["max_ngram"] == 3
    lookup = results["methods"]["dflash_lookup"]
    assert (lookup["settings"]["ngram"], lookup["settings"]["lookup_tokens"], lookup["block_size"]) == (2, 20, 21)
    assert all(record["lossless"] for record in results["methods"].values())


BAD_METHOD_SETTINGS = {
    "unknown method": (["methods=[dflash,nope]"], "methods"),
    "ngram range": (["ngram.min_ngram=0"], "ngram.min_ngram"),
    "a DFlash drafter as eagle3's": (["methods=[eagle3]", "eagle3.path={tmp}/dflash_drafter"], "eagle3.path"),
    "lookup ngram": (["methods=[dflash_lookup]", "dflash_lookup.ngram=0"], "dflash_lookup.ngram"),
    "lookup tokens": (["methods=[dflash_lookup]", "dflash_lookup.tokens=0"], "dflash_lookup.tokens"),
}


@pytest.mark.parametrize("case", BAD_METHOD_SETTINGS)
def test_the_app_rejects_bad_method_settings_before_loading_the_target(case, tmp_path, artifacts, monkeypatch, capsys):
    bad, key = BAD_METHOD_SETTINGS[case]
    config = DrafterConfig.from_target(tiny_config("qwen3"), num_layers=1, block_size=4, mask_token_id=258, num_target_features=2)
    save_drafter(DFlashDrafter(config), str(tmp_path / "dflash_drafter"))
    argv = [f"hydra.run.dir={tmp_path}/run", f"paths.artifacts={artifacts}", *(arg.format(tmp=tmp_path) for arg in bad)]
    code, lines = run_main("evaluate", argv, monkeypatch, capsys)
    assert_one_error_line(code, lines, key, "")
    assert not any("Loading weights" in line or "cannot read" in line for line in lines)  # before the target, one cause


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return tmp_path_factory.mktemp("artifacts")


def test_replay_of_a_prompt_lookup_run_reproduces_its_logits_bit_for_bit(monkeypatch):
    """The divergence replay issues a run's own target forwards when the proposer drafted
    fewer than B - 1 tokens (recorded in `steps`), in bf16 where other shapes round differently."""
    from dflash.decoding.ngram import NgramProposer
    from dflash.eval.divergence import replay_logits
    from dflash.methods.ngram import NgramSettings
    from dflash.target import TargetModel
    from dflash.toy.tiny import build_tiny_target

    model, tokenizer = build_tiny_target("qwen3", seed=0, num_layers=2)
    target = TargetModel(model.to(torch.bfloat16), tokenizer)
    input_ids = tokenizer("aaaa", return_tensors="pt").input_ids
    prompt_len, seen = input_ids.shape[1], {}
    forward = target.forward

    def recording_forward(ids, positions, *args, **kwargs):
        out = forward(ids, positions, *args, **kwargs)
        rows = out.logits.shape[1]
        for row, position in enumerate(positions[0, -rows:].tolist()):
            seen[position + 1 - prompt_len] = out.logits[0, row].clone()
        return out

    monkeypatch.setattr(target, "forward", recording_forward)
    run = generate(target, input_ids, max_new_tokens=20, block_size=8, proposer=NgramProposer(NgramSettings()))
    monkeypatch.undo()
    assert 0 in run.draft_counts and max(run.draft_counts) > 0 and max(run.acceptance_lengths) > 1
    for position in (1, 7, 13, len(run.output_ids) - 1):
        replayed = replay_logits(target, input_ids, run.steps, position)
        assert torch.equal(replayed, seen[position]), position


def test_dflash_tree_verifies_the_dflash_drafters_blocks_as_a_tree_of_its_budget(qwen3_target, monkeypatch):
    """methods=[dflash, dflash_tree]: the same drafter, the tree verifier with dflash_tree.budget nodes."""
    from dflash.methods.dflash_tree import TreeSettings

    seen, real = [], evaluator.generate

    def spy(*args, **kwargs):
        if kwargs.get("verifier") is not None and kwargs["verifier"].name == "tree":
            seen.append((type(kwargs["proposer"]).__name__, kwargs["block_size"], kwargs["verifier"].budget))
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluator, "generate", spy)
    drafter = build_drafter(DrafterSpec(num_layers=1, num_target_features=2, block_size=4), qwen3_target)
    results = run(qwen3_target, ["dflash", "dflash_tree"], drafter, method_settings={"dflash_tree": TreeSettings(budget=5)})
    assert set(seen) == {("DFlashProposer", 4, 5)} and len(seen) == 3  # one call per generation
    record = results.methods["dflash_tree"]
    assert record["lossless"] is True and record["settings"] == {
        "block_size": 4,
        "budget": 5,
        "lookup_ngram": None,
        "lookup_tokens": None,
        "draft_threshold": 0.0,
    }
    assert results.methods["dflash"]["settings"] == {"block_size": 4, "draft_threshold": 0.0}
    check_accounting(results, "dflash_tree")
    with pytest.raises(ConfigError, match="must be >= 1") as info:
        TreeSettings(budget=0)
    assert info.value.key == "budget"  # the field; the CLI adds the group


def test_dflash_tree_behind_lookup_verifies_wider_lookups_and_the_drafters_trees(qwen3_target):
    """dflash_tree.lookup_ngram / lookup_tokens: prompt lookup first, its steps up to lookup_tokens
    wide (the verify width recorded), the drafter's trees at its block elsewhere; lossless, and a
    random drafter gains (tests/decoding/test_tree.py checks the chains' and trees' shapes)."""
    from dflash.methods.dflash_tree import TreeSettings

    drafter = build_drafter(DrafterSpec(num_layers=1, num_target_features=2, block_size=4), qwen3_target)
    settings = {"dflash_tree": TreeSettings(budget=4, lookup_ngram=2, lookup_tokens=6)}
    results = run(qwen3_target, ["dflash_tree"], drafter, method_settings=settings)
    looked_up = results.methods["dflash_tree"]
    alone = run(qwen3_target, ["dflash_tree"], drafter).methods["dflash_tree"]
    assert alone["lossless"] is looked_up["lossless"] is True
    assert (alone["block_size"], looked_up["block_size"], looked_up["drafter_block_size"]) == (4, 7, 4)
    assert looked_up["tau"] > alone["tau"], "lookup first did not help a random drafter on repetitive prompts"
    check_accounting(results, "dflash_tree")
    with pytest.raises(ConfigError, match=r"lookup_tokens: must be >= 1 with lookup_ngram set") as info:
        TreeSettings(lookup_tokens=6)
    assert info.value.key == "lookup_tokens"


def test_decoding_draft_threshold_cuts_the_dflash_drafts_where_confidence_falls(qwen3_target, monkeypatch):
    from dflash.dflash.adaptive import ThresholdProposer

    drafted = []  # (drafts kept, drafts asked for) per step

    class Spy(ThresholdProposer):
        def propose(self, committed_ids, new_features, block_size, num_drafts):
            logits = super().propose(committed_ids, new_features, block_size, num_drafts)
            drafted.append((logits.shape[0], num_drafts))
            return logits

    monkeypatch.setattr("dflash.dflash.adaptive.ThresholdProposer", Spy)  # the dflash method imports it when it builds
    drafter = build_drafter(DrafterSpec(num_layers=1, num_target_features=2, block_size=4), qwen3_target)
    decoding = DecodingSettings(block_size=4, max_new_tokens=16, draft_threshold=0.999)  # a random drafter is never this sure
    settings = EvalSettings(decoding=decoding, hf_generate=False, warmup_tokens=0, methods=["dflash"])
    results = evaluate(qwen3_target, drafter, SAMPLES, settings, drafter_label="random", progress=False)
    assert drafted and all(kept == 1 for kept, _ in drafted) and any(asked == 3 for _, asked in drafted)
    assert results.methods["dflash"]["lossless"] is True
    assert results.methods["dflash"]["settings"]["draft_threshold"] == 0.999
