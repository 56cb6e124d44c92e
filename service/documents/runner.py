"""A file's segments through the translation task, sharing the model fairly with other requests.

Each distinct segment is translated once, as its own request to the step scheduler, with only
`parallel` of them queued or running at a time. The scheduler serves waiting requests
round-robin, one sentence each, so a request that arrives while a catalog runs joins the running
batch at once (the file holds a few of its rows, not all) instead of waiting behind the whole
file; and the file never fills the queue that other clients' admission is measured against. How
many rows a file holds is the trade: each row slows every step a little, for everyone
(`SERVE_FILE_SEGMENTS_IN_FLIGHT`, docs/documents.md). A chunk refused as busy is sent again
until the file's deadline; a text over the model's token limit comes back empty (its format then
leaves that unit untranslated and counts it failed), the rest of the file is translated.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

from service.errors import DeadlineExceeded, InputTooLong, PayloadTooLarge, QueueFull

Translate = Callable[[list[str]], Awaitable[list[str]]]
Progress = Callable[[int, int], None]  # distinct segments translated so far, of how many
RETRY_S = 0.25  # a refused chunk waits this long before it is sent again


def check_limits(segments: Sequence[str], max_segments: int, max_chars: int) -> list[str]:
    """The distinct segments, in first-seen order; 413 when a file has too many or too long."""
    unique = list(dict.fromkeys(segments))
    if len(unique) > max_segments:
        raise PayloadTooLarge(f"the file has {len(unique)} distinct texts to translate; the limit is {max_segments}")
    chars = sum(map(len, unique))
    if chars > max_chars:
        raise PayloadTooLarge(f"the file has {chars} characters to translate; the limit is {max_chars}")
    return unique


async def translate_segments(
    segments: Sequence[str],
    translate: Translate,
    deadline: float,
    chunk: int = 1,
    parallel: int = 4,
    progress: Progress | None = None,
) -> list[str]:
    """`translate` applied to each distinct segment once, `chunk` texts a call, at most `parallel`
    calls at a time; the translations in the order of `segments`. `progress` hears of each chunk done."""
    unique = list(dict.fromkeys(segments))
    done: dict[str, str] = {}
    gate = asyncio.Semaphore(parallel)

    async def patiently(texts: list[str]) -> list[str]:
        while True:
            try:
                return await translate(texts)
            except QueueFull:
                if time.monotonic() + RETRY_S >= deadline:
                    raise DeadlineExceeded("the file's deadline passed while the model was busy") from None
                await asyncio.sleep(RETRY_S)

    async def one(texts: list[str]) -> None:
        async with gate:
            try:
                out = await patiently(texts)
            except (InputTooLong, PayloadTooLarge):  # texts that may fit one at a time
                out = []
                for text in texts:
                    try:
                        out += await patiently([text])
                    except (InputTooLong, PayloadTooLarge):  # one text over a limit fails its own unit, not the file
                        out.append("")
            done.update(zip(texts, out, strict=True))
            if progress is not None:
                progress(len(done), len(unique))

    tasks = [asyncio.ensure_future(one(unique[i : i + chunk])) for i in range(0, len(unique), chunk)]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
    return [done[s] for s in segments]
