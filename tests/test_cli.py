"""The export CLIs explain themselves: every option has help stating its default; data paths are named absolutely."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from export import cli, import_hf, promote, publish, recover, train
from export.model import Classifier, ClassifierConfig


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser a user meets: publish, import_hf, promote, and each train subcommand."""
    found = {"export.publish": publish.build_parser(), "export.import_hf": import_hf.build_parser()}
    found["export.promote"] = promote.build_parser()
    found["export.recover"] = recover.build_parser()
    for action in train.build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            found |= {f"export.train {name}": sub for name, sub in action.choices.items()}
    assert len(found) == 6
    return found


PROGS = [
    "export.publish",
    "export.import_hf",
    "export.promote",
    "export.recover",
    "export.train classifier",
    "export.train translator",
]


@pytest.mark.parametrize("prog", PROGS)
def test_every_option_has_help_and_shows_its_default(prog: str) -> None:
    parser = parsers()[prog]
    formatter = parser._get_formatter()
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        name = "/".join(action.option_strings) or action.dest
        if not action.help:
            missing.append(f"{name}: no help")
            continue
        if action.option_strings:
            text = formatter._expand_help(action)
            if "default" not in text and "(required)" not in text:
                missing.append(f"{name}: no default in {text!r}")
    assert not missing, missing
    assert "(default: " in parser.format_help()


def test_publish_help_states_the_real_variant_defaults() -> None:
    text = " ".join(publish.build_parser().format_help().split())
    assert "(default: fp32,int8)" in text
    assert "otherwise (default: fp32)" in text


def test_the_tiny_preset_sets_its_sizes_and_explicit_options_win() -> None:
    tiny = train.build_parser(tiny=True)
    args = tiny.parse_args(["translator", "--tiny", "--steps", "7"])
    assert (args.d_model, args.layers, args.train_rows, args.amp) == (32, 1, 20000, False)
    assert args.steps == 7 and args.out == "runs/tiny-en-de"  # its own run folder: a real run never resumes it
    plain = train.build_parser().parse_args(["classifier"])
    assert (plain.d_model, plain.train_rows, plain.amp, plain.out) == (256, 0, None, "runs/sentiment")  # None: auto
    text = " ".join(train.build_parser().format_help().split()) + " ".join(
        parsers()["export.train classifier"].format_help().split()
    )
    assert "--d-model 32" in text and "--no-amp" in text


def test_spread_takes_rows_from_the_whole_split() -> None:
    from export.data import spread

    rows = [{"i": i} for i in range(10)]
    assert [r["i"] for r in spread(rows, 4)] == [0, 2, 5, 7]
    assert spread(rows, 0) == rows and spread(rows, 99) == rows


def test_a_missing_data_file_names_the_absolute_path_and_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as err:
        cli.data_file(Path("data"), "sentiment", "test.jsonl")
    message = str(err.value)
    assert str(tmp_path / "data" / "sentiment" / "test.jsonl") in message
    assert "relative to the working directory" in message and str(tmp_path) in message
    (tmp_path / "data" / "sentiment").mkdir(parents=True)
    (tmp_path / "data" / "sentiment" / "test.jsonl").write_text("{}\n")
    assert cli.data_file(Path("data"), "sentiment", "test.jsonl") == Path("data/sentiment/test.jsonl")


def test_publish_from_another_directory_names_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tiny_tokenizer: Tokenizer
) -> None:
    cfg = ClassifierConfig(vocab_size=tiny_tokenizer.get_vocab_size(), d_model=16, n_heads=2, d_ff=32, n_layers=1)
    model = Classifier(cfg)
    train.save_checkpoint(model, cfg, tiny_tokenizer, tmp_path / "ckpt")
    monkeypatch.chdir(tmp_path)
    assert publish.main([str(tmp_path / "ckpt"), "--name", "x", "--store", str(tmp_path / "store")]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'data' / 'sentiment' / 'test.jsonl'} not found" in err
    assert "relative to the working directory" in err
    assert not (tmp_path / "store" / "x").exists()


def test_train_names_the_absolute_path_it_looked_at(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="relative to the working directory") as err:
        train.main(["translator", "--out", str(tmp_path / "run")])
    assert str(tmp_path / "data" / "translation" / "train.jsonl") in str(err.value)


def test_the_summary_is_short_even_for_a_long_report(tmp_path: Path) -> None:
    manifest = {
        "variants": {"fp32": {}, "int8": {}},
        "default_variant": "int8",
        "metrics": {f"check_{i}": 0.001 * i for i in range(40)} | {"test_int8": {"accuracy": 0.75, "by": {}}},
    }
    lines = cli.summary(tmp_path / "m" / "1", manifest)
    assert len(lines) == cli.SUMMARY_LINES
    assert lines[0] == f"published {tmp_path / 'm' / '1'}"
    assert "default variant: int8" in lines[1]
    assert "manifest.json" in lines[-1]


def test_bf16_autocast_is_chosen_only_where_it_is_native(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(train, "bf16_is_native", lambda device: device == "fast")
    seen: list[bool] = []
    monkeypatch.setattr(train, "run_classifier", lambda args: seen.append(args.amp) or {})
    for argv in (["classifier", "--device", "fast"], ["classifier"], ["classifier", "--device", "fast", "--no-amp"]):
        train.main(argv)
    assert seen == [True, False, False]


@pytest.mark.parametrize(
    ("name", "version", "message"),
    [
        ("my model", None, "--name must be"),
        ("..", None, "--name must be"),
        ("x" * 129, None, "--name must be"),
        ("ok", 0, "--version must be between 1"),
        ("ok", 2**53, "--version must be between 1"),
        ("en-de", None, "en-de holds translation models; this one is classification"),
    ],
)
def test_a_target_the_store_cannot_take_is_refused_before_any_work(
    tmp_path: Path, name: str, version: int | None, message: str
) -> None:
    (tmp_path / "en-de" / "1").mkdir(parents=True)
    (tmp_path / "en-de" / "1" / "manifest.json").write_text('{"task": "translation"}')
    with pytest.raises(publish.ExportError, match=message):
        publish.check_target(tmp_path, name, version, "classification")
    publish.check_target(tmp_path, "en-de", None, "translation")  # the same task: fine


def test_a_version_published_meanwhile_is_never_replaced_unasked(tmp_path: Path) -> None:
    """Two exports that picked the same next version: the later one fails, the first one's stays."""
    meanwhile = pytest.raises(publish.ExportError, match="published by another export meanwhile")
    with meanwhile, publish.staged_version(tmp_path, "x", 1, force=False) as staged:
        (staged / "a").write_text("second")
        (tmp_path / "x" / "1").mkdir(parents=True)  # the first export lands while this one works
        (tmp_path / "x" / "1" / "a").write_text("first")
    assert (tmp_path / "x" / "1" / "a").read_text() == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["x"]  # no staging folder left


def test_an_unreadable_checkpoint_is_one_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_tokenizer: Tokenizer
) -> None:
    cfg = ClassifierConfig(vocab_size=tiny_tokenizer.get_vocab_size(), d_model=16, n_heads=2, d_ff=32, n_layers=1)
    train.save_checkpoint(Classifier(cfg), cfg, tiny_tokenizer, tmp_path / "ckpt")
    weights = tmp_path / "ckpt" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated
    assert publish.main([str(tmp_path / "ckpt"), "--name", "x", "--store", str(tmp_path / "store")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("export failed:"), err
