"""``WS /v1/realtime`` end to end: the official OpenAI SDK's realtime client talks to the server.

One server for the module: SmolLM2-135M on llama.cpp, whisper-tiny.en (one-layer self-draft) for
the realtime sessions, the Piper voice. A spoken question (Piper, resampled to 24 kHz, silence
after it) is streamed in 100 ms chunks at real-time pace; the answer must come back as audio.
Bad input and limits go through a raw ``websockets`` client (the SDK reconnects on its own), as
do the other session kinds and client events: live translation at 16 kHz, transcription with
``turn_detection: null`` ended by a commit, ``response.cancel``, a client leaving mid-answer.
The web page is driven in headless Chromium with a WAV as its fake microphone.
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")
pytest.importorskip("websockets")
pytest.importorskip("llama_cpp")

from openai import OpenAI  # noqa: E402
from test_server import running  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from speclive.server.app import create_app  # noqa: E402
from speclive.server.audio import pcm16, resample  # noqa: E402
from speclive.server.config import ServerConfig  # noqa: E402
from speclive.server.realtime_session import RealtimeSession  # noqa: E402

KEY = "rt-key"
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def rt(llama_smol):
    from speclive.asr.transcribe import TranscribeConfig, Transcriber
    from speclive.tts.piper import PiperTTS

    tts = PiperTTS("piper-joe-medium", varied=False)
    live_tr = Transcriber(
        TranscribeConfig(model="whisper-tiny.en", method="specasr", draft="self:1", target_audio_margin_s=1.0)
    )
    config = ServerConfig(
        model="smollm2-135m-instruct", asr_model="whisper-tiny.en", api_key=KEY, max_sessions=2
    )
    app = create_app(config, backend=llama_smol, tts=tts, live_transcriber=live_tr)
    spoken = tts.synthesize(QUESTION)
    x = resample(spoken.samples, spoken.sample_rate, 24_000)
    pad = np.zeros(int(0.4 * 24_000), np.float32)
    audio = np.concatenate([pad, x, np.zeros(int(1.5 * 24_000), np.float32)])
    with running(app) as url:
        yield url, audio, app


def _chunks(audio: np.ndarray, rate: int = 24_000, chunk_s: float = 0.1):
    n = int(rate * chunk_s)
    for i in range(0, len(audio), n):
        yield base64.b64encode(pcm16(audio[i : i + n])).decode("ascii")


def test_sdk_voice_turn(rt):
    url, audio, _app = rt
    speech_end = len(audio) - int(1.5 * 24_000)  # the fixture's audio ends in 1.5 s of silence
    ws_base = url.replace("http://", "ws://") + "/v1"
    client = OpenAI(base_url=f"{url}/v1", api_key=KEY, websocket_base_url=ws_base, max_retries=0)
    types: list[str] = []
    audio_bytes = 0
    transcript = answer = ""
    metrics: dict = {}
    with client.realtime.connect(model="speclive", max_retries=0) as conn:
        assert conn.recv().type == "session.created"
        # a longer end-of-turn silence (OpenAI's field) than the pause sent below
        conn.session.update(session={"turn_detection": {"type": "server_vad", "silence_duration_ms": 1200}})
        updated = conn.recv()
        assert updated.type == "session.updated", updated
        # the question and a pause (0.6 s of silence: more than the VAD's pause, less than the
        # end of turn), then no audio until the answer was speculated: a slow machine gets the
        # time it needs, and the end of the turn still comes after the speculation
        pause = speech_end + int(0.6 * 24_000)
        for b64 in _chunks(audio[:pause]):
            conn.input_audio_buffer.append(audio=b64)
            time.sleep(0.1)  # a microphone's pace
        # a recv() that would wait for ever (no speculation, no answer) ends with the connection
        watchdog = threading.Timer(150, conn.close)
        watchdog.start()
        deadline = time.time() + 120
        while time.time() < deadline:
            e = conn.recv()
            types.append(e.type)
            if e.type == "speclive.speculation":
                break
            if e.type == "error":
                pytest.fail(f"error event: {e}")
        for b64 in _chunks(audio[pause:]):
            conn.input_audio_buffer.append(audio=b64)
            time.sleep(0.1)
        while time.time() < deadline:
            e = conn.recv()
            types.append(e.type)
            if e.type == "conversation.item.input_audio_transcription.completed":
                transcript = e.transcript
            elif e.type == "response.output_audio.delta":
                audio_bytes += len(base64.b64decode(e.delta))
            elif e.type == "response.output_audio_transcript.done":
                answer = e.transcript
            elif e.type == "speclive.turn_metrics":
                metrics = e.to_dict()  # an event type the SDK does not know: its fields as sent
            elif e.type == "response.done":
                assert e.response.status == "completed"
                break
            elif e.type == "error":
                pytest.fail(f"error event: {e}")
        watchdog.cancel()
    for t in (
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "response.created",
        "response.done",
        "speclive.speculation",
        "speclive.turn_metrics",
    ):
        assert t in types, (t, types)
    # PredGen: the answer was speculated before the end of the turn was known
    assert types.index("speclive.speculation") < types.index("input_audio_buffer.committed")
    assert "capital" in transcript.lower() and "france" in transcript.lower(), transcript
    assert answer.strip(), "no answer text"
    assert audio_bytes > 2 * 24_000 * 0.3  # at least 0.3 s of 24 kHz PCM16
    assert types.index("input_audio_buffer.speech_started") < types.index("response.created")
    # per-turn latency: end of speech -> first answer audio, measured on the server's wall clock
    assert metrics.get("latency_s") is not None and 0 < metrics["latency_s"] < 60, metrics
    assert "france" in metrics.get("transcript", "").lower(), metrics


def _raw(url: str, **kw):
    return connect(url.replace("http://", "ws://") + "/v1/realtime", open_timeout=30, **kw)


def _recv_type(ws, want: str, timeout: float = 30) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        msg = json.loads(ws.recv(timeout=timeout))
        if msg["type"] == want:
            return msg
    raise AssertionError(f"no {want} event")


def test_bad_events_get_errors_and_the_session_goes_on(rt):
    url, _audio, _app = rt
    with _raw(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        _recv_type(ws, "session.created")
        cases = [
            ("{not json", "invalid_json"),
            ('"just a string"', "invalid_event"),
            (json.dumps({"type": "no.such.event"}), "unknown_event"),
            (json.dumps({"type": "input_audio_buffer.append", "audio": "%%%not base64"}), "invalid_audio"),
            (
                json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()}),
                "invalid_audio",
            ),
            (json.dumps({"type": "input_audio_buffer.append", "audio": 42}), "invalid_type"),
            (
                json.dumps({"type": "session.update", "session": {"speclive": {"mode": "karaoke"}}}),
                "invalid_value",
            ),
            (
                json.dumps({"type": "session.update", "session": {"input_audio_format": "g711_ulaw"}}),
                "invalid_value",
            ),
        ]
        for text, code in cases:
            ws.send(text)
            err = _recv_type(ws, "error")["error"]
            assert err["code"] == code and err["message"], (text, err)
        ws.send(b"\x00\x01binary")
        assert _recv_type(ws, "error")["error"]["code"] == "binary_frame"
        # still serving: a valid update is applied
        ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {"speclive": {"mode": "transcribe", "sample_rate": 16000}},
                }
            )
        )
        s = _recv_type(ws, "session.updated")["session"]
        assert s["speclive"]["mode"] == "transcribe" and s["speclive"]["sample_rate"] == 16000


def _wait_released(app, timeout: float = 30) -> None:
    """Until every session slot is free again (a closed session releases its slot after its
    compute loop's last worker turn)."""
    deadline = time.time() + timeout
    while app.state.speclive.sessions.live and time.time() < deadline:
        time.sleep(0.05)
    assert app.state.speclive.sessions.live == 0


def _collect(ws, until, timeout: float = 60) -> list[dict]:
    """Events until ``until(event)`` is true (that one included); fails on an error event."""
    out: list[dict] = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        msg = json.loads(ws.recv(timeout=max(0.1, deadline - time.time())))
        assert msg["type"] != "error", msg
        out.append(msg)
        if until(msg):
            return out
    raise AssertionError(f"timed out; got {[m['type'] for m in out]}")


def test_translation_session_at_16k(rt):
    """mode translate, 16 kHz input: the source transcript and stable / tentative translations."""
    url, audio24, _app = rt
    audio16 = resample(audio24, 24_000, 16_000)
    with _raw(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        _recv_type(ws, "session.created")
        ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {"speclive": {"mode": "translate", "target_lang": "de", "sample_rate": 16000}},
                }
            )
        )
        s = _recv_type(ws, "session.updated")["session"]
        assert s["speclive"]["mode"] == "translate" and s["speclive"]["sample_rate"] == 16000
        for b64 in _chunks(audio16, rate=16_000, chunk_s=0.2):
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64}))
            time.sleep(0.2)  # a microphone's pace: the translation runs while the user speaks
        events = _collect(ws, lambda m: m["type"] == "speclive.translation" and m["final"], timeout=90)
    types = [m["type"] for m in events]
    done = [m for m in events if m["type"] == "conversation.item.input_audio_transcription.completed"]
    assert done and "france" in done[-1]["transcript"].lower(), types
    updates = [m for m in events if m["type"] == "speclive.translation"]
    final = updates[-1]
    assert final["stable"].strip() and "france" in final["source"].lower(), final
    # while the user spoke, the translation in progress was shown as tentative text
    assert any(m["tentative"].strip() and not m["final"] for m in updates), updates
    assert "response.created" not in types  # a translation session does not answer


