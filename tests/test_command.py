"""`transformer-serve` and `python -m service`: help without a server, one flag per setting, flags over
variables, bad values in one line per problem (exit 2), the export commands under one name."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from service import checkpoint, cli, flags
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = "100"  # help is wrapped to the terminal: the same width here and in the processes run


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SERVE_")} | {"COLUMNS": COLUMNS} | (env or {})
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=60)


def test_the_console_script_is_the_command() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"transformer-serve": "service.cli:main"}


# Each prints its help and exits 0 before any setting is read or the server module is imported:
# nothing can bind a port (the store named here does not exist: a start would exit 2).
PROBE = """
import sys
from service.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    print("exit", exc.code, "server imported" if "service.server" in sys.modules else "no server")
"""


@pytest.mark.parametrize(
    "argv", [["--help"], ["serve", "--help"], ["serve", "-h"], ["--version"]], ids=["top", "serve", "h", "version"]
)
def test_help_prints_and_starts_nothing(argv: list[str]) -> None:
    done = run("-c", PROBE, *argv, env={"SERVE_MODEL_STORE": "/nonexistent", "SERVE_PORT": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("exit 0 no server"), done.stdout
    text = " ".join(done.stdout.split())
    if argv == ["--help"]:
        for name, (line, _) in cli.COMMANDS.items():
            assert f"{name} {' '.join(line.split())}" in text
    elif argv == ["--version"]:
        assert text.startswith("transformer-serve ")
    else:
        assert "usage: transformer-serve serve [PATH] [options]" in text and "--max-batch-size N" in text


def test_python_m_service_help_is_the_serve_help(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", COLUMNS)
    done = run("-m", "service", "--help", env={"SERVE_MODEL_STORE": "/nonexistent"})
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout == cli.serve_parser("python -m service").format_help()
    assert (
        done.stdout.replace("python -m service", "transformer-serve serve").splitlines()[2:]
        == (cli.serve_parser("transformer-serve serve").format_help().splitlines()[2:])
    )


def test_every_setting_is_a_flag_naming_its_variable_and_default() -> None:
    parser = cli.serve_parser("transformer-serve serve")
    found = {name: opts[0] for name, opts in flags.names(parser).items()}
    assert found == {name: flags.flag(name) for name in Settings.model_fields}
    text = " ".join(parser.format_help().split())
    for name, field in Settings.model_fields.items():
        assert f"[SERVE_{name.upper()}; default: {flags.shown_default(field)}" in text, name
    assert "--api-keys VALUE inference keys" in text and "prefer the variable" in text
    assert "--api-pages, --no-api-pages" in text and "--variant {fp32,int8,fp16}" in text


def test_a_flag_wins_over_its_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SERVE_PORT", "1234")
    monkeypatch.setenv("SERVE_MAX_TEXTS", "7")
    monkeypatch.setenv("SERVE_API_PAGES", "true")
    parser = cli.serve_parser("x")
    args = parser.parse_args(["--port", "4321", "--no-api-pages", "--model-store", str(tmp_path)])
    settings = flags.settings_from(flags.given(args))
    assert (settings.port, settings.max_texts, settings.api_pages, settings.model_store) == (4321, 7, False, tmp_path)
    assert flags.settings_from(flags.given(parser.parse_args([]))).port == 1234


def test_a_bad_value_is_one_line_naming_the_flag_or_the_variable() -> None:
    done = run("-m", "service", "--port", "x", "--max-batch-size", "0", env={"SERVE_MAX_WAIT_MS": "-1"})
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0] == "invalid settings:" and len(lines) == 4, lines
    assert lines[1].startswith("  --port: Input should be a valid integer")
    assert lines[2] == "  --max-batch-size: Input should be greater than or equal to 1"
    assert lines[3] == "  SERVE_MAX_WAIT_MS: Input should be greater than or equal to 0"
    assert run("-m", "service", "--variant", "fp64").stderr.splitlines()[1].startswith("  --variant: Input should be")
    missing = run("-m", "service.cli", "serve", "/nonexistent/store").stderr.splitlines()
    assert missing == ["invalid settings:", "  PATH: Path does not point to a directory"], missing
    unknown = run("-m", "service.cli", "serve", "--max-batch", "4")  # no abbreviations: --variant is not --variants
    assert unknown.returncode == 2 and unknown.stderr.endswith("unrecognized arguments: --max-batch\n")


def test_import_options_are_refused_for_a_store(tmp_path: Path) -> None:
    done = run("-m", "service.cli", "serve", str(tmp_path), "--languages", "en,de", "--port", "0")
    assert done.returncode == 2
    assert f"--languages: import options, for a checkpoint folder; {tmp_path} is a model store" in done.stderr
    both = run("-m", "service.cli", "serve", str(tmp_path), "--model-store", str(tmp_path))
    assert both.returncode == 2 and "either as PATH or as --model-store" in both.stderr


@pytest.mark.parametrize("command", ["import", "publish", "promote"])
def test_the_export_commands_are_reachable_under_one_name(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", COLUMNS)
    done = run("-m", "service.cli", command, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: transformer-serve {command} ")
    module = cli.COMMANDS[command][1]
    assert module is not None
    assert done.stdout == importlib.import_module(module).build_parser(f"transformer-serve {command}").format_help()
    old = run("-m", module, "--help")  # python -m keeps working, under its own name
    assert old.returncode == 0 and old.stdout.startswith(f"usage: python -m {module} ")


def test_without_the_importer_a_checkpoint_folder_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    with pytest.raises(checkpoint.CheckpointProblem, match=r"missing: transformers\): pip install 'transformer-serve"):
        checkpoint._importer()


def test_the_content_key_follows_the_files_and_the_options(tmp_path: Path) -> None:
    folder = tmp_path / "My Model"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "sub" / "a.bin").write_bytes(b"abc")
    base = checkpoint.ImportChoice()
    key = checkpoint.content_key(folder, base)
    (folder / ".cache").mkdir()
    (folder / ".cache" / "x").write_text("download metadata")  # hidden: not content
    assert checkpoint.content_key(folder, base) == key
    assert checkpoint.content_key(folder, checkpoint.ImportChoice(languages=("en", "de"))) != key
    (folder / "sub" / "a.bin").write_bytes(b"abd")
    assert checkpoint.content_key(folder, base) != key
    (folder / "sub" / "a.bin").write_bytes(b"abc")
    assert checkpoint.content_key(folder, base) == key
    (folder / "sub" / "a.bin").rename(folder / "a.bin")  # the same bytes under another name
    assert checkpoint.content_key(folder, base) != key
    assert checkpoint.is_checkpoint(folder) and not checkpoint.is_checkpoint(tmp_path)
    assert checkpoint.model_name(folder) == "my-model"
