"""Print the project's runtime requirements from pyproject.toml, one per line, for pip -r.

    python3 docker/requirements.py pyproject.toml --replace onnxruntime=onnxruntime-gpu==1.31.1

--replace swaps a requirement by its distribution name: the GPU image installs onnxruntime-gpu
*instead of* onnxruntime (both ship the `onnxruntime` module; having both installed breaks the
import), then the project itself with --no-deps. Reading the list from pyproject keeps one source.
"""

import argparse
import re
import sys
import tomllib


def name_of(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise SystemExit(f"cannot read a requirement name from {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pyproject")
    parser.add_argument("--replace", action="append", default=[], metavar="NAME=REQUIREMENT")
    args = parser.parse_args()
    with open(args.pyproject, "rb") as f:
        deps: list[str] = tomllib.load(f)["project"]["dependencies"]
    swaps = dict(item.split("=", 1) for item in args.replace)
    names = {name_of(d) for d in deps}
    for name in swaps:
        if name_of(name) not in names:
            raise SystemExit(f"--replace {name}: not a dependency in {args.pyproject}")
    for dep in deps:
        print(next((new for old, new in swaps.items() if name_of(old) == name_of(dep)), dep))


if __name__ == "__main__":
    sys.exit(main())
