"""``speclive serve`` end to end: the real app under uvicorn, driven by the official OpenAI SDK.

One server for the module: SmolLM2-135M on llama.cpp (n_ctx 2048, n-gram drafter), SpecASR
on whisper-tiny.en with a one-layer self-draft, the Piper voice. Bad input goes through httpx.
A second, model-free server with a scripted chat engine checks what must be deterministic:
503 when full, a disconnect cancelling the generation, a 500 that hides its cause.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
import time
import wave
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")
pytest.importorskip("llama_cpp")

import httpx  # noqa: E402
from openai import OpenAI  # noqa: E402

from speclive.decoder import GenerationStats  # noqa: E402
from speclive.server.app import create_app  # noqa: E402
from speclive.server.chat import ChatDelta, ChatDone  # noqa: E402
from speclive.server.config import ServerConfig  # noqa: E402
from speclive.server.inproc import serve_in_thread  # noqa: E402
from speclive_bench.reference import greedy_reference  # noqa: E402

KEY = "test-key-123"
SMALL = "smollm2-135m-instruct"
SPOKEN = "Hello world, the weather is sunny today."
#: llama.cpp: the largest reference top-2 logit gap at which a flip is blamed on numerics
from speclive.backends.base import NEAR_TIE_GAP as NEAR_TIE  # noqa: E402


def running(app) -> contextlib.AbstractContextManager[str]:
    """Serve ``app`` with uvicorn on a free local port in a thread; yields the base URL."""
    return serve_in_thread(app)


@pytest.fixture(scope="module")
def srv(llama_smol):
    from speclive.asr.transcribe import TranscribeConfig, Transcriber
    from speclive.tts.piper import PiperTTS

    tts = PiperTTS("piper-joe-medium", varied=False)
    transcriber = Transcriber(TranscribeConfig(model="whisper-tiny.en", method="specasr", draft="self:1"))
    config = ServerConfig(
        model=SMALL,
        asr_model="whisper-tiny.en",
        asr_draft="self:1",
        asr_step_s=2.0,
        api_key=KEY,
        max_sessions=3,
        max_body_bytes=1_000_000,
        max_tokens=256,
    )
    app = create_app(config, backend=llama_smol, transcriber=transcriber, tts=tts)
    with running(app) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)
        http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
        yield SimpleNamespace(url=url, app=app, client=client, http=http, tts=tts, backend=llama_smol)
        http.close()


def _ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _err(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code is not None:
        assert err["code"] == code, err
    return err


def _live(srv) -> int:
    return srv.app.state.speclive.sessions.live


def _metric(http: httpx.Client, name: str) -> float:
    lines = http.get("/metrics").text.splitlines()
    return next((float(x.split()[-1]) for x in lines if x.split(" ")[0] == name), 0.0)


def _wait_idle(srv, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while _live(srv) and time.time() < deadline:
        time.sleep(0.05)
    assert _live(srv) == 0


# ---- chat ------------------------------------------------------------------------------------
def test_chat_stream_equals_non_stream_with_usage(srv):
    msgs = _ask("What is the capital of France? Answer in one sentence.")
    whole = srv.client.chat.completions.create(model=SMALL, messages=msgs, max_tokens=32, temperature=0)
    text = whole.choices[0].message.content
    assert "Paris" in text and whole.object == "chat.completion" and whole.model == SMALL
    assert whole.choices[0].finish_reason in ("stop", "length")
    u = whole.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 32
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    extra = u.model_extra["speclive"]
    assert extra["target_forwards"] >= 1 and extra["mean_accepted"] > 0
    assert {"drafted", "accepted"} <= set(extra)

    chunks = list(
        srv.client.chat.completions.create(
            model="default",
            messages=msgs,
            max_tokens=32,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == u.completion_tokens
    if streamed != text:  # llama.cpp: both may depart from greedy at a near tie only
        for answer in (streamed, text):
            _assert_greedy(srv, msgs[0]["content"], answer, 32)


def test_chat_stop_length_and_models(srv):
    r = srv.client.chat.completions.create(
        model=SMALL, messages=_ask("Count from 1 to 20, separated by commas."), max_tokens=8
    )
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8
    r = srv.client.chat.completions.create(
        model=SMALL, messages=_ask("Count from 1 to 20, separated by commas."), stop=["5"], max_tokens=64
    )
    assert r.choices[0].finish_reason == "stop" and "5" not in r.choices[0].message.content
    r = srv.client.chat.completions.create(  # sampling: speculative sampling over the drafts
        model=SMALL, messages=_ask("Name a color."), max_tokens=8, temperature=0.8, seed=7
    )
    assert r.choices[0].message.content and r.usage.completion_tokens <= 8

    ids = {m.id for m in srv.client.models.list().data}
    assert {SMALL, "default", "whisper-tiny.en", "whisper-1", "gpt-4o-transcribe"} <= ids
    assert {"piper-joe-medium", "tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= ids
    assert srv.client.models.retrieve("whisper-1").model_extra["root"] == "whisper-tiny.en"


def _reference(srv, prompt: str | list[dict], n: int) -> tuple[list[int], list[float]]:
    """``decoder.greedy_reference`` (plain greedy with each step's top-2 logit gap) of a user
    message or a conversation, run on the server's LLM worker (the backend is not thread-safe)."""
    b = srv.backend
    ids = b.tokenizer.chat(_ask(prompt) if isinstance(prompt, str) else prompt)
    return srv.app.state.speclive.worker("chat").submit(greedy_reference, b, ids, n).result(120)


#: code edits: the answer copies the prompt, so the n-gram drafter has something to propose
EXACT_PROMPTS = [
    "Rewrite this function with type hints:\ndef add(a, b):\n    return a + b\n",
    "Fix the bug: def is_even(n):\n    return n % 2 == 1\n",
    "Add a docstring to this function:\ndef area(r):\n    return 3.14159 * r * r\n",
]


def _assert_greedy(srv, prompt: str | list[dict], text: str, n: int) -> None:
    """``text`` is the target's greedy answer, or departs from it only at a near tie."""
    tok = srv.backend.tokenizer
    ref, gaps = _reference(srv, prompt, n)
    ref_text = tok.decode(ref)
    if text != ref_text:
        at = next((i for i, (a, b) in enumerate(zip(text, ref_text, strict=False)) if a != b), None)
        at = min(len(text), len(ref_text)) if at is None else at
        # the reference token that holds the first differing character; when that character
        # starts it, the answer may have taken a longer token one step earlier (" **" for " *"
        # then " r"): the flip is at either token, and the text alone cannot tell which
        j = next(k for k in range(len(ref) + 1) if k == len(ref) or len(tok.decode(ref[: k + 1])) > at)
        steps = [j, j - 1] if j > 0 and len(tok.decode(ref[:j])) == at else [j]
        flips = [k for k in steps if k < len(gaps) and gaps[k] < NEAR_TIE]
        assert flips, (text, ref_text, {k: gaps[k] for k in steps if k < len(gaps)})


def _stream_text(srv, prompt: str, n: int) -> tuple[str, object]:
    chunks = list(
        srv.client.chat.completions.create(
            model=SMALL,
            messages=_ask(prompt),
            max_tokens=n,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks[-1].usage


def test_streamed_speculative_chat_is_greedy_output(srv):
    """The n-gram drafter through the server = plain greedy decoding of the target (on llama.cpp
    a flip is allowed only at a near tie of the reference, as in test_exactness)."""
    n = 48
    accepted = 0
    for prompt in EXACT_PROMPTS:
        text, usage = _stream_text(srv, prompt, n)
        _assert_greedy(srv, prompt, text, n)
        assert usage.model_extra["speclive"]["target_forwards"] <= usage.completion_tokens + 1
        accepted += usage.model_extra["speclive"]["accepted"]
    assert accepted > 0  # the drafts were used, not just proposed


def test_concurrent_streams_keep_their_own_state(srv):
    """Streams generated at the same time (interleaved step by step on the worker) each give
    their own prompt's answer: no cache is shared between sessions."""
    n = 32
    batches = _metric(srv.http, "speclive_verify_batch_size_count")
    passes = _metric(srv.http, "speclive_verify_batch_size_sum")
    worker = srv.app.state.speclive.worker("chat")
    gate = threading.Event()
    worker.submit(gate.wait)  # the three start together: a copy drafted whole ends a stream early
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(lambda p: _stream_text(srv, p, n)[0], p) for p in EXACT_PROMPTS]
        deadline = time.monotonic() + 60
        while worker.pending < len(EXACT_PROMPTS) and time.monotonic() < deadline:
            time.sleep(0.01)
        gate.set()
        texts = [f.result() for f in futures]
    for prompt, text in zip(EXACT_PROMPTS, texts, strict=True):
        _assert_greedy(srv, prompt, text, n)
    _wait_idle(srv)
    # the streams' verification passes ran together: fewer target decodes than passes (not 3 per
    # decode: the streams end after different numbers of passes)
    batches = _metric(srv.http, "speclive_verify_batch_size_count") - batches
    passes = _metric(srv.http, "speclive_verify_batch_size_sum") - passes
    assert batches and passes / batches > 1.3, (batches, passes)


def test_a_long_prompt_is_prefilled_in_chunks_beside_the_other_streams(srv, monkeypatch):
    """A prompt longer than a prefill chunk does not hold the worker for its whole prefill:
    its chunks run in the same ``extend_many`` as another stream's verification passes, and
    both answers are still the greedy ones."""
    from speclive.server import chat as chat_mod

    engine = srv.app.state.speclive._engines["chat"]
    calls: list[list[bool]] = []  # per extend_many: which payloads are prompt chunks (no tree)
    fused: list[int] = []  # the rows skipped by verification passes (a prompt tail in front)
    real = engine.verify_together

    def recording(passes):
        calls.append([p[2] is None for p in passes])
        fused.extend(p[3] for p in passes if p[2] is not None and p[3])
        return real(passes)

    monkeypatch.setattr(engine, "verify_together", recording)
    monkeypatch.setattr(chat_mod, "PREFILL_CHUNK", 64)
    long_prompt = "Summarize these notes in one sentence:\n" + "\n".join(
        f"- item {i}: the {w} arrived at {i + 7} o'clock"
        for i, w in enumerate(["parcel", "train", "guest"] * 6)
    )
    assert len(srv.backend.tokenizer.chat(_ask(long_prompt))) > 4 * 64
    # an answer no drafter here has seen (one it could copy would be over in a few passes)
    other, n_other, n = "Name twenty animals, one per line, each with a short fact.", 160, 24
    answering = threading.Event()

    def other_stream() -> str:
        parts = []
        stream = srv.client.chat.completions.create(
            model=SMALL, messages=_ask(other), max_tokens=n_other, stream=True
        )
        for c in stream:
            if c.choices and c.choices[0].delta.content:
                parts.append(c.choices[0].delta.content)
                answering.set()
        return "".join(parts)

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(other_stream)
        assert answering.wait(60)  # the other answer is being generated when the long prompt comes
        long = pool.submit(_stream_text, srv, long_prompt, n)
        texts = [first.result(), long.result()[0]]
    _assert_greedy(srv, other, texts[0], n_other)
    _assert_greedy(srv, long_prompt, texts[1], n)
    chunks = [c for c in calls if True in c]
    assert len(chunks) >= 3  # the long prompt in 64-token chunks
    assert any(False in c for c in chunks), calls  # ... beside the other answer's passes
    # the prompts' last pieces rode in their first verification passes, without their rows
    assert len(fused) >= 2 and max(fused) <= 64, fused
    _wait_idle(srv)


@pytest.fixture
def cached(srv):
    """A second server on the same SmolLM2 backend with the prompt cache on (it is opt-in), for
    one test: the module's server stays idle meanwhile (the backend is not thread-safe), and the
    parked states are gone before the next test."""
    app = create_app(ServerConfig(model=SMALL, max_tokens=256, prompt_cache=True), backend=srv.backend)
    with running(app) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)
        http = httpx.Client(base_url=url, timeout=120)
        yield SimpleNamespace(url=url, app=app, client=client, http=http, backend=srv.backend)
        http.close()
    # shut down: the parked states were released, the shared backend is left as it was given
    assert len(app.state.speclive._engines["chat"].prompt_cache) == 0
    assert not srv.backend.offload_parked


def test_a_next_turn_starts_from_the_previous_requests_cache(cached):
    """The prompt cache: a conversation's next request reuses the cache the previous one left
    (its prompt and answer are not prefilled again), and still answers greedily."""
    srv = cached
    first = _ask("Name three primary colors, in one short sentence.")
    offloads = _metric(srv.http, "speclive_prompt_cache_offloads_total")
    r1 = srv.client.chat.completions.create(model=SMALL, messages=first, max_tokens=24, temperature=0)
    _wait_idle(srv)
    # the finished request's state waits in host memory, its cells free for the others (the
    # worker parks it as it closes the generation, which may come after the response)
    deadline = time.time() + 30
    while _metric(srv.http, "speclive_prompt_cache_offloads_total") == offloads and time.time() < deadline:
        time.sleep(0.05)
    assert _metric(srv.http, "speclive_prompt_cache_offloads_total") - offloads == 1
    reloads = _metric(srv.http, "speclive_prompt_cache_reloads_total")
    hits = _metric(srv.http, "speclive_prompt_cache_hits_total")
    reused = _metric(srv.http, "speclive_prompt_cache_reused_tokens_total")
    turn2 = [
        *first,
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": "Which of them is the warmest?"},
    ]
    r2 = srv.client.chat.completions.create(model=SMALL, messages=turn2, max_tokens=24, temperature=0)
    _wait_idle(srv)
    assert _metric(srv.http, "speclive_prompt_cache_hits_total") - hits == 1
    assert _metric(srv.http, "speclive_prompt_cache_reloads_total") - reloads == 1  # written back
    got = _metric(srv.http, "speclive_prompt_cache_reused_tokens_total") - reused
    assert got >= r1.usage.prompt_tokens + r1.usage.completion_tokens - 2, (got, r1.usage)
    assert got < r2.usage.prompt_tokens
    _assert_greedy(srv, turn2, r2.choices[0].message.content, 24)
    assert _metric(srv.http, "speclive_prompt_cache_states") >= 1
    # the first prompt again: it starts from a fork of the parked state that holds it
    hits = _metric(srv.http, "speclive_prompt_cache_hits_total")
    again = srv.client.chat.completions.create(model=SMALL, messages=first, max_tokens=24, temperature=0)
    _wait_idle(srv)
    assert _metric(srv.http, "speclive_prompt_cache_hits_total") - hits == 1
    _assert_greedy(srv, first, again.choices[0].message.content, 24)


def test_the_prompt_cache_is_off_by_default(srv):
    assert "speclive_prompt_cache_hits_total" not in srv.http.get("/metrics").text


def test_client_disconnect_mid_stream(srv):
    body = {
        "model": SMALL,
        "messages": _ask("Write a long story about a dragon who learns to cook."),
        "max_tokens": 256,
        "stream": True,
    }
    cancelled = _metric(srv.http, "speclive_cancelled_generations_total")
    with srv.http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [next(lines) for _ in range(3)]
        assert got[0].startswith("data: ")
    # the connection is closed: the generation is cancelled and its session freed
    _wait_idle(srv)
    assert _metric(srv.http, "speclive_cancelled_generations_total") == cancelled + 1
    r = srv.client.chat.completions.create(model=SMALL, messages=_ask("Say hi."), max_tokens=4)
    assert r.choices[0].message.content


# ---- audio -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def spoken_wav(srv, tmp_path_factory) -> bytes:
    from speclive.tts.base import write_wav

    path = tmp_path_factory.mktemp("audio") / "spoken.wav"
    write_wav(path, srv.tts.synthesize(SPOKEN))
    return path.read_bytes()


def _words(text: str) -> set[str]:
    return {w.strip(".,!?").lower() for w in text.split()}


def test_transcription_json_text_and_stream(srv, spoken_wav):
    r = srv.client.audio.transcriptions.create(model="whisper-1", file=("spoken.wav", spoken_wav))
    assert {"hello", "world", "weather", "sunny"} <= _words(r.text)

    events = list(
        srv.client.audio.transcriptions.create(
            model="gpt-4o-transcribe", file=("spoken.wav", spoken_wav), stream=True
        )
    )
    kinds = [e.type for e in events]
    assert kinds[-1] == "transcript.text.done" and "transcript.text.delta" in kinds
    deltas = "".join(e.delta for e in events if e.type == "transcript.text.delta")
    assert deltas == events[-1].text and {"weather", "sunny"} <= _words(deltas)


def test_speech_wav_and_pcm(srv):
    audio = srv.client.audio.speech.create(
        model="tts-1", voice="alloy", input="Good morning.", response_format="wav"
    )
    with wave.open(io.BytesIO(audio.content)) as w:
        assert w.getnchannels() == 1 and w.getsampwidth() == 2 and w.getframerate() == srv.tts.sample_rate
        assert w.getnframes() > 0.3 * w.getframerate()
    r = srv.http.post(
        "/v1/audio/speech", json={"model": "tts-1", "voice": "nova", "input": "Hi.", "response_format": "pcm"}
    )
    assert r.status_code == 200 and r.headers["x-sample-rate"] == "24000" and len(r.content) % 2 == 0
    err = _err(
        srv.http.post(
            "/v1/audio/speech",
            json={"model": "tts-1", "voice": "alloy", "input": "Hi.", "response_format": "mp3"},
        ),
        400,
    )
    assert "mp3" in err["message"] and err["param"] == "response_format"
    _err(srv.http.post("/v1/audio/speech", json={"model": "tts-1", "voice": "bob", "input": "Hi."}), 400)


# ---- bad input -------------------------------------------------------------------------------
def test_malformed_json_and_wrong_types(srv):
    r = srv.http.post(
        "/v1/chat/completions",
        content=b'{"model": "default", "messages": [',
        headers={"Content-Type": "application/json"},
    )
    assert _err(r, 400, "invalid_json")["type"] == "invalid_request_error"
    err = _err(srv.http.post("/v1/chat/completions", json={"model": "default", "messages": "hi"}), 400)
    assert err["param"] == "messages" and err["type"] == "invalid_request_error"
    err = _err(
        srv.http.post(
            "/v1/chat/completions", json={"model": "default", "messages": _ask("hi"), "max_tokens": "lots"}
        ),
        400,
    )
    assert err["param"] == "max_tokens"
    _err(
        srv.http.post("/v1/chat/completions", json={"model": "default", "messages": _ask("hi"), "n": 2}), 400
    )
    _err(srv.http.post("/v1/nothing-here"), 404, "not_found")


def test_unknown_model_is_404(srv):
    import openai

    with pytest.raises(openai.NotFoundError) as e:
        srv.client.chat.completions.create(model="gpt-4o", messages=_ask("hi"))
    assert e.value.code == "model_not_found"
    _err(
        srv.http.post("/v1/audio/speech", json={"model": "gpt-4o", "voice": "alloy", "input": "x"}),
        404,
        "model_not_found",
    )
    # names that are paths never reach the file system: only the served names resolve
    from speclive.models.install import installed_path

    real_file = str(installed_path("smollm2-135m-instruct"))
    for name in (real_file, "../../../../etc/passwd", "/etc/passwd", "~/.cache/speclive"):
        body = {"model": name, "messages": _ask("hi"), "max_tokens": 1}
        _err(srv.http.post("/v1/chat/completions", json=body), 404, "model_not_found")
        speech = {"model": "tts-1", "voice": name, "input": "x"}
        assert srv.http.post("/v1/audio/speech", json=speech).status_code in (400, 404)


def test_context_overflow_is_400(srv):
    long = "word " * 3000
    err = _err(srv.http.post("/v1/chat/completions", json={"model": SMALL, "messages": _ask(long)}), 400)
    assert err["code"] == "context_length_exceeded"
    r = srv.http.post("/v1/chat/completions", json={"model": SMALL, "messages": _ask(long), "stream": True})
    _err(r, 400, "context_length_exceeded")
    _wait_idle(srv)


def test_oversized_body_is_413(srv):
    big = {"model": SMALL, "messages": _ask("x" * 1_200_000)}
    _err(srv.http.post("/v1/chat/completions", json=big), 413, "request_too_large")

    def chunks():  # no Content-Length: counted while read
        yield b'{"model": "default", "messages": [{"role": "user", "content": "'
        for _ in range(40):
            yield b"x" * 50_000
        yield b'"}]}'

    r = srv.http.post("/v1/chat/completions", content=chunks(), headers={"Content-Type": "application/json"})
    _err(r, 413, "request_too_large")


def test_non_audio_upload_is_400(srv):
    r = srv.http.post(
        "/v1/audio/transcriptions",
        files={"file": ("notes.wav", b"this is not audio")},
        data={"model": "whisper-1"},
    )
    err = _err(r, 400, "invalid_audio")
    assert err["param"] == "file"
    r = srv.http.post("/v1/audio/transcriptions", data={"model": "whisper-1", "file": "text"})
    _err(r, 400)


def test_auth(srv):
    assert httpx.get(f"{srv.url}/health").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.get(f"{srv.url}/v1/models", headers=headers)
        assert _err(r, 401, "invalid_api_key")
        assert r.headers["www-authenticate"] == "Bearer"
    _err(httpx.get(f"{srv.url}/metrics"), 401)
    import openai

    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=f"{srv.url}/v1", api_key="nope", max_retries=0).models.list()
    # same-origin only: no CORS headers for a page of another origin, preflight or not
    evil = {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}
    for r in (
        srv.http.get("/v1/models", headers={"Origin": evil["Origin"]}),
        srv.http.options("/v1/chat/completions", headers=evil),
    ):
        assert not any(h.startswith("access-control-") for h in r.headers), r.headers


