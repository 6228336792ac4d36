"""The web page hears what the CLI hears: headless Chromium with a WAV as its fake microphone.

The server's decoder of ``input_audio_buffer.append`` is wrapped to keep every sample the page
sent. In the transcription tab (no echo cancellation) the page's transcript must equal
``speclive transcribe`` on the same WAV with the same Whisper, and the PCM that reached the
server must be the WAV itself: the same waveform (correlation in 0.25 s windows; the browser's
noise suppression, gain control or echo cancellation bring it under 0.85) and the same log-mel
features (a resampler without a low-pass filter folds 8-24 kHz into them). Back in the
voice-chat tab the page reopens the microphone with echo cancellation (the answer plays aloud
there), which alters the waveform but must leave Whisper's log-mel features about as they were.
"""

from __future__ import annotations

import contextlib
import io
import re
import time
import wave

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("websockets")
pytest.importorskip("llama_cpp")

from test_realtime import _browser, _chromium, _raw, _recv_type, _wait  # noqa: E402
from test_server import running  # noqa: E402

from speclive.server import realtime_session  # noqa: E402
from speclive.server.app import create_app  # noqa: E402
from speclive.server.audio import pcm16, resample  # noqa: E402
from speclive.server.config import ServerConfig  # noqa: E402

KEY = "page-key"
QUESTION = "What are three simple ways to save energy at home?"
RATE = 16_000


