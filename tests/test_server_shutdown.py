"""``speclive serve`` stops gracefully on SIGTERM: a streaming answer in flight finishes, a
realtime session gets a clean close, the app shuts down (its lifespan ends) and the process
exits; no new request is taken.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("websockets")
pytest.importorskip("llama_cpp")

import httpx  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from speclive.server.inproc import free_port  # noqa: E402


def test_sigterm_finishes_streams_in_flight_and_exits_cleanly(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "speclive.cli", "serve", "--port", str(port)]
    cmd += ["--model", "smollm2-135m-instruct", "--asr-model", "whisper-tiny.en", "--asr-draft", "self:1"]
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 180
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "the server did not start"
            time.sleep(0.3)
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
