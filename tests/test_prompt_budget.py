"""While other requests are generating, the prompt chunks of a worker round share a small token
budget (``speclive.server.chat.BUSY_PROMPT_BUDGET``); a request alone prefills in full chunks."""

from __future__ import annotations

import asyncio
import threading

import pytest
from context_lm import ContextLM, reference_greedy

pytest.importorskip("fastapi")

from speclive.server import chat as chat_mod  # noqa: E402
from speclive.server.chat import ChatDelta, ChatEngine, ChatParams  # noqa: E402
from speclive.server.config import ServerConfig  # noqa: E402
from speclive.server.worker import ModelWorker  # noqa: E402


def _engine() -> tuple[ChatEngine, list[list[tuple[bool, int, int]]]]:
    engine = ChatEngine(ContextLM(), ServerConfig(model="context-lm", drafter="none", max_tokens=64))
    # per shared pass, per pass in it: (prompt chunk?, tokens, rows of a prompt tail in front)
    rounds: list[list[tuple[bool, int, int]]] = []
    chunks: dict[int, tuple] = {}  # the payloads prefill_rounds handed out (kept: ids stay theirs)
    real, real_prefill = engine.verify_together, engine.prefill_rounds

    def recording(passes):
        rounds.append([(id(p) in chunks, len(p[1]), p[3]) for p in passes])
        return real(passes)

    def prefill(*args):
        for b in real_prefill(*args):
            chunks[id(b.payload)] = b.payload
            yield b

    engine.verify_together = recording  # type: ignore[method-assign]
    engine.prefill_rounds = prefill  # type: ignore[method-assign]
    return engine, rounds


def _ask(words: int, salt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": " ".join(f"{salt}{i % 37}" for i in range(words))}]


async def _text(stream, started: threading.Event | None = None) -> str:
    n, parts = 0, []
    async for ev in stream:
        if isinstance(ev, ChatDelta):
            n += ev.tokens
            parts.append(ev.text)
            if started is not None and n >= 2:
                started.set()
    return "".join(parts)


def _greedy_text(engine: ChatEngine, messages, n: int) -> str:
    tok = engine.backend.tokenizer
    return tok.decode(reference_greedy(tok.chat(messages), n))


def test_prompt_chunks_beside_generating_requests_share_the_budget():
    engine, rounds = _engine()
    worker = ModelWorker("budget")
    gate = threading.Event()
    # a fake "translation": the answer copies the 80 words back, 60 rounds at the cap
    short, long_a, long_b = _ask(80, "g"), _ask(700, "a"), _ask(500, "b")

    def run(messages, n):
        return lambda: engine.generate(messages, ChatParams(max_tokens=n))

    async def main():
        worker.submit(gate.wait)  # all three are queued before the first round
        streams = [worker.stream(run(m, n)) for m, n in ((short, 60), (long_a, 3), (long_b, 3))]
        gate.set()
        return await asyncio.gather(*(_text(s) for s in streams))

    try:
        texts = asyncio.run(main())
    finally:
        worker.close()
    budget = chat_mod.BUSY_PROMPT_BUDGET
    # a round with a verification pass past the first (no prompt tail: that request was already
    # generating when the round was put together) fits its prompt chunks in the budget
    busy = [r for r in rounds if any(not p and not skip for p, _, skip in r)]
    prompt_tokens = [sum(n for p, n, _ in r if p) for r in busy]
    assert sum(t > 0 for t in prompt_tokens) >= 8, rounds  # the long prompts prefilled meanwhile
    assert max(prompt_tokens) <= budget, rounds
    # every prompt token went through, in order: the answers are still the greedy ones
    assert texts == [_greedy_text(engine, m, n) for m, n in ((short, 60), (long_a, 3), (long_b, 3))]


def _drive(engine: ChatEngine, messages, n: int) -> None:
    """One generation alone, each of its ``Batched`` requests run as it comes."""
    gen = engine.generate(messages, ChatParams(max_tokens=n))
    reply = None
    while True:
        try:
            item = gen.send(reply)
        except StopIteration:
            return
        reply = item.run([item.payload])[0] if hasattr(item, "run") else None


def test_alone_a_prompt_is_prefilled_in_full_chunks():
    engine, rounds = _engine()
    _drive(engine, _ask(700, "a"), 2)
    chunks = [n for r in rounds for prompt, n, _ in r if prompt]
    assert chunks and max(chunks) == chat_mod.PREFILL_CHUNK
    # so is the next one, after that one ended: nobody is generating any more
    rounds.clear()
    _drive(engine, _ask(600, "b"), 2)
    assert max(n for r in rounds for prompt, n, _ in r if prompt) == chat_mod.PREFILL_CHUNK
    # and its prompt's last piece rode in its first verification pass, a full chunk's worth
    assert max(skip for r in rounds for prompt, _, skip in r if not prompt) > chat_mod.BUSY_PROMPT_BUDGET
