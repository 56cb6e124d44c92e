"""The serve command's flags, generated from `Settings`: one flag per setting, so they never drift.

Each flag is the setting's name with dashes (`max_batch_size` -> `--max-batch-size`); its help names
the environment variable and the default. A flag wins over the variable (it is passed to `Settings`
as an argument, which pydantic-settings ranks above the environment); values are checked by the
settings themselves, so a bad flag and a bad variable get the same one-line message.
"""

from __future__ import annotations

import argparse
import textwrap
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import SecretStr, ValidationError
from pydantic.fields import FieldInfo

from service.settings import Settings

SECRET_NOTE = "; prefer the variable: a flag shows in the process list"


class Formatter(argparse.HelpFormatter):
    """Lines broken at spaces only: a path, a variable or a header name stays whole."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False, break_long_words=False)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def variable(name: str) -> str:
    return (str(Settings.model_config.get("env_prefix", "")) + name).upper()


def shown_default(field: FieldInfo) -> str:
    default = field.get_default(call_default_factory=True)
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, str | Path) and str(default) == "":
        return "empty"
    return str(default)


def _choices(annotation: Any) -> tuple[str, ...]:
    """A Literal's values (also inside `X | None`), for the flag's metavar."""
    if typing.get_origin(annotation) is typing.Literal:
        return tuple(str(v) for v in typing.get_args(annotation))
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(c for arg in typing.get_args(annotation) for c in _choices(arg))
    return ()


def _kinds(annotation: Any) -> tuple[Any, ...]:
    """The types an annotation allows, Annotated and unions unwrapped."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _kinds(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return tuple(k for arg in typing.get_args(annotation) for k in _kinds(arg))
    return (annotation,)


def _is(annotation: Any, kind: type) -> bool:
    return any(isinstance(k, type) and issubclass(k, kind) for k in _kinds(annotation))


def metavar(name: str, annotation: Any) -> str:
    if name.endswith("_s"):
        return "SECONDS"
    if name.endswith("_ms"):
        return "MS"
    for kind, word in ((bool, "VALUE"), (int, "N"), (float, "X"), (Path, "PATH")):
        if _is(annotation, kind):
            return word
    return "VALUE"


def help_text(name: str, field: FieldInfo) -> str:
    secret = SECRET_NOTE if _is(field.annotation, SecretStr) else ""
    text = f"{field.description or name} [{variable(name)}; default: {shown_default(field)}{secret}]"
    return text.replace("%", "%%")


def add_settings(parser: argparse.ArgumentParser) -> None:
    """One flag per setting; a flag not given is absent from the parsed namespace (the variable,
    else the default, applies)."""
    group = parser.add_argument_group(
        "settings", "each flag is also an environment variable (named in brackets); a flag wins over its variable"
    )
    for name, field in Settings.model_fields.items():
        options: dict[str, Any] = {"default": argparse.SUPPRESS, "help": help_text(name, field), "dest": name}
        if _is(field.annotation, bool):
            options["action"] = argparse.BooleanOptionalAction
        elif choices := _choices(field.annotation):
            options["metavar"] = "{" + ",".join(choices) + "}"
        else:
            options["metavar"] = metavar(name, field.annotation)
        group.add_argument(flag(name), **options)


def given(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given as flags."""
    return {k: v for k, v in vars(args).items() if k in Settings.model_fields}


def settings_from(flags: Mapping[str, Any]) -> Settings:
    """`Settings` from the flags given, over the environment; ValidationError as pydantic raises it."""
    return Settings(**flags)


def problems(exc: ValidationError, flags: Mapping[str, Any], labels: Mapping[str, str] | None = None) -> list[str]:
    """One line per bad value, naming it as the user gave it: `labels` (a positional argument's
    name), else the flag, else the variable."""
    lines = []
    for error in exc.errors():
        name = str(error["loc"][0]) if error["loc"] else ""
        where = (labels or {}).get(name) or (flag(name) if name in flags else variable(name) if name else "settings")
        lines.append(f"  {where}: {error['msg']}")
    return lines


def names(parser: argparse.ArgumentParser) -> dict[str, Sequence[str]]:
    """Each setting's flags in `parser` (for the test that compares them with the declaration)."""
    return {a.dest: a.option_strings for a in parser._actions if a.dest in Settings.model_fields}
