"""The REST API fuzzed from its own OpenAPI schema: no 5xx, OpenAI-style errors, still serving.

A short run of the reliability fuzzer (``speclive_bench.fuzz``) against a real server (SmolLM2
on llama.cpp with chat completions capped at 4 tokens, whisper-tiny.en, Piper): a few dozen valid
and invalid requests per operation, with the API key on. The benchmark runs thousands.
"""

from __future__ import annotations

import pytest

pytest.importorskip("schemathesis")
pytest.importorskip("fastapi")
pytest.importorskip("llama_cpp")

from test_server import running  # noqa: E402

from speclive.server.app import create_app  # noqa: E402
from speclive.server.config import ServerConfig  # noqa: E402
from speclive_bench.fuzz import error_object_problem, fuzz_rest  # noqa: E402

KEY = "fuzz-key"


def test_error_object_problem_spots_each_violation():
    ok = b'{"error": {"message": "bad", "type": "invalid_request_error", "param": null, "code": null}}'
    assert error_object_problem(200, b"anything") is None
    assert error_object_problem(400, ok) is None
    assert error_object_problem(500, ok) == "server error"
    assert error_object_problem(422, b'{"detail": []}') == "error body is not an OpenAI error object"
    assert error_object_problem(400, b"<html>") == "error body is not an OpenAI error object"
    assert error_object_problem(400, b'{"error": {"message": "x"}}') == "error object has the wrong fields"
    assert error_object_problem(400, ok.replace(b'"bad"', b'""')) == "error object has no message"


def test_fuzzed_requests_get_no_5xx_and_openai_errors(llama_smol):
    from speclive.asr.transcribe import TranscribeConfig, Transcriber
    from speclive.tts.piper import PiperTTS

    config = ServerConfig(
        model="smollm2-135m-instruct",
        asr_model="whisper-tiny.en",
        asr_draft="self:1",
        api_key=KEY,
        max_tokens=4,
        max_speech_chars=64,
        max_body_bytes=200_000,
        max_audio_s=5.0,
    )
    transcriber = Transcriber(TranscribeConfig(model="whisper-tiny.en", method="specasr", draft="self:1"))
    app = create_app(config, backend=llama_smol, transcriber=transcriber, tts=PiperTTS("piper-joe-medium"))
    with running(app) as url:
        reports = fuzz_rest(app, url, examples=25, api_key=KEY)
    ops = {r.operation for r in reports}
    assert {"POST /v1/chat/completions", "POST /v1/audio/transcriptions", "POST /v1/audio/speech"} <= ops
    for r in reports:
        print(r.to_dict())
        # operations without inputs have one request to send; the others get many
        assert r.requests >= (10 if r.operation.startswith("POST") else 1), r.to_dict()
        assert not r.violations, r.to_dict()
        assert r.healthy_after, r.operation
    # the fuzzer reached both sides of the validation: requests served by the models, and refused
    for r in reports:
        if r.operation.startswith("POST"):
            refused = sum(v for k, v in r.statuses.items() if 400 <= k < 500)
            assert r.statuses[200] > 0 and refused > 0, r.to_dict()


def test_speech_input_with_control_characters_is_spoken_or_refused():
    from speclive.server.speech import speakable

    assert speakable("a\x00b\x1b[1mc\n") == "a b [1mc"
    assert speakable(" \x00\x07 ") == ""
