"""``speclive serve`` stops gracefully on SIGTERM: a streaming answer in flight finishes, a
realtime session gets a clean close, the app shuts down (its lifespan ends) and the process
exits; no new request is taken. Also with eight streams live at once (five streaming chat
completions, three realtime sessions answering).
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("websockets")
pytest.importorskip("llama_cpp")

import httpx  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from speclive.server.inproc import free_port  # noqa: E402


def _start(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, str, Any]:
    """``speclive serve`` on a free port with the tiny models (and ``extra`` flags), once its
    ``/health`` answers: the process, its URL and its open log file."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "speclive.cli", "serve", "--port", str(port), *extra]
    cmd += ["--model", "smollm2-135m-instruct", "--asr-model", "whisper-tiny.en", "--asr-draft", "self:1"]
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 180
    while True:
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url, log
        except httpx.HTTPError:
            pass
        assert time.time() < deadline, "the server did not start"
        time.sleep(0.3)


def test_sigterm_finishes_streams_in_flight_and_exits_cleanly(tmp_path):
    proc, url, log = _start(tmp_path)
    port = int(url.rsplit(":", 1)[1])
    try:
        ws = connect(f"ws://127.0.0.1:{port}/v1/realtime", open_timeout=60)
        assert json.loads(ws.recv(timeout=60))["type"] == "session.created"
        chunks: list[dict] = []
        done = threading.Event()
        first = threading.Event()

        def stream() -> None:
            body = {
                "model": "default",
                "messages": [{"role": "user", "content": "Count from one to one hundred in words."}],
                "max_tokens": 120,
                "stream": True,
            }
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
                lines = r.iter_lines()
                for line in lines:
                    if line.startswith("data: "):
                        data = line[6:]
                        if data == "[DONE]":
                            done.set()
                            return
                        chunks.append(json.loads(data))
                        first.set()

        th = threading.Thread(target=stream, daemon=True)
        th.start()
        assert first.wait(120), "no streamed chunk"
        proc.send_signal(signal.SIGTERM)
        th.join(60)
        assert done.is_set(), "the stream in flight did not finish"
        assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
        code = None
        try:
            while True:
                ws.recv(timeout=30)
        except ConnectionClosed as e:
            code = e.rcvd.code if e.rcvd is not None else 1006
        assert code in (1000, 1001, 1012), code
        # uvicorn re-raises the signal once it has shut down: the exit status says SIGTERM
        assert proc.wait(60) in (0, -signal.SIGTERM)
        log.flush()
        assert "Application shutdown complete" in (tmp_path / "serve.log").read_text()
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{url}/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()


class _ChatStream(threading.Thread):
    """One streaming chat completion: ``live`` once its first chunk came, ``done`` at [DONE]."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url = url
        self.chunks: list[dict] = []
        self.live, self.done = threading.Event(), threading.Event()

    def run(self) -> None:
        body = {
            "model": "default",
            "messages": [{"role": "user", "content": "Count from one to one hundred in words."}],
            "max_tokens": 100,
            "stream": True,
        }
        with httpx.stream("POST", f"{self.url}/v1/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    self.done.set()
                    return
                if line.startswith("data: "):
                    self.chunks.append(json.loads(line[6:]))
                    self.live.set()


class _VoiceAnswer(threading.Thread):
    """One realtime session speaking a request for a story and reading its answer: ``live``
    once the answer is streaming, ``done`` when the response is done; ``code``: its close code."""

    def __init__(self, url: str, audio: np.ndarray):
        super().__init__(daemon=True)
        self.url, self.audio = url, audio
        self.live, self.done = threading.Event(), threading.Event()
        self.code: int | None = None
        self.types: list[str] = []

    def run(self) -> None:
        with connect(self.url.replace("http://", "ws://") + "/v1/realtime", open_timeout=60) as ws:
            update = {"modalities": ["text"], "speclive": {"sample_rate": 16_000, "method": "cascade"}}
            ws.send(json.dumps({"type": "session.update", "session": update}))
            speech = np.concatenate([self.audio, np.zeros(16_000, np.float32)])  # its silence ends the turn
            pcm = (np.clip(speech, -1, 1) * 32767).astype("<i2").tobytes()
            for i in range(0, len(pcm), 32_000):
                chunk = base64.b64encode(pcm[i : i + 32_000]).decode()
                ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
            try:
                while True:
                    kind = json.loads(ws.recv(timeout=120))["type"]
                    self.types.append(kind)
                    if kind == "response.output_audio_transcript.delta":
                        self.live.set()
                    elif kind == "response.done":
                        self.done.set()
            except ConnectionClosed as e:
                self.code = e.rcvd.code if e.rcvd is not None else 1006


def test_sigterm_during_eight_live_streams_closes_every_one_cleanly(tmp_path):
    """Five streaming chat completions and three realtime sessions answering when SIGTERM
    comes: the completions finish, the sessions close cleanly (after or during their answer),
    the process exits without a traceback."""
    from asr_fixtures import clips_16k

    audio = clips_16k()[1][1]  # "Please write a short story about a robot who learns to paint."
    # eight generations at once; no turn refused for its expected wait on a loaded machine; one
    # llama.cpp thread (two would wait on each other whenever the machine is busy)
    proc, url, log = _start(tmp_path, "--max-sessions", "8", "--max-wait", "0", "--threads", "1")
    try:
        voices = [_VoiceAnswer(url, audio) for _ in range(3)]
        for v in voices:
            v.start()
        chats = [_ChatStream(url) for _ in range(5)]
        for c in chats:
            c.start()
        streams: list[_ChatStream | _VoiceAnswer] = [*chats, *voices]
        for s in streams:
            assert s.live.wait(120), "a stream did not start"
        live = sum(not s.done.is_set() for s in streams)
        proc.send_signal(signal.SIGTERM)
        t_term = time.time()
        for s in streams:
            s.join(60)
        assert live == 8, f"only {live} of 8 streams were live at SIGTERM"
        for c in chats:
            assert c.done.is_set(), "a stream in flight did not finish"
            assert c.chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
        for v in voices:
            assert v.code in (1000, 1001, 1012), (v.code, v.types[-5:])
            assert "error" not in v.types, v.types
        assert proc.wait(60) in (0, -signal.SIGTERM)
        log.flush()
        text = (tmp_path / "serve.log").read_text()
        assert "Application shutdown complete" in text
        assert "Traceback" not in text, text[-3000:]
        assert time.time() - t_term < 40  # within the graceful shutdown's 30 s (and the exit)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