def test_semantic_vad_predicts_the_end_of_the_turn_and_can_be_switched_mid_session(rt):
    """``turn_detection: semantic_vad``: the session reports the end-of-turn prediction and
    answers; a bad eagerness is an error and the session goes on; back to server_vad."""
    url, audio24, _app = rt
    with _raw(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        _recv_type(ws, "session.created")

        def update(td: dict | None) -> dict:
            ws.send(json.dumps({"type": "session.update", "session": {"turn_detection": td}}))
            return json.loads(ws.recv(timeout=30))

        bad = update({"type": "semantic_vad", "eagerness": "eager"})
        assert bad["type"] == "error" and "eagerness" in bad["error"]["message"], bad
        s = update({"type": "semantic_vad", "eagerness": "high"})["session"]
        assert s["turn_detection"] == {"type": "semantic_vad", "eagerness": "high"}
        for b64 in _chunks(audio24):
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64}))
            time.sleep(0.1)
        events = _collect(ws, lambda m: m["type"] == "response.done", timeout=120)
        types = [m["type"] for m in events]
        preds = [m for m in events if m["type"] == "speclive.turn_prediction"]
        assert preds and preds[-1]["end"] and 0 <= preds[-1]["audio_p"] <= 1, types
        assert types.index("speclive.turn_prediction") < types.index("response.created")
        assert types.count("response.created") == 1
        s = update({"type": "server_vad", "silence_duration_ms": 700})["session"]
        assert s["turn_detection"] == {"type": "server_vad", "silence_duration_ms": 700}