def test_metrics(srv):
    srv.client.chat.completions.create(model=SMALL, messages=_ask("Say yes."), max_tokens=4)
    # a refused and a malformed request of its own: under xdist the module's other tests may
    # run on another worker, against another server
    _err(httpx.get(f"{srv.url}/v1/models"), 401)
    _err(srv.http.post("/v1/chat/completions", json={"model": "default", "messages": "hi"}), 400)
    text = srv.http.get("/metrics").text
    assert 'speclive_requests_total{endpoint="/v1/chat/completions",method="POST",status="200"}' in text
    assert 'status="401"' in text and 'status="400"' in text
    for name in (
        "speclive_generated_tokens_total",
        "speclive_accepted_tokens_total",
        "speclive_target_forwards_total",
        "speclive_request_seconds_bucket",
        "speclive_time_to_first_token_seconds_count",
        "speclive_live_sessions",
        "speclive_kv_cell_evictions_total",
        "speclive_kv_restores_total",
    ):
        assert name in text
    assert _metric(srv.http, "speclive_generated_tokens_total") > 0
    # the llama.cpp backend's own counts, read at the scrape
    assert _metric(srv.http, "speclive_kv_cell_evictions_total") == srv.backend.cell_evictions
    assert _metric(srv.http, "speclive_kv_restores_total") == srv.backend.restores


