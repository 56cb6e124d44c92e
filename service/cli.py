"""`transformer-serve`: one command for the project's jobs (the console script in pyproject.toml).

    transformer-serve serve [PATH] [--port 9000 ...]   # a model store, or a Hugging Face checkpoint folder
    transformer-serve import DIR --name NAME            # python -m export.import_hf
    transformer-serve publish RUN --name NAME           # python -m export.publish
    transformer-serve promote VERSION_FOLDER --to N     # python -m export.promote

`serve`'s flags are generated from the settings (`service.flags`); `python -m service` is `serve`.
The other commands are the export CLIs, unchanged, imported only when asked for: the service's own
install has no torch, and says which extra to install.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

from pydantic import ValidationError

from service import flags
from service.checkpoint import EXTRA, CheckpointProblem, ImportChoice, cached_store, is_checkpoint

PROG = "transformer-serve"
# command -> (one line of help, the module whose main(argv, prog) runs it; None: serve)
COMMANDS: dict[str, tuple[str, str | None]] = {
    "serve": ("serve a model store or a Hugging Face checkpoint folder over HTTP", None),
    "import": ("import a local Hugging Face checkpoint into a model store (validated)", "export.import_hf"),
    "publish": ("export a trained checkpoint into a model store (validated)", "export.publish"),
    "promote": ("ship a validated model version again under a new version number", "export.promote"),
}
EXTRAS = {"export.import_hf": "import", "export.publish": "train", "export.promote": "train"}


def version() -> str:
    try:
        return metadata.version("transformer-serve")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in COMMANDS:
        _, module = COMMANDS[args[0]]
        prog = f"{PROG} {args[0]}"
        return serve_main(args[1:], prog) if module is None else export_main(module, args[1:], prog)
    parser = command_parser()
    parser.parse_args(args)  # --help, --version, or a usage error (exit 2)
    parser.print_help(sys.stderr)
    return 2


def command_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Serve Transformer text models (classifiers, translators) with ONNX Runtime; "
        "import, publish and promote the model versions it serves.",
        epilog=f"`{PROG} COMMAND --help` lists a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {version()}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name, (line, _) in COMMANDS.items():
        commands.add_parser(name, help=line, add_help=False)
    return parser


def export_main(module: str, argv: list[str], prog: str) -> int:
    """An export CLI's main, or one line naming the extra it needs."""
    try:
        entry: Callable[..., int] = importlib.import_module(module).main
    except ImportError as exc:
        extra = EXTRAS[module]
        missing = exc.name or str(exc)
        print(
            f"{prog} needs the {extra} extra (missing: {missing}): pip install 'transformer-serve[{extra}]'",
            file=sys.stderr,
        )
        return 2
    return entry(argv, prog=prog)


def serve_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        usage="%(prog)s [PATH] [options]",
        description="Serve a model store, or a Hugging Face checkpoint folder, over HTTP (REST, the Open "
        "Inference Protocol, the LibreTranslate API, /docs). Every setting is a flag and an environment variable.",
        allow_abbrev=False,  # --variant and --variants are two options
        formatter_class=flags.Formatter,
    )
    parser.add_argument(
        "path",
        nargs="?",
        type=Path,
        default=None,
        metavar="PATH",
        help="a model store, or a save_pretrained checkpoint folder (config.json, safetensors weights, tokenizer): "
        "imported once into the import cache, then served [the same as --model-store]",
    )
    imports = parser.add_argument_group(
        "import", f"when PATH is a checkpoint folder: the importer's options (needs {EXTRA})"
    )
    imports.add_argument(
        "--name", default=None, metavar="NAME", help="model name in the store [default: the folder's name]"
    )
    imports.add_argument(
        "--languages",
        default="",
        metavar="SOURCE,TARGET",
        help="a one-pair translator's source,target, e.g. en,de [default: the checkpoint's]",
    )
    imports.add_argument(
        "--task",
        default=None,
        metavar="TASK",
        help="an encoder-decoder's task, translation or text2text [default: text2text for T5 and BART, "
        "translation for the others]",
    )
    imports.add_argument(
        "--prefix", default="", metavar="TEXT", help='text2text: prepended to every input, e.g. "summarize: "'
    )
    imports.add_argument(
        "--variants", default="fp32", metavar="LIST", help="comma list of fp32,fp16,int8 [default: fp32]"
    )
    imports.add_argument(
        "--default-variant",
        default="fp32",
        metavar="VARIANT",
        help="the variant served unless --variant says otherwise [default: fp32]",
    )
    imports.add_argument(
        "--calibration",
        type=Path,
        default=None,
        metavar="FILE",
        help="int8: a text file, one sentence per line [default: none]",
    )
    flags.add_settings(parser)
    return parser


IMPORT_OPTIONS = ("name", "languages", "task", "prefix", "variants", "default_variant", "calibration")


def serve_main(argv: Sequence[str], prog: str = f"{PROG} serve") -> int:
    """Parse the flags, build the settings (flags over the environment), import a checkpoint folder
    when one is given, serve. Exit 2 with one line per problem for a bad flag, variable or folder."""
    parser = serve_parser(prog)
    args = parser.parse_args(argv)
    given = flags.given(args)
    if args.path is not None:
        if "model_store" in given:
            parser.error("give the store either as PATH or as --model-store, not both")
        given["model_store"] = args.path
    try:
        settings = flags.settings_from(given)
    except ValidationError as exc:
        labels = {"model_store": "PATH"} if args.path is not None else {}
        print("invalid settings:\n" + "\n".join(flags.problems(exc, given, labels)), file=sys.stderr)
        return 2
    from service import logs
    from service.server import serve  # uvicorn, the app: not needed for --help or a bad flag

    logs.setup(settings.log_level)
    asked = [o for o in IMPORT_OPTIONS if getattr(args, o) != parser.get_default(o)]
    if is_checkpoint(settings.model_store):
        try:
            choice = import_choice(args)
            store = cached_store(settings.model_store, settings.import_cache, choice)
        except (CheckpointProblem, OSError) as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return 2
        settings = settings.model_copy(update={"model_store": store})
    elif asked:
        names = ", ".join(flags.flag(o) for o in asked)
        parser.error(f"{names}: import options, for a checkpoint folder; {settings.model_store} is a model store")
    return serve(settings)


def import_choice(args: argparse.Namespace) -> ImportChoice:
    codes = [c.strip() for c in args.languages.split(",") if c.strip()]
    if codes and len(codes) != 2:
        raise CheckpointProblem(f"--languages takes source,target, got {args.languages!r}")
    calibration = tuple(args.calibration.read_text().splitlines()) if args.calibration else ()
    return ImportChoice(
        name=args.name,
        languages=(codes[0], codes[1]) if codes else None,
        variants=tuple(v.strip() for v in args.variants.split(",") if v.strip()),
        default_variant=args.default_variant,
        calibration=calibration,
        task=args.task,
        prefix=args.prefix,
    )


if __name__ == "__main__":
    sys.exit(main())
