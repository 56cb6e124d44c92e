"""Documents: file formats split into segments for the translation task and put back together."""
