"""The document runner with a scripted translator: each distinct segment once, in small chunks,
a bounded number in flight, busy refusals retried, a text over the model's limit left empty."""

from __future__ import annotations

import asyncio
import time

import pytest

from service.documents import runner
from service.errors import DeadlineExceeded, InputTooLong, PayloadTooLarge, QueueFull


def test_segments_are_translated_once_in_bounded_chunks() -> None:
    calls: list[list[str]] = []
    active = peak = 0

    async def translate(texts: list[str]) -> list[str]:
        nonlocal active, peak
        calls.append(texts)
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.001)
        active -= 1
        return [t.upper() for t in texts]

    segments = [f"s{i % 30}" for i in range(100)]
    out = asyncio.run(runner.translate_segments(segments, translate, time.monotonic() + 5, chunk=4, parallel=3))
    assert out == [s.upper() for s in segments]
    assert sorted(t for c in calls for t in c) == sorted(set(segments))  # each once
    assert max(map(len, calls)) == 4 and peak == 3


def test_busy_chunks_are_retried_and_long_texts_left_empty() -> None:
    refused = [2]

    async def translate(texts: list[str]) -> list[str]:
        if refused[0]:
            refused[0] -= 1
            raise QueueFull("busy")
        if any(len(t) > 5 for t in texts):
            raise InputTooLong("too long")
        return [t.upper() for t in texts]

    out = asyncio.run(runner.translate_segments(["ab", "toolong", "cd"], translate, time.monotonic() + 5))
    assert out == ["AB", "", "CD"]


def test_a_model_busy_past_the_deadline_is_a_504() -> None:
    async def translate(texts: list[str]) -> list[str]:
        raise QueueFull("busy")

    with pytest.raises(DeadlineExceeded):
        asyncio.run(runner.translate_segments(["a"], translate, time.monotonic() + 0.3))


def test_file_limits() -> None:
    assert runner.check_limits(["a", "b", "a"], 2, 10) == ["a", "b"]
    with pytest.raises(PayloadTooLarge, match="3 distinct"):
        runner.check_limits(["a", "b", "c"], 2, 10)
    with pytest.raises(PayloadTooLarge, match="11 characters"):
        runner.check_limits(["a" * 11], 2, 10)
