"""Service settings: the only reader of environment variables (prefix ``SERVE_``), validated at start-up.

`transformer-serve serve` (`python -m service`) builds one `Settings` from its flags over the environment
(`service.flags`: one flag per field, generated from this declaration) and passes it to
`create_app(settings)`; tests build their own with keyword arguments. Nothing reads the environment
at import time. The one exception: the OpenTelemetry SDK reads its own standard `OTEL_*` variables
(`service.tracing`; docs/deployment.md#tracing).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import DirectoryPath, Field, FilePath, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.priority import Policy


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SERVE_", extra="forbid", frozen=True)

    # server
    host: str = Field(default="127.0.0.1", description="bind address (the container sets 0.0.0.0)")
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port (0: any free port)")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="JSON log lines from this level on"
    )
    # models
    model_store: DirectoryPath = Field(
        default=DirectoryPath("model_store"),
        description="model store folder, or a Hugging Face checkpoint folder (served through the import cache)",
    )
    import_cache: Path = Field(
        default=Path("~/.cache/transformer-serve"),
        description="a checkpoint folder given as the store is imported here once, keyed by its files' content and "
        "the import options; a later start with the same folder reuses it",
    )
    variant: Literal["fp32", "int8", "fp16"] | None = Field(
        default=None, description="model variant; unset: each default"
    )
    providers: str = Field(default="cpu", description="ONNX Runtime providers in order, comma-separated (cuda,cpu)")
    device_buffers: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="a translator's running batch in the decoder's device memory: auto = on CUDA only; "
        "off keeps host buffers (copied to the GPU every step); on also on CPU (a check of that path)",
    )
    threads: int = Field(
        default=0, ge=0, le=256, description="CPU threads for all models together; 0: the container's CPU quota"
    )
    classification_threads: int = Field(
        default=0, ge=0, le=256, description="threads of the classifier's worker; 0: a quarter of `threads`, at least 1"
    )
    translation_threads: int = Field(
        default=0, ge=0, le=256, description="threads of the translator's step scheduler; 0: the rest, at least 1"
    )
    text2text_threads: int = Field(
        default=0,
        ge=0,
        le=256,
        description="threads of a text-to-text model's step scheduler; 0: shares the rest with the translator",
    )
    model_versions: str = Field(
        default="",
        pattern=r"^\s*([a-z0-9][a-z0-9._-]*=\d+\s*(,\s*|$))*$",
        description="pinned versions, e.g. en-de=3,sentiment=1; other models serve their newest intact version",
    )
    watch_interval_s: float = Field(
        default=0.0, ge=0, le=86400, description="seconds between store scans for new versions; 0: no watcher"
    )
    default_classifier: str | None = Field(default=None, description="model used by /predict without `model`")
    default_translator: str | None = Field(default=None, description="model used by /translate without `model`")
    default_generator: str | None = Field(
        default=None, description="text-to-text model used by /generate without `model`"
    )
    # batching
    max_batch_size: int = Field(default=32, ge=1, le=1024, description="items (texts) per batch")
    max_batch_tokens: int = Field(default=512, ge=1, description="padded tokens per batch (rows x longest row)")
    max_batch_tokens_shared: int = Field(
        default=128,
        ge=0,
        description="classification: padded tokens per batch of a larger request while requests of at most "
        "SERVE_BATCH_EXPRESS_ITEMS come and go (one waited beside it within 2 s): what such a request may wait for "
        "(the batch running when it arrives) against the larger one's throughput; 0: SERVE_MAX_BATCH_TOKENS",
    )
    batch_express_items: int = Field(
        default=8,
        ge=0,
        description="classification: requests of at most this many texts (or pairs) waiting take a batch of their "
        "own, every other batch, while a larger request waits: a one-text request then waits for the running batch "
        "only; 0: off",
    )
    max_wait_ms: float = Field(default=2.0, ge=0, le=1000, description="a batch closes this long after its first item")
    max_queue: int = Field(default=512, ge=1, description="queued items (translation: sentences) per model before 429")
    # translation: step-level scheduling
    # 128: 32 beam-4 sentences a step; served beam-4 /translate x1.12 against 64 and the peer's mixed load's
    # beams x1.4. At 4x overload with 5 s deadlines the admitted requests finish about as at 64 (p99 1.4-2.0 s
    # against 1.4-1.5, slowest 2.7-3.5 s against 2.8-3.6) since sampled draws stopped sorting the vocabulary
    # (docs/history/2026-12-02-to-05-results.md#reliability)
    step_max_rows: int = Field(
        default=128, ge=1, le=4096, description="decoder rows (sentences x beams) per step: latency against throughput"
    )
    step_express_share: float = Field(
        default=0.5,
        ge=0,
        lt=1,
        description="share of the decoder's time that small greedy requests may take in steps of their own while "
        "beams run (their latency against the beams' throughput); 0: they ride in the main steps",
    )
    step_express_work: int = Field(
        default=128, ge=0, description="the largest request taking express steps: estimated row-steps, rows x steps"
    )
    step_express_few: int = Field(
        default=8,
        ge=0,
        description="an express lane of more sentences than this (a flood of short requests) steps once for each main "
        "step instead of by its share, so that its rows advance at the beams' pace, not at their expense",
    )
    step_max_cache_tokens: int = Field(
        default=131072, ge=64, description="cache tokens reserved by running sentences: rows x (source + max new)"
    )
    request_timeout_s: float = Field(default=30.0, gt=0, le=3600, description="deadline per request (504 when passed)")
    drain_timeout_s: float = Field(
        default=30.0, ge=0, le=3600, description="shutdown: time for admitted work to finish"
    )
    drain_grace_s: float = Field(
        default=0.0, ge=0, le=600, description="SIGTERM: not ready at once, still serving this long, then closing"
    )
    gil_switch_interval_s: float = Field(
        default=0.0005, gt=0, le=0.1, description="Python thread switch interval: how soon the event loop gets the GIL"
    )
    model_thread_priority: Policy = Field(
        default="idle",
        description="model threads below the event loop: idle = SCHED_IDLE (the loop preempts them at once; they get "
        "the CPU nothing else wants), nice = 5 steps nicer (they keep a share beside other busy processes)",
    )
    # access
    api_keys: SecretStr | None = Field(
        default=None,
        description="inference keys, comma-separated (`name:key` names one in logs); set: inference needs a key",
    )
    admin_keys: SecretStr | None = Field(
        default=None,
        description="admin keys (model control, and inference); set: model control is on and needs one",
    )
    metrics_keys: SecretStr | None = Field(
        default=None, description="keys for /metrics (Prometheus' bearer token); set: /metrics needs one (or admin)"
    )
    model_control: Literal["none", "explicit"] | None = Field(
        default=None,
        description="repository load/unload: none (403) or explicit; unset: explicit when admin keys are set",
    )
    client_requests_per_minute: int = Field(
        default=0, ge=0, description="inference requests per minute per client (its key, else its address); 0: none"
    )
    client_chars_per_minute: int = Field(
        default=0, ge=0, description="characters of input text per minute per client (429 above); 0: no limit"
    )
    max_request_chars: int = Field(
        default=0, ge=0, description="characters of input text in one request, all texts together (413 above); 0: none"
    )
    limits_file: FilePath | None = Field(
        default=None, description="JSON limits per key id (no secrets), re-read when it changes; over the above"
    )
    limit_hold_s: float = Field(
        default=1.0,
        ge=0,
        le=30,
        description="a client over its request limit gets its 429 this long later (at most its Retry-After): "
        "a closed-loop flood then sends as fast as this allows, not as fast as the server can refuse",
    )
    stream_buffer_events: int = Field(
        default=256,
        ge=1,
        le=65536,
        description="events a streamed answer holds for a reader slower than the model; past them its request is "
        "cancelled and the stream ends with an error event (the scheduler never waits for a reader)",
    )
    trusted_proxy_header: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9-]+$",
        description="the client address is this header's last entry (e.g. x-forwarded-for); unset: the connection's",
    )
    # the API pages
    api_pages: bool = Field(
        default=True,
        description="/docs (Swagger UI) and /redoc, from assets the service ships (no CDN); off: 404, "
        "the document /openapi.json stays",
    )
    # connections
    header_timeout_s: float = Field(
        default=10.0, gt=0, le=600, description="a request's headers must arrive within this (else: closed)"
    )
    body_timeout_s: float = Field(
        default=10.0, gt=0, le=600, description="a request's body must arrive within this (408)"
    )
    max_header_bytes: int = Field(
        default=16384, ge=1024, le=1_048_576, description="a request's headers above this get 431 (and a close)"
    )
    keepalive_timeout_s: float = Field(default=5.0, ge=1, le=600, description="an idle keep-alive connection is closed")
    # 128: at 4x overload on one core, 512 let requests wait seconds in the accept queue before the
    # first refusal (bench/reliability.py); the queues' own admission bounds the work in flight anyway
    max_in_flight: int = Field(
        default=128, ge=1, description="requests in flight at once; beyond: 503 at once (probes and /metrics exempt)"
    )
    # request limits
    max_body_bytes: int = Field(default=1 << 20, ge=1024, description="request body size (413 above)")
    max_texts: int = Field(default=64, ge=1, le=4096, description="texts per request (422 above)")
    max_text_chars: int = Field(default=2000, ge=1, description="characters per text (422 above)")
    # documents (POST /translate_file, LibreTranslate's translate_file): docs/documents.md
    max_file_bytes: int = Field(default=2 << 20, ge=1024, description="an uploaded file's request body (413 above)")
    max_file_segments: int = Field(
        default=5000, ge=1, description="distinct texts to translate in one file, after deduplication (413 above)"
    )
    max_file_chars: int = Field(default=500_000, ge=1, description="characters to translate in one file (413 above)")
    file_segments_in_flight: int = Field(
        default=2, ge=1, le=256, description="a file's texts queued or decoding at once: its share of each step"
    )
    file_timeout_s: float = Field(
        default=300.0, gt=0, le=3600, description="deadline of a file translation (504 when passed)"
    )
    download_ttl_s: float = Field(
        default=3600.0, gt=0, le=7 * 86400, description="LibreTranslate: a translated file stays downloadable this long"
    )
    public_url: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s/]+(/[^\s]*)?$",
        description="LibreTranslate: the base of download URLs (https://mt.example.org); unset: the request's "
        "X-Forwarded-Proto/-Host/-Prefix headers, else its Host",
    )

    @field_validator("providers")
    @classmethod
    def _providers_not_empty(cls, value: str) -> str:
        if not [p for p in value.split(",") if p.strip()]:
            raise ValueError("name at least one execution provider, e.g. cpu")
        return value

    @model_validator(mode="after")
    def _queue_holds_a_request(self) -> Settings:
        if self.max_queue < self.max_texts:
            raise ValueError(f"max_queue ({self.max_queue}) must be at least max_texts ({self.max_texts})")
        return self

    @property
    def provider_list(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.providers.split(",") if p.strip())


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """`SERVE_*` variables that name no setting (a typo would otherwise be ignored silently)."""
    prefix = Settings.model_config.get("env_prefix", "")
    known = {(prefix + name).upper() for name in Settings.model_fields}
    return sorted(k for k in environ if k.upper().startswith(prefix) and k.upper() not in known)
