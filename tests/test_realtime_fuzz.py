"""``WS /v1/realtime`` under fuzzing and hostile clients: errors or clean closes, never a crash.

A short run of the realtime fuzzer (``speclive_bench.fuzz_realtime``) against a real server
(SmolLM2 on llama.cpp, whisper-tiny.en, Piper) with tight limits so that each one is reached in
seconds: generated event scripts (broken events, wrong types, binary frames, base64 that is not
audio, real speech, disconnects without a close frame), then a frame over the size limit, an
event flood, a client that stops reading, one that leaves mid-answer, a turn over the length
limit and an idle client. The server must log no error, and leave no session or task behind.
The benchmark (``speclive bench fuzz``) sends ten thousand events and more.
"""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("websockets")
pytest.importorskip("hypothesis")
pytest.importorskip("llama_cpp")

from speclive.server.app import create_app  # noqa: E402
from speclive.server.config import ServerConfig  # noqa: E402
from speclive.server.inproc import serve_in_thread  # noqa: E402
from speclive.server.ratelimit import TokenBucket  # noqa: E402
from speclive_bench.fuzz_realtime import fuzz_realtime  # noqa: E402
from speclive_bench.reliability import ErrorLog  # noqa: E402

KEY = "fuzz-key"


def test_token_bucket_allows_bursts_then_the_rate():
    now = [0.0]
    bucket = TokenBucket(rate=10, burst=20, clock=lambda: now[0])
    assert sum(bucket.take() for _ in range(25)) == 20  # the burst, then empty
    now[0] += 0.5  # five tokens back
    assert sum(bucket.take() for _ in range(10)) == 5
    now[0] += 100  # never more than the burst
    assert sum(bucket.take() for _ in range(30)) == 20
    with pytest.raises(ValueError):
        TokenBucket(rate=0, burst=1)


def test_fuzzed_realtime_events_and_hostile_clients(llama_smol):
    from speclive.asr.transcribe import TranscribeConfig, Transcriber
    from speclive.server.audio import resample
    from speclive.tts.piper import PiperTTS

    tts = PiperTTS("piper-joe-medium")
    live = Transcriber(
        TranscribeConfig(model="whisper-tiny.en", method="specasr", draft="self:1", target_audio_margin_s=1.0)
    )
    config = ServerConfig(
        model="smollm2-135m-instruct",
        asr_model="whisper-tiny.en",
        api_key=KEY,
        max_sessions=3,
        max_turn_s=4.0,
        realtime_idle_s=2.0,
        realtime_events_per_s=500.0,
        realtime_send_timeout_s=2.0,
    )
    app = create_app(config, backend=llama_smol, tts=tts, live_transcriber=live)
    spoken = tts.synthesize("What is the capital of France?")
    speech = resample(spoken.samples, spoken.sample_rate, 16_000)
    errors = ErrorLog()
    loggers = [logging.getLogger(n) for n in ("speclive", "uvicorn.error")]
    for lg in loggers:
        lg.addHandler(errors)
    try:
        with serve_in_thread(app) as url:
            report = fuzz_realtime(url, config, events=200, api_key=KEY, speech=speech, batch_events=100)
    finally:
        for lg in loggers:
            lg.removeHandler(errors)
    r = report.to_dict()
    print(r)
    assert r["generated_events"] >= 200 and r["scripts"] >= 10
    assert not r["violations"], r["violations"]
    assert set(r["scenarios"].values()) == {"ok"}, r["scenarios"]
    assert len(r["scenarios"]) == 6
    # the generated scripts did reach the server's input checks, not only its JSON parser
    assert {"invalid_json", "unknown_event", "binary_frame"} <= set(r["error_codes"]), r["error_codes"]
    assert r["after"]["sessions"] == 0
    assert not errors.records, errors.records[:3]