def test_disconnect_mid_answer_frees_the_session(rt, llama_smol, monkeypatch):
    """The client leaves at the answer's first audio delta (beta event names, asked for by
    header): the answer's compute stops within one decoder step (target forward passes counted
    from when the server sees the client leave), the session is released and the next session
    and the REST API serve as before."""
    url, audio, app = rt
    # an earlier test's session may still be closing: its stop_compute must not be the one marked
    _wait_released(app)
    seen: dict[str, int] = {}
    stop = RealtimeSession.stop_compute

    def marking(self) -> None:
        seen.setdefault("forwards", llama_smol.forward_calls)
        stop(self)

    monkeypatch.setattr(RealtimeSession, "stop_compute", marking)
    hdr = {"Authorization": f"Bearer {KEY}", "OpenAI-Beta": "realtime=v1"}
    with _raw(url, additional_headers=hdr) as ws:
        _recv_type(ws, "session.created")
        for b64 in _chunks(audio):  # as fast as it goes: the pipeline keeps audio time
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64}))
        events = _collect(ws, lambda m: m["type"] == "response.audio.delta", timeout=90)
        types = [m["type"] for m in events]
        assert "response.output_audio.delta" not in types and "response.done" not in types, types
    # the session ends (its pipeline closed on the worker), its slot is given back
    _wait_released(app)
    assert llama_smol.forward_calls - seen["forwards"] <= 1, (llama_smol.forward_calls, seen)
    client = OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    out = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Say hi."}], max_tokens=4
    )
    assert out.choices[0].message.content
    with _raw(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        _recv_type(ws, "session.created")
        ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
        _recv_type(ws, "input_audio_buffer.cleared")
    _wait_released(app)


def test_commit_ends_the_turn_without_server_vad(rt):
    """turn_detection null: speech followed by too short a pause is not a turn yet; the
    client's commit ends it (transcription mode, 16 kHz)."""
    url, audio24, app = rt
    speech = resample(audio24[: -int(1.4 * 24_000)], 24_000, 16_000)  # 0.1 s of silence left
    with _raw(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        _recv_type(ws, "session.created")
        update = {"turn_detection": None, "speclive": {"mode": "transcribe", "sample_rate": 16000}}
        ws.send(json.dumps({"type": "session.update", "session": update}))
        s = _recv_type(ws, "session.updated")["session"]
        assert s["turn_detection"] is None and s["speclive"]["mode"] == "transcribe"
        for b64 in _chunks(speech, rate=16_000, chunk_s=0.5):
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64}))
        # everything the server makes of the audio, however slow the machine: events until
        # the speech started, then until it has been quiet for 3 s: no commit of its own
        started = lambda m: m["type"] == "input_audio_buffer.speech_started"  # noqa: E731
        before = [m["type"] for m in _collect(ws, started, timeout=90)]
        quiet_by = time.time() + 90
        with contextlib.suppress(TimeoutError):
            while time.time() < quiet_by:
                before.append(json.loads(ws.recv(timeout=3.0))["type"])
        assert "input_audio_buffer.speech_started" in before, before
        assert "input_audio_buffer.committed" not in before, before
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        events = _collect(
            ws, lambda m: m["type"] == "conversation.item.input_audio_transcription.completed", timeout=60
        )
    types = [m["type"] for m in events]
    assert "input_audio_buffer.committed" in types, types
    assert "france" in events[-1]["transcript"].lower(), events[-1]
    _wait_released(app)


