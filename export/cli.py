"""What the export CLIs share: help that shows every default, data paths named absolutely, quiet runs
with a short summary (`python -m export.publish`, `export.import_hf`, `export.train`)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

SUMMARY_LINES = 20  # the most lines a default (not --verbose) publish or import prints
_NOT_GATES = ("train", "shipped_variants")  # report entries that are not a check's figure


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, unless the help states it already; required ones say so."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.required and action.option_strings:
            return f"{text} (required)"
        if "default" in text:
            return text
        return super()._get_help_string(action)


def data_file(data_dir: Path, *parts: str, why: str = "run `make data` first") -> Path:
    """`data_dir/parts...`, or FileNotFoundError naming the absolute path looked at: --data-dir is
    relative to the working directory, not to the project."""
    path = data_dir.joinpath(*parts)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path.absolute()} not found (--data-dir {data_dir} is relative to the working directory "
            f"{Path.cwd()}): {why}, or pass --data-dir"
        )
    return path


@contextmanager
def quiet(verbose: bool) -> Iterator[None]:
    """Without --verbose, third-party warnings (torch.onnx's TracerWarning and DeprecationWarning,
    ONNX Runtime's and transformers' log lines and progress bars) are not printed: a check that
    fails raises, so what they say is noise once the export has passed."""
    if verbose:
        yield
        return
    import onnxruntime as ort

    hf = sys.modules.get("transformers")  # an import's: its progress bars go too
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ort.set_default_logger_severity(3)  # errors and fatal only
        logging.disable(logging.WARNING)
        if hf is not None:
            hf.utils.logging.disable_progress_bar()
        try:
            yield
        finally:
            logging.disable(logging.NOTSET)
            ort.set_default_logger_severity(2)  # ONNX Runtime's default: warnings
            if hf is not None:
                hf.utils.logging.enable_progress_bar()


def summary(folder: Path, manifest: Mapping[str, object]) -> list[str]:
    """A published version in at most SUMMARY_LINES lines: its folder, variants, the checks it passed
    with their figures, the test-split figures and the default variant."""
    metrics = dict(manifest["metrics"])  # type: ignore[call-overload]
    shipped = list(manifest["variants"])  # type: ignore[call-overload]
    tests = {k: v for k, v in metrics.items() if k.startswith("test_")}
    seconds = {k: v for k, v in metrics.items() if k.endswith("_seconds")}
    gates = {k: v for k, v in metrics.items() if k not in tests and k not in seconds and k not in _NOT_GATES}
    lines = [
        f"published {folder.absolute()}",
        f"variants shipped: {', '.join(shipped)}; default variant: {manifest['default_variant']}",
        "checks passed:",
        *(f"  {k}: {_compact(v)}" for k, v in gates.items()),
        "test split:",
        *(f"  {k}: {_compact(v)}" for k, v in tests.items()),
        *(f"{k}: {v}" for k, v in seconds.items()),
    ]
    if len(lines) > SUMMARY_LINES:
        cut = len(lines) - SUMMARY_LINES + 1
        lines = [*lines[: SUMMARY_LINES - 1], f"  ... {cut} more lines: manifest.json, or --verbose"]
    return lines


def _compact(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_compact(v)}" for k, v in value.items() if not isinstance(v, dict | list))
    return json.dumps(value) if isinstance(value, list) else str(value)
