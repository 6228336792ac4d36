"""The vLLM engine against real ``vllm serve`` CPU servers on SmolLM2-135M (slow).

Differential checks against vLLM's own greedy output (a plain completion of the same prompt
on the same server): lossless SSBD (β = 0) and greedy PredGen give it token for token on
several streams; biased SSBD accepts previous-output tokens; with two replicas, killing one
fails its sessions with a clear error while the other replica's sessions go on.

Needs the vLLM venv (``bash benchmarks/setup_vllm.sh``); skipped without it. The servers run
with ``--enforce-eager`` (start-up in seconds instead of minutes of torch.compile).
"""

from __future__ import annotations

import pytest

from speclive.errors import EngineUnavailableError
from speclive.sessions.simulate import lag_k_prefixes
from speclive_bench.peers import vllm_python

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(vllm_python() is None, reason="no vLLM venv: run `bash benchmarks/setup_vllm.sh`"),
]

SMALL = "smollm2-135m-instruct"
SOURCES = [
    "The weather in Berlin was cold and rainy yesterday, so we stayed at home and read books.",
    "Please send me the report before Friday, because the meeting with the client is on Monday.",
    "My sister works at a hospital in the city and she likes to go hiking on the weekends.",
]
QUESTIONS = [
    "What are three good ways to stay healthy when you work from home all day?",
    "Can you explain in simple words how a rainbow forms after the rain?",
]


@pytest.fixture(scope="module")
def servers():
    from speclive_bench.launch import VLLMServer

    started = []
    try:
        for _ in range(2):
            started.append(VLLMServer(SMALL, enforce_eager=True, kv_cache_gb=1).start())
        yield started
    finally:
        for s in started:
            s.stop()


@pytest.fixture(scope="module")
def engine(servers):
    from speclive.engines.vllm import connect

    eng = connect([servers[0].url])
    yield eng
    eng.close()


def vllm_greedy(engine, prompt: list[int], max_tokens: int, rep=None) -> list[int]:
    """vLLM's own greedy output: one plain completion, until EOS or ``max_tokens``."""
    rep = rep or engine.replicas[0]
    out: list[int] = []
    for ids in engine.stream(rep, prompt, max_tokens, engine.tokenizer.eos_ids):
        out.extend(ids)
    eos = engine.tokenizer.eos_ids
    return out[: next((i for i, t in enumerate(out) if t in eos), len(out))]


def test_lossless_ssbd_is_vllm_greedy(engine):
    from speclive.sessions.retranslate import ReTranslator

    accepted = 0
    for src in SOURCES:
        s = ReTranslator(engine, beta=0.0, max_tokens=48, mask_k=0)
        for part in lag_k_prefixes(src, 3):
            u = s.update(part)
            assert u.token_ids == vllm_greedy(engine, s.prompt_ids(part), 48), part
            accepted += u.accepted
        s.close()
    assert accepted > 0


def test_biased_ssbd_accepts(engine):
    from speclive.sessions.retranslate import ReTranslator

    lossless = ReTranslator(engine, beta=0.0, max_tokens=48, mask_k=0)
    biased = ReTranslator(engine, beta=0.5, max_tokens=48, mask_k=0)
    for src in SOURCES:
        for part in lag_k_prefixes(src, 3):
            lossless.update(part)
            biased.update(part)
    m0, mb = lossless.metrics(), biased.metrics()
    assert mb["accepted"] > 0
    assert mb["acceptance_per_draft"] >= m0["acceptance_per_draft"]
    lossless.close()
    biased.close()


def test_greedy_predgen_is_vllm_greedy(engine):
    from speclive.sessions.predictive import PredictiveResponder

    for q in QUESTIONS:
        s = PredictiveResponder(engine, verifier="greedy", max_tokens=40)
        words = q.split()
        for n in range(2, len(words), 2):
            s.update(" ".join(words[:n]))
        got = s.finish(q)
        assert got.token_ids == vllm_greedy(engine, s.prompt_ids(q), 40), q
        s.close()


def test_replica_failover(servers):
    from speclive.engines.vllm import connect
    from speclive.sessions.retranslate import ReTranslator

    eng = connect([s.url for s in servers])
    a = ReTranslator(eng, beta=0.0, max_tokens=16, mask_k=0)
    b = ReTranslator(eng, beta=0.0, max_tokens=16, mask_k=0)
    assert a.decoder.replica is not b.decoder.replica
    a.update("Good morning")
    b.update("Good morning")
    victim = next(s for s in servers if s.url == a.decoder.replica.url)
    victim.kill()
    with pytest.raises(EngineUnavailableError, match=victim.url):
        a.update("Good morning, how are you")
    u = b.update("Good morning, how are you")
    want = vllm_greedy(eng, b.prompt_ids("Good morning, how are you"), 16, b.decoder.replica)
    assert u.token_ids == want
    c = ReTranslator(eng, beta=0.0, max_tokens=16, mask_k=0)
    assert c.decoder.replica is b.decoder.replica
    c.update("Good evening")
    eng.close()