def test_response_cancel_stops_the_answer(rt):
    """response.cancel while the answer streams: response.done says cancelled and nothing more
    of that answer is sent (no new response for its remaining sentences)."""
    url, audio, app = rt
    with _raw(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        _recv_type(ws, "session.created")
        for b64 in _chunks(audio, chunk_s=0.5):
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64}))
        created = _recv_type(ws, "response.created", timeout=90)
        ws.send(json.dumps({"type": "response.cancel"}))
        events = _collect(ws, lambda m: m["type"] == "response.done", timeout=60)
        done = events[-1]["response"]
        assert done["id"] == created["response"]["id"] and done["status"] == "cancelled", done
        # the turn ends (its metrics) without another response; a short answer's first sentence
        # is computed in one unit, so its metrics may have come before the cancel did
        if not any(m["type"] == "speclive.turn_metrics" for m in events):
            after = _collect(ws, lambda m: m["type"] == "speclive.turn_metrics", timeout=60)
            types = [m["type"] for m in after]
            assert not any(t.startswith("response.") for t in types), types
        with pytest.raises(TimeoutError):  # and nothing more of that answer comes
            ws.recv(timeout=2)
    _wait_released(app)


def test_auth_and_session_limit(rt):
    url, _audio, app = rt
    with _raw(url) as ws:  # no key
        with pytest.raises(ConnectionClosed) as exc:
            ws.recv(timeout=10)
        assert exc.value.rcvd.code == 1008
    # browsers send the key as a subprotocol
    with _raw(url, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"]) as ws:
        assert ws.subprotocol == "realtime"
        _recv_type(ws, "session.created")
    _wait_released(app)
    hdr = {"Authorization": f"Bearer {KEY}"}
    with _raw(url, additional_headers=hdr) as a, _raw(url, additional_headers=hdr) as b:
        _recv_type(a, "session.created")
        _recv_type(b, "session.created")
        with _raw(url, additional_headers=hdr) as c:  # max_sessions=2
            with pytest.raises(ConnectionClosed) as exc:
                c.recv(timeout=10)
            assert exc.value.rcvd.code == 1013
    _wait_released(app, timeout=10)  # disconnected sessions are released


# ---- the web page in a real browser ---------------------------------------------------------
def _chromium():
    import shutil

    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not binary or not driver:
        pytest.skip(
            "no chromium + chromedriver on this machine (Debian: apt-get install chromium chromium-driver)"
        )
    pytest.importorskip("selenium")
    return binary, driver


def _browser(binary: str, driver: str, wav: str):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1280,860",
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={wav}",
        "--autoplay-policy=no-user-gesture-required",
    ):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=opts)


def _wait(drv, script: str, timeout: float) -> object:
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = drv.execute_script(script)
        if value:
            return value
        time.sleep(0.2)
    status = drv.execute_script("return document.querySelector('#status').textContent")
    raise AssertionError(f"timed out waiting for: {script}; page status: {status}")


