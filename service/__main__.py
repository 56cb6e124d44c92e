"""`python -m service`: serve the model store with the settings from the SERVE_* environment."""

from __future__ import annotations

import sys

from pydantic import ValidationError

from service.server import serve
from service.settings import Settings


def main() -> int:
    try:
        settings = Settings()
    except ValidationError as exc:
        lines = [
            f"  {'SERVE_' + '_'.join(map(str, e['loc'])).upper() if e['loc'] else 'settings'}: {e['msg']}"
            for e in exc.errors()
        ]
        print("invalid settings:\n" + "\n".join(lines), file=sys.stderr)
        return 2
    return serve(settings)


if __name__ == "__main__":
    sys.exit(main())