# ---- a scripted engine: full server, errors, disconnects ------------------------------------------
class ScriptedChat:
    """A chat engine without a model: ``forever`` never ends, ``boom`` fails with a secret."""

    name = "scripted"
    n_ctx = 1000
    max_parallel = None

    def __init__(self):
        self.closed = threading.Event()

    def generate(self, messages, params):
        what = messages[-1]["content"]
        try:
            if what == "boom":
                raise RuntimeError("secret internal detail")
            n = 0
            while what == "forever" or n < 3:
                n += 1
                time.sleep(0.005)
                yield ChatDelta("ab", 1, 0, 0)
            yield ChatDone(
                GenerationStats(prompt_tokens=1, new_tokens=n, target_forwards=n, finish_reason="eos")
            )
        finally:
            if what == "forever":
                self.closed.set()


@pytest.fixture(scope="module")
def scripted():
    engine = ScriptedChat()
    app = create_app(ServerConfig(model="scripted", max_sessions=1, queue_wait_s=0), chat=engine)
    with running(app) as url:
        yield SimpleNamespace(url=url, app=app, engine=engine)


def test_busy_server_503_then_disconnect_cancels(scripted):
    body = {"model": "scripted", "messages": _ask("forever"), "stream": True}
    with httpx.Client(base_url=scripted.url, timeout=30) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()
            assert json.loads(next(lines)[6:])["choices"][0]["delta"]["role"] == "assistant"
            busy = http.post("/v1/chat/completions", json={"model": "scripted", "messages": _ask("hi")})
            assert _err(busy, 503, "too_many_sessions")["type"] == "server_error"
            assert busy.headers["retry-after"] == "1"
        assert scripted.engine.closed.wait(10)  # the generator was closed on the worker
        deadline = time.time() + 10
        while scripted.app.state.speclive.sessions.live and time.time() < deadline:
            time.sleep(0.02)
        r = http.post("/v1/chat/completions", json={"model": "scripted", "messages": _ask("hi")})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ababab"
        assert r.json()["choices"][0]["finish_reason"] == "stop"
        assert "speclive_cancelled_generations_total 1.0" in http.get("/metrics").text


