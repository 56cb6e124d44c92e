"""Container HEALTHCHECK: GET /healthz on the server's own port; exit 0 when it answers 200.

Stdlib only, so the image needs no curl. The port is the one the server binds (SERVE_PORT).
"""

import os
import sys
import urllib.request

url = f"http://127.0.0.1:{os.environ.get('SERVE_PORT', '8000')}/healthz"
try:
    with urllib.request.urlopen(url, timeout=3) as response:  # noqa: S310 (fixed loopback URL)
        sys.exit(0 if response.status == 200 else 1)
except OSError as exc:
    print(f"healthcheck: {url}: {exc}", file=sys.stderr)
    sys.exit(1)
