"""Import of Hugging Face checkpoints from a local folder (nothing is ever downloaded)."""


class ImportProblem(Exception):
    """A checkpoint the importer refuses; the message names the one thing that is wrong."""
