"""The model worker on its own (no model, no HTTP): fair turns, cancellation, errors."""

from __future__ import annotations

import asyncio
import threading

import pytest

pytest.importorskip("fastapi")

from speclive.server.worker import Batched, ModelWorker, StreamCancelled  # noqa: E402


def _steps(name: str, n: int, log: list[str], closed: list[str] | None = None):
    def gen():
        try:
            for i in range(n):
                log.append(f"{name}{i}")
                yield i
        finally:
            if closed is not None:
                closed.append(name)

    return gen


def test_streams_take_turns_with_calls_in_between():
    log: list[str] = []
    worker = ModelWorker("test")
    gate = threading.Event()

    async def main():
        worker.submit(gate.wait)  # hold the thread until everything is queued
        a = worker.stream(_steps("a", 4, log))
        b = worker.stream(_steps("b", 2, log))
        call = worker.submit(lambda: log.append("call"))
        gate.set()
        got_a = [x async for x in a]
        got_b = [x async for x in b]
        call.result(5)
        return got_a, got_b

    got_a, got_b = asyncio.run(main())
    worker.close()
    assert got_a == [0, 1, 2, 3] and got_b == [0, 1]
    # round-robin: one long stream does not hold the thread; the call waits one turn per stream
    assert log[:4] == ["a0", "b0", "call", "a1"]
    assert log.index("b1") < log.index("a2")


def test_cancel_closes_the_iterator_on_the_worker_thread():
    closed: list[str] = []
    threads: list[str] = []
    worker = ModelWorker("test")

    def forever():
        try:
            while True:
                yield 1
        finally:
            threads.append(threading.current_thread().name)
            closed.append("x")

    async def main():
        s = worker.stream(forever)
        assert await s.next() == 1
        s.cancel()
        assert await asyncio.to_thread(s.wait_finished, 5)
        assert s.was_cancelled
        with pytest.raises((StreamCancelled, StopAsyncIteration)):
            while True:  # items produced before the cancel may still be queued
                await s.next()
        # the worker goes on serving
        assert await worker.call(lambda: 42) == 42

    asyncio.run(main())
    worker.close()
    assert closed == ["x"] and threads == ["speclive-test"]


def test_errors_reach_the_awaiting_side_and_the_worker_survives():
    worker = ModelWorker("test")

    def bad():
        yield 1
        raise ValueError("step failed")

    async def main():
        s = worker.stream(bad)
        assert await s.next() == 1
        with pytest.raises(ValueError, match="step failed"):
            await s.next()
        with pytest.raises(ZeroDivisionError):
            await worker.call(lambda: 1 / 0)
        return await worker.call(lambda: "alive")

    assert asyncio.run(main()) == "alive"
    worker.close()


def test_a_stream_whose_event_loop_is_gone_is_closed():
    closed: list[str] = []
    worker = ModelWorker("test")
    gate = threading.Event()

    async def start():
        worker.submit(gate.wait)
        return worker.stream(_steps("s", 1000, [], closed))

    s = asyncio.run(start())  # the loop is closed when run() returns
    gate.set()
    assert s.wait_finished(5) and s.was_cancelled and closed == ["s"]
    worker.close()


def test_background_calls_wait_for_foreground_turns_and_can_be_withdrawn():
    log: list[str] = []
    worker = ModelWorker("test")
    gate = threading.Event()

    async def main():
        worker.submit(gate.wait)
        spec = worker.submit_background(lambda: log.append("speculate"))
        dropped = worker.submit_background(lambda: log.append("dropped"))
        s = worker.stream(_steps("answer", 3, log))
        call = worker.submit(lambda: log.append("call"))
        assert dropped.cancel()  # not started: withdrawn
        for _ in range(50):  # a session withdrawing and resubmitting leaves nothing behind
            assert worker.submit_background(lambda: None).cancel()
        assert len(worker._background) <= 2
        gate.set()
        assert [x async for x in s] == [0, 1, 2]
        call.result(5)
        spec.result(5)

    asyncio.run(main())
    worker.close()
    # the speculation queued first still runs only after every foreground turn
    assert log == ["answer0", "call", "answer1", "answer2", "speculate"]


def test_batched_requests_of_queued_streams_run_as_one_call():
    calls: list[list[int]] = []

    def run(payloads: list[int]) -> list:
        calls.append(list(payloads))
        return [ValueError(f"bad {p}") if p < 0 else p * 10 for p in payloads]

    def stream_of(xs: list[int]):
        def gen():
            for x in xs:
                try:
                    got = yield Batched(run, x)
                except ValueError as e:
                    got = str(e)
                yield got

        return gen

    worker = ModelWorker("test")
    gate = threading.Event()

    async def main():
        worker.submit(gate.wait)
        a = worker.stream(stream_of([1, 2, 3]))
        b = worker.stream(stream_of([4, -5]))
        plain = worker.stream(lambda: iter(["p0", "p1"]))
        c = worker.stream(stream_of([6]))
        gate.set()
        return [x async for x in a], [x async for x in b], [x async for x in plain], [x async for x in c]

    got = asyncio.run(main())
    worker.close()
    assert got == ([10, 20, 30], [40, "bad -5"], ["p0", "p1"], [60])
    # one run per round for every stream waiting on one (a stream without requests just steps)
    assert calls == [[1, 4, 6], [2, -5], [3]]


def test_whisper_shares_the_chat_worker_with_a_local_llm():
    """torch and llama.cpp use one OpenMP runtime: a second thread with a Whisper pool makes
    libgomp stop busy-waiting at llama.cpp's barriers (services module docstring)."""
    from speclive.server.config import ServerConfig
    from speclive.server.services import Services

    local = Services(ServerConfig(model="toy-model"))
    remote = Services(ServerConfig(model="toy-model", engine="vllm", vllm_urls=("http://127.0.0.1:9",)))
    try:
        assert local.worker("transcription") is local.worker("chat")
        assert local.worker("speech") is not local.worker("chat")  # Piper: onnxruntime's own pool
        assert remote.worker("transcription") is not remote.worker("chat")  # a remote LLM waits on I/O
        assert {t.name for t in threading.enumerate()} >= {"speclive-chat", "speclive-speech"}
    finally:
        local.close()
        remote.close()
