"""bench.streaming's readings: one model's metric out of a whole exposition, an event stream's payloads,
and the twenty sentences its first-event figure needs."""

from __future__ import annotations

import re

from bench.streaming import TWENTY, events_of, metric

EXPOSITION = """# HELP inference_compute_seconds Model compute time per run
inference_compute_seconds_sum{model="en-de",stage="decode"} 1.5
inference_compute_seconds_sum{model="en-de",stage="encode"} 0.25
inference_compute_seconds_sum{model="sentiment",stage="classify"} 9.0
inference_compute_seconds_count{model="en-de",stage="decode"} 30.0
inference_queue_wait_seconds_sum{model="en-de"} 0.5
inference_queue_wait_seconds_sum{model="sentiment"} 4.0
"""


def test_metric_reads_only_the_labels_asked_for() -> None:
    assert metric(EXPOSITION, "inference_compute_seconds_sum", model="en-de", stage="decode") == 1.5
    assert metric(EXPOSITION, "inference_compute_seconds_sum", model="en-de") == 1.75
    assert metric(EXPOSITION, "inference_compute_seconds_sum") == 10.75
    assert metric(EXPOSITION, "inference_compute_seconds_count", model="en-de", stage="decode") == 30.0
    assert metric(EXPOSITION, "inference_queue_wait_seconds_sum", model="en-de") == 0.5
    assert metric(EXPOSITION, "inference_queue_wait_seconds", model="en-de") == 0.0  # a prefix is not the name


def test_events_are_the_data_lines_in_order() -> None:
    lines = ['data: {"index":0,"text":"Öffne"}', "", ": a comment", 'data: {"index":0,"text":"","finish_reason":"eos"}']
    assert list(events_of(iter([*lines, "data: [DONE]"]))) == [
        {"index": 0, "text": "Öffne"},
        {"index": 0, "text": "", "finish_reason": "eos"},
        "[DONE]",
    ]


def test_the_first_event_text_has_twenty_sentences() -> None:
    """The server's splitter found 20 (its batch-size metric, in the bench's report); here, by their ends."""
    sentences = re.split(r"(?<=[.?]) ", TWENTY)
    assert len(sentences) == 20 and all(s[0].isupper() and s[-1] in ".?" for s in sentences)