@pytest.fixture(scope="module")
def page_srv(llama_smol):
    """A server whose realtime sessions use whisper-tiny.en (one-layer self-draft) and a list
    that gets every 16 kHz chunk the server decodes from ``input_audio_buffer.append``."""
    from speclive.asr.transcribe import TranscribeConfig, Transcriber

    live_tr = Transcriber(
        TranscribeConfig(model="whisper-tiny.en", method="specasr", draft="self:1", target_audio_margin_s=1.0)
    )
    config = ServerConfig(model="smollm2-135m-instruct", asr_model="whisper-tiny.en", api_key=KEY)
    app = create_app(config, backend=llama_smol, live_transcriber=live_tr)
    received: list[np.ndarray] = []
    decode = realtime_session.decode_audio

    def keep(b64, rate):
        x = decode(b64, rate)
        received.append(x.copy())
        return x

    with pytest.MonkeyPatch.context() as mp, running(app) as url:
        mp.setattr(realtime_session, "decode_audio", keep)
        # the first session loads the live models; the page's session then hears its audio as
        # it comes instead of all at once after the load
        with _raw(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
            _recv_type(ws, "session.created", timeout=120)
        yield url, received


def _question_wav(tmp_path) -> tuple[str, np.ndarray]:
    """Piper's question at 16 kHz: 1 s of silence (the page may miss the first moments of the
    capture), the question, 2.5 s of silence (Chromium's fake capture plays the file in a loop:
    the turn ends well before the question comes again)."""
    from speclive.tts.piper import PiperTTS

    a = PiperTTS("piper-joe-medium", varied=False).synthesize(QUESTION)
    x = resample(a.samples, a.sample_rate, RATE)
    x = np.concatenate([np.zeros(RATE, np.float32), x, np.zeros(5 * RATE // 2, np.float32)])
    path = tmp_path / "question.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm16(x))
    x = np.frombuffer(pcm16(x), "<i2").astype(np.float32) / 32768  # as the file holds it
    return str(path), x


def _cli_transcript(wav: str) -> str:
    from speclive.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["transcribe", "--model", "whisper-tiny.en", "--draft", "self:1", wav])
    assert rc in (0, None)
    return out.getvalue().strip().splitlines()[-1]


def _words(text: str) -> list[str]:
    return re.sub(r"[^\w\s]", " ", text.lower()).split()


def _aligned(got: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The stretch of ``got`` that best matches the speech of ``ref`` (cross-correlation), and
    that speech."""
    voiced = np.flatnonzero(np.abs(ref) > 0.01)
    speech = ref[voiced[0] : voiced[-1]]
    assert len(got) >= len(speech), f"the server got {len(got) / RATE:.2f} s of audio"
    n = 1 << int(np.ceil(np.log2(len(got) + len(speech))))
    xc = np.fft.irfft(np.fft.rfft(got, n) * np.conj(np.fft.rfft(speech, n)), n)[: len(got) - len(speech) + 1]
    lag = int(np.argmax(xc))
    return got[lag : lag + len(speech)], speech


def _realigned(got: np.ndarray, speech: np.ndarray, search: int = 800) -> tuple[np.ndarray, list[float]]:
    """``got`` (aligned with ``speech`` as a whole) realigned in 0.25 s windows, each at its best
    lag within +-50 ms, and the waveform correlation of each window with speech in it: a capture
    that drops or repeats a few milliseconds on a busy machine shifts what follows, and that
    costs one window, not the rest."""
    w = RATE // 4
    padded = np.concatenate([np.zeros(search, np.float32), got, np.zeros(search + w, np.float32)])
    out = np.zeros(len(speech), np.float32)
    corrs = []
    for i in range(0, len(speech), w):
        b = speech[i : i + w]
        scores = [
            np.dot(a, b) / (np.sqrt(np.dot(a, a) * np.dot(b, b)) + 1e-12)
            for a in (padded[i + d : i + d + len(b)] for d in range(2 * search + 1))
        ]
        d = int(np.argmax(scores))
        out[i : i + w] = padded[i + d : i + d + len(b)]
        if np.sqrt(np.mean(b**2)) >= 0.02:  # not a pause between words
            corrs.append(float(scores[d]))
    return out, corrs


def _log_mel_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute difference of Whisper's log-mel features (their range is about 2)."""
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor(feature_size=80)
    frames = len(a) // 160
    fa, fb = (fe(v, sampling_rate=RATE, return_tensors="np").input_features[0][:, :frames] for v in (a, b))
    return float(np.abs(fa - fb).mean())


def test_page_hears_what_the_cli_hears(page_srv, tmp_path):
    binary, driver = _chromium()
    url, received = page_srv
    wav, ref = _question_wav(tmp_path)
    cli = _cli_transcript(wav)
    assert "energy" in cli.lower(), cli
    received.clear()
    drv = _browser(binary, driver, wav)
    try:
        drv.get(url + "/")
        drv.execute_script(f"localStorage.setItem('speclive-key', '{KEY}')")
        drv.find_element("css selector", ".tab[data-mode=transcribe]").click()
        drv.find_element("css selector", "#mic").click()
        _wait(drv, "return document.body.dataset.state === 'listening'", 30)
        _wait(drv, "return Number(document.body.dataset.transcripts || 0) >= 1", 60)
        heard = drv.execute_script("return document.body.dataset.lastTranscript") or ""
        page_pcm = np.concatenate(received)
        # voice chat: the microphone reopens with echo cancellation. The capture loops the WAV:
        # a loop, then the lead-in and the question, hold the whole question wherever it started.
        drv.find_element("css selector", ".tab[data-mode=chat]").click()
        received.clear()
        need = len(ref) + len(ref) - 5 * RATE // 2
        deadline = time.time() + 30
        while sum(map(len, received)) < need and time.time() < deadline:
            time.sleep(0.2)
        chat_pcm = np.concatenate(received)
    finally:
        drv.quit()
    assert _words(heard) == _words(cli), (heard, cli)
    got, speech = _aligned(page_pcm, ref)
    got, corrs = _realigned(got, speech)
    # 0.99+ in every window when the page passes the microphone on as it is; 0.6-0.85 with the
    # browser's noise suppression, gain control or echo cancellation
    assert len(corrs) >= 6 and np.median(corrs) >= 0.9, f"window correlations {np.round(corrs, 3)}"
    # what Whisper sees: 0.004 from a faithful capture; 0.09 when 8-24 kHz aliases into the band
    diff = _log_mel_diff(got, speech)
    assert diff < 0.03, f"log-mel features of the page's PCM differ from the WAV's by {diff:.3f}"
    # voice chat, with echo cancellation: 0.02; 0.16 with noise suppression and gain control too
    got, speech = _aligned(chat_pcm, ref)
    diff = _log_mel_diff(_realigned(got, speech)[0], speech)
    assert diff < 0.05, f"log-mel features of the voice-chat capture differ from the WAV's by {diff:.3f}"
