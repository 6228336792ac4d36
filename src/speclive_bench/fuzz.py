"""Property-based fuzzing of the server's REST API from its own OpenAPI schema (schemathesis).

``fuzz_rest(app, url, examples)`` generates requests for every operation of the app's schema,
valid ones (schemathesis' positive mode) and invalid ones (negative mode: wrong types, missing
fields, out-of-range values), sends them over loopback to a running server and checks the
invariants a client relies on (most generated requests name a model and voice the server
serves, or OpenAI's names for them, and some uploads are a real WAV, so requests get past the
lookups and reach the models):

- no response is a 5xx;
- every 4xx body is an OpenAI-style error object (``{"error": {"message", "type", "param",
  "code"}}`` with a non-empty message);
- ``GET /health`` answers 200 after each operation's batch (the server is still serving).

Used by ``make test`` with a few dozen examples per operation and by the reliability benchmark
with thousands. Requests carry the API key when one is given.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

ERROR_FIELDS = {"message", "type", "param", "code"}


@dataclass
class OperationReport:
    operation: str
    requests: int = 0
    statuses: Counter = field(default_factory=Counter)
    #: invariant violations: (why, method + path, status, body head)
    violations: list[tuple[str, str, int, str]] = field(default_factory=list)
    seconds: float = 0.0
    healthy_after: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "operation": self.operation,
            "requests": self.requests,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "violations": [list(v) for v in self.violations],
            "seconds": round(self.seconds, 2),
            "healthy_after": self.healthy_after,
        }


def error_object_problem(status: int, body: bytes) -> str | None:
    """Why a response breaks the invariants, or None."""
    if status >= 500:
        return "server error"
    if status < 400:
        return None
    try:
        err = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return "error body is not an OpenAI error object"
    if not isinstance(err, dict) or set(err) != ERROR_FIELDS:
        return "error object has the wrong fields"
    if not isinstance(err["message"], str) or not err["message"]:
        return "error object has no message"
    return None


def fuzz_rest(
    app: Any,
    url: str,
    examples: int,
    api_key: str | None = None,
    seed: int = 0,
    skip: tuple[str, ...] = (),
    progress=None,
) -> list[OperationReport]:
    """Fuzz every operation of ``app.openapi()`` against the server at ``url``.

    ``examples``: generated cases per operation and mode (positive and negative; an operation
    with no invalid input gets twice as many valid ones); ``skip``:
    paths left out; ``progress(op_label, n)`` is called after each request.
    """
    import schemathesis
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_dict(app.openapi())
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    reports: list[OperationReport] = []
    with httpx.Client(base_url=url, headers=headers, timeout=120) as health:
        # the served models and OpenAI's names for them (a string field alone rarely hits one)
        models = [m["id"] for m in health.get("/v1/models").json()["data"]]
        models += ["whisper-1", "tts-1", "gpt-4o-mini"]
        names = {
            "model": models,
            "voice": ["alloy", "echo", "nova", "piper-joe-medium"],
            "response_format": ["wav", "pcm", "json", "text", "verbose_json"],
        }
        for result in schema.get_all_operations():
            op = result.ok()
            if op.path in skip:
                continue
            rep = OperationReport(f"{op.method.upper()} {op.path}")
            t0 = time.perf_counter()
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                run = _runner(op, mode, rep, url, headers, examples, seed, names, progress)
                try:
                    run()
                except Unsatisfiable:  # nothing invalid to send (an operation without inputs)
                    pass
            # an operation with nothing invalid to send gets more valid requests instead
            extra = 1
            while rep.requests < 2 * examples and extra <= 4:
                left = min(examples, 2 * examples - rep.requests)
                _runner(op, GenerationMode.POSITIVE, rep, url, headers, left, seed + extra, names, progress)()
                extra += 1
            rep.seconds = time.perf_counter() - t0
            rep.healthy_after = health.get("/health").status_code == 200
            reports.append(rep)
    return reports


def _tone_wav(seconds: float = 0.5, rate: int = 16_000) -> bytes:
    """A short valid WAV (a tone), for the ``file`` field of some transcription requests."""
    import io
    import wave

    import numpy as np

    t = np.arange(int(seconds * rate)) / rate
    pcm = (0.2 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def _runner(
    op, mode, rep: OperationReport, url: str, headers: dict, examples: int, seed: int, names: dict, progress
):
    """A hypothesis test sending ``examples`` cases of ``op`` in ``mode`` and checking each."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed
    from hypothesis import strategies as st

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @hseed(seed)
    @given(
        case=op.as_strategy(generation_mode=mode),
        pick=st.fixed_dictionaries({k: st.sampled_from([*v, None]) for k, v in names.items()}),
    )
    def run(case, pick) -> None:
        # most requests name what the server serves, so they get past the lookups
        body = case.body if isinstance(case.body, dict) else {}
        for key, value in pick.items():
            if value is None:
                continue
            if isinstance(body.get(key), str):
                body[key] = value
            if key == "model" and isinstance((case.path_parameters or {}).get("model"), str):
                case.path_parameters["model"] = value
        # a real WAV where the body is a form upload (a JSON body may carry a "file" key of
        # its own: bytes cannot go there, and the server sees what the schema generated)
        multipart = (case.media_type or "").startswith("multipart/")
        if multipart and "file" in body and pick.get("voice") is not None:
            body["file"] = _tone_wav()
        resp = case.call(base_url=url, headers=headers, timeout=120)
        rep.requests += 1
        rep.statuses[resp.status_code] += 1
        why = error_object_problem(resp.status_code, resp.content)
        if why is not None:
            head = resp.content[:200].decode("utf-8", "replace")
            rep.violations.append((why, f"{case.method} {case.formatted_path}", resp.status_code, head))
        if progress is not None:
            progress(rep.operation, rep.requests)

    return run
