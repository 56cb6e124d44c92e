"""Fault injection for the reliability campaign (`bench/reliability.py`), never in the image:
a server started with this folder on PYTHONPATH imports it at interpreter start.

FAULT_DECODE_EVERY=N   every N-th decoder call of ONNX Runtime raises, as a failing kernel would
FAULT_DECODE_LIMIT=M   ... the first M times only (default: no limit), so recovery can be seen
FAULT_DECODE_GATE=PATH every decoder call waits while the file PATH exists, and says so once per wait
                       ("FAULT gate: decoder call held" on stderr), so a test holds a translation
                       in flight for as long as it needs and knows when it is held
FAULT_DECODE_STEPS=PATH while PATH exists, decoder call n (counted from the start) waits until PATH
                       holds a number >= n; it writes n to PATH.held when it starts waiting and to
                       PATH.done when it returns, so a benchmark runs a request a step at a time and
                       sees what each step sent (bench/streaming.py: the first event, in steps)
FAULT_UNREADABLE=PATH  listing PATH fails with "Permission denied", as for a store the server's
                       user cannot read (the campaign runs as root, whom file modes do not stop)
"""

from __future__ import annotations

import errno
import itertools
import os
import sys
import time
from typing import Any

_every = int(os.environ.get("FAULT_DECODE_EVERY", "0"))
_limit = int(os.environ.get("FAULT_DECODE_LIMIT", "0")) or None
_unreadable = os.environ.get("FAULT_UNREADABLE", "")
_gate = os.environ.get("FAULT_DECODE_GATE", "")
_steps = os.environ.get("FAULT_DECODE_STEPS", "")

if _every > 0:
    from service.engine import runtime

    _decode = runtime.TranslatorRuntime.decode
    _calls, _failed = itertools.count(1), itertools.count(1)

    def _failing_decode(self: Any, *args: Any, **kwargs: Any) -> Any:
        if next(_calls) % _every == 0 and (_limit is None or next(_failed) <= _limit):
            print("FAULT injected: decoder call failed", file=sys.stderr, flush=True)
            raise RuntimeError("injected fault: ONNX Runtime decoder call failed")
        return _decode(self, *args, **kwargs)

    runtime.TranslatorRuntime.decode = _failing_decode  # type: ignore[method-assign]

if _gate:
    from service.engine import runtime

    _gated = runtime.TranslatorRuntime.decode

    def _gated_decode(self: Any, *args: Any, **kwargs: Any) -> Any:
        if os.path.exists(_gate):
            print("FAULT gate: decoder call held", file=sys.stderr, flush=True)
            while os.path.exists(_gate):
                time.sleep(0.01)
        return _gated(self, *args, **kwargs)

    runtime.TranslatorRuntime.decode = _gated_decode  # type: ignore[method-assign]

if _steps:
    from service.engine import runtime

    _stepped = runtime.TranslatorRuntime.decode
    _made = itertools.count(1)

    def _allowed() -> int | None:
        """The calls allowed so far; None without the file (no gate). The benchmark replaces the
        file whole (os.replace), so a read never sees half a number."""
        try:
            with open(_steps) as f:
                return int(f.read() or "0")
        except FileNotFoundError:
            return None

    def _mark(suffix: str, n: int) -> None:
        with open(_steps + suffix + ".tmp", "w") as f:
            f.write(str(n))
        os.replace(_steps + suffix + ".tmp", _steps + suffix)

    def _stepped_decode(self: Any, *args: Any, **kwargs: Any) -> Any:
        n = next(_made)
        if (allowed := _allowed()) is not None and allowed < n:
            _mark(".held", n)
            while (allowed := _allowed()) is not None and allowed < n:
                time.sleep(0.002)
        try:
            return _stepped(self, *args, **kwargs)
        finally:
            _mark(".done", n)

    runtime.TranslatorRuntime.decode = _stepped_decode  # type: ignore[method-assign]

if _unreadable:
    _listdir, _scandir = os.listdir, os.scandir

    def _check(path: Any) -> None:
        if os.path.realpath(os.fspath(path)).startswith(os.path.realpath(_unreadable)):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))

    def _failing_listdir(path: Any = ".") -> Any:
        _check(path)
        return _listdir(path)

    def _failing_scandir(path: Any = ".") -> Any:
        _check(path)
        return _scandir(path)

    os.listdir, os.scandir = _failing_listdir, _failing_scandir  # type: ignore[assignment]