def _spoken_wav(tmp_path, text: str, pause_s: float = 0.0) -> str:
    """``text`` spoken by Piper; a ``|`` in it is a pause of ``pause_s``."""
    import wave

    from speclive.tts.piper import PiperTTS

    tts = PiperTTS("piper-joe-medium", varied=False)
    parts = []
    for i, piece in enumerate(text.split("|")):
        a = tts.synthesize(piece.strip())
        if i:
            parts.append(np.zeros(int(pause_s * 16_000), np.float32))
        parts.append(resample(a.samples, a.sample_rate, 16_000))
    x = np.concatenate(parts)
    x = np.concatenate([np.zeros(8000, np.float32), x, np.zeros(40_000, np.float32)])  # the capture loops
    path = tmp_path / "question.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16_000)
        w.writeframes(pcm16(x))
    return str(path)


def test_web_page_voice_chat_in_chromium(rt, tmp_path):
    binary, driver = _chromium()
    url, _audio, _app = rt
    drv = _browser(binary, driver, _spoken_wav(tmp_path, QUESTION))
    try:
        drv.get(url + "/")
        assert drv.title == "speclive"
        drv.execute_script(f"localStorage.setItem('speclive-key', '{KEY}')")
        drv.find_element("css selector", "#mic").click()
        _wait(drv, "return document.body.dataset.state === 'listening'", 30)
        _wait(drv, "return Number(document.body.dataset.answers || 0) >= 1", 120)
        _wait(drv, "return Number(document.body.dataset.playedMs || 0) > 300", 60)
        heard = drv.execute_script("return document.body.dataset.lastTranscript") or ""
        answer = drv.find_element("css selector", "#chat-answer").text
        assert "france" in heard.lower(), heard
        assert answer.strip(), "no answer shown"
        assert int(drv.execute_script("return document.body.dataset.audioDeltas || 0")) > 0
    finally:
        drv.quit()


def test_web_page_semantic_turn_waits_through_a_mid_turn_pause(rt, tmp_path):
    """The page with semantic turn detection: a question with a 0.9 s pause after "of" is
    answered once, for the whole question, and the page showed the turn prediction."""
    binary, driver = _chromium()
    url, _audio, _app = rt
    drv = _browser(binary, driver, _spoken_wav(tmp_path, "What is the capital of | France?", pause_s=0.9))
    try:
        drv.get(url + "/?turn=semantic_vad&eagerness=low")
        drv.execute_script(f"localStorage.setItem('speclive-key', '{KEY}')")
        drv.find_element("css selector", "#mic").click()
        _wait(drv, "return document.body.dataset.state === 'listening'", 30)
        _wait(drv, "return Number(document.body.dataset.answers || 0) >= 1", 120)
        data = drv.execute_script("return Object.assign({}, document.body.dataset)")
        assert "france" in (data.get("lastTranscript") or "").lower(), data
        assert data.get("responses") == "1", data  # nothing answered the half-question
        # the page shows each prediction it gets (a machine that falls behind the audio may end
        # the turn by the fallback silence before the models read the pause: then none comes)
        shown = not drv.find_element("css selector", "#turn-panel").get_attribute("hidden")
        assert shown == (int(data.get("predictions", 0)) >= 1), data
    finally:
        drv.quit()


def test_cross_origin_pages_are_refused(rt):
    """A browser page from another site cannot open the realtime socket (403 before the
    handshake); the server's own page and clients without an Origin header can."""
    from websockets.exceptions import InvalidStatus

    from speclive.server.realtime import origin_allowed

    url, _audio, _app = rt
    auth = {"Authorization": f"Bearer {KEY}"}
    with pytest.raises(InvalidStatus) as refused:
        _raw(url, additional_headers=auth, origin="http://evil.example")
    assert refused.value.response.status_code == 403
    with _raw(url, additional_headers=auth, origin=url) as ws:  # the server's own page
        _recv_type(ws, "session.created")
    assert origin_allowed(None, "127.0.0.1:8000")
    assert origin_allowed("http://127.0.0.1:8000/", "127.0.0.1:8000")
    assert not origin_allowed("http://127.0.0.1:9999", "127.0.0.1:8000")
    assert not origin_allowed("null", "127.0.0.1:8000")
    assert origin_allowed("https://app.example", "127.0.0.1:8000", ["https://app.example/"])
    assert origin_allowed("https://other.example", "127.0.0.1:8000", ["*"])
    assert not origin_allowed("https://other.example", "127.0.0.1:8000", ["https://app.example"])
