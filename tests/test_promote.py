"""`python -m export.promote`: a validated version shipped again under a new number, no re-export."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from export import promote
from export.promote import main
from export.validate import ExportError
from service.contract.manifest import read_manifest, verify_folder
from service.engine.translator import load_translator
from service.store import scan
from tests.conftest import corrupt_copy


def test_a_promoted_version_is_the_same_files_pinned_under_its_new_number(tiny_store: Path, tmp_path: Path) -> None:
    store = shutil.copytree(tiny_store, tmp_path / "store")
    assert main([str(store / "tiny-mt" / "1"), "--to", "7"]) == 0
    new, old = verify_folder(store / "tiny-mt" / "7"), read_manifest(store / "tiny-mt" / "1")
    assert new.version == 7 and new.name == "tiny-mt" and new.metrics["promoted_from"] == "tiny-mt/1"
    assert new.files == old.files  # the same bytes, pinned again
    for f in old.files:
        assert (store / "tiny-mt" / "7" / f).read_bytes() == (store / "tiny-mt" / "1" / f).read_bytes()
    entries = {(e.name, e.version): e for e in scan(store)}
    texts = ["the cat"]
    same = [load_translator(entries["tiny-mt", v]).translate(texts)[0][0].text for v in (1, 7)]
    assert same[0] == same[1]


def test_promote_refuses_an_altered_source_and_an_existing_version(
    tiny_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = corrupt_copy(tiny_store, tmp_path)
    assert main([str(store / "tiny-mt" / "1"), "--to", "2"]) == 2
    assert "sha256" in capsys.readouterr().err and not (store / "tiny-mt" / "2").exists()
    assert main([str(store / "tiny-clf" / "1"), "--to", "1", "--name", "tiny-clf"]) == 2
    assert main([str(store / "tiny-clf" / "1"), "--to", "2"]) == 0
    assert main([str(store / "tiny-clf" / "1"), "--to", "2"]) == 2
    assert "exists" in capsys.readouterr().err
    assert main([str(store / "tiny-clf" / "1"), "--to", "2", "--force"]) == 0
    assert sorted(p.name for p in (store / "tiny-clf").iterdir() if not p.name.startswith(".")) == ["1", "2"]


def test_promote_refuses_a_number_or_name_no_manifest_may_hold(tiny_store: Path, tmp_path: Path) -> None:
    store = shutil.copytree(tiny_store, tmp_path / "store")
    with pytest.raises(ExportError, match="--version must be between 1"):
        promote.promote(store / "tiny-clf" / "1", store, 0)
    with pytest.raises(ExportError, match="--name must be"):
        promote.promote(store / "tiny-clf" / "1", store, 2, name="Bad Name")
    assert sorted(p.name for p in (store / "tiny-clf").iterdir()) == ["1"]