def test_a_full_server_queues_requests_in_order_then_refuses():
    engine = ScriptedChat()
    app = create_app(ServerConfig(model="scripted", max_sessions=1, queue_wait_s=3.0), chat=engine)
    body = {"model": "scripted", "messages": _ask("forever"), "stream": True}
    with running(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        done: list[tuple[int, float]] = []

        def ask(i: int) -> None:
            time.sleep(0.1 * i)  # arrive in order
            r = http.post("/v1/chat/completions", json={"model": "scripted", "messages": _ask("hi")})
            done.append((i, r.status_code))

        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()  # kept: a dropped iterator would close the stream
            next(lines)
            waiting = [threading.Thread(target=ask, args=(i,)) for i in range(1, 4)]
            for t in waiting:
                t.start()
            time.sleep(1.0)
            assert not done  # all three wait in line for the one slot
        for t in waiting:
            t.join(30)
        assert [i for i, _ in done] == [1, 2, 3] and all(code == 200 for _, code in done)  # FIFO
        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()
            next(lines)
            t0 = time.time()
            busy = http.post("/v1/chat/completions", json={"model": "scripted", "messages": _ask("hi")})
            assert busy.status_code == 503 and 2.5 < time.time() - t0 < 10  # waited its 3 s, then refused


def test_unexpected_error_is_500_without_details(scripted):
    with httpx.Client(base_url=scripted.url, timeout=30) as http:
        err = _err(
            http.post("/v1/chat/completions", json={"model": "scripted", "messages": _ask("boom")}), 500
        )
        assert err["type"] == "server_error" and "secret" not in err["message"]
        assert http.get("/health").json()["status"] == "ok"
        r = http.post("/v1/chat/completions", json={"model": "scripted", "messages": _ask("hi")})
        assert r.status_code == 200


def test_a_model_that_fails_to_load_is_503_and_the_server_stays_up():
    app = create_app(ServerConfig(model="/nonexistent/model.gguf"))  # lazy: loads on first use
    with running(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        body = {"model": "/nonexistent/model.gguf", "messages": _ask("hi")}
        err = _err(http.post("/v1/chat/completions", json=body), 503, "model_unavailable")
        assert "no such file" in err["message"]
        assert http.get("/health").json()["models"]["chat"] is None


def test_serve_cli_parses(capsys):
    import argparse

    from speclive.cli.serve import add_serve_parser, config_from_args

    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["serve", "--port", "8123", "--api-key", "k", "--max-sessions", "2", "--drafter", "none"]
    )
    cfg = config_from_args(args)
    assert (cfg.host, cfg.port, cfg.api_key, cfg.max_sessions, cfg.drafter) == (
        "127.0.0.1",
        8123,
        "k",
        2,
        "none",
    )
    assert cfg.preload and cfg.url == "http://127.0.0.1:8123"
    assert cfg.stream_draft and cfg.stream_partials == "target" and cfg.allow_origins == ()
    args = parser.parse_args(
        ["serve", "--no-stream-draft", "--stream-partials", "draft", "--allow-origin", "https://a.example"]
        + ["--allow-origin", "https://b.example"]
    )
    cfg = config_from_args(args)
    assert not cfg.stream_draft and cfg.stream_partials == "draft"
    assert cfg.allow_origins == ("https://a.example", "https://b.example")

    from speclive.cli import main

    with pytest.raises(SystemExit) as refused:  # refused before anything loads
        main(["serve", "--drafter", "hybrid-async"])
    assert refused.value.code == 2 and "hybrid-async" in capsys.readouterr().err
