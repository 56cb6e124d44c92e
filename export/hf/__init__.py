"""Importing Hugging Face checkpoints from a local directory (`python -m export.import_hf`)."""


class ImportProblem(Exception):
    """A checkpoint the importer refuses: one clear message naming the problem."""
