"""`python -m service`: `transformer-serve serve` (flags, each also a SERVE_* variable; `--help` lists them)."""

from __future__ import annotations

import sys

from service.cli import serve_main

if __name__ == "__main__":
    sys.exit(serve_main(sys.argv[1:], prog="python -m service"))
