"""Importers for Hugging Face checkpoints read from a local directory (never the hub)."""


class ImportProblem(Exception):
    """A checkpoint the project cannot serve as it is: the message names the option or file at fault."""
