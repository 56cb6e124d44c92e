"""Put on Infinity's PYTHONPATH by `bench.peers`: its ONNX Runtime sessions get BENCH_ORT_THREADS
intra-op threads, the project's engine threads. Infinity passes no session options, and ONNX
Runtime's default counts the machine's cores, not the process's CPU set: pinned to one CPU of two,
Infinity would otherwise run two spinning intra-op threads on that one CPU."""

import os

if threads := os.environ.get("BENCH_ORT_THREADS"):
    import onnxruntime as ort

    _Session = ort.InferenceSession

    class InferenceSession(_Session):  # type: ignore[misc,valid-type]
        def __init__(self, path_or_bytes, sess_options=None, providers=None, provider_options=None, **kwargs):
            sess_options = sess_options or ort.SessionOptions()
            if sess_options.intra_op_num_threads == 0:  # ONNX Runtime's default: one thread per core
                sess_options.intra_op_num_threads = int(threads)
            super().__init__(path_or_bytes, sess_options, providers, provider_options, **kwargs)

    ort.InferenceSession = InferenceSession
