"""The vLLM engine against a fake ``vllm serve`` (``tests/fake_vllm.py``; no vLLM needed).

Checked: the log-prob adapter makes speclive's rules decide exactly as on full logits; SSBD
and PredGen over the engine give the in-process reference's tokens (lossless greedy and biased
β); the requests have the documented shape (one scoring request per verification, then one
streamed completion from the accepted prefix); sessions stick to a replica, new ones go to the
least loaded; a dead replica fails its sessions with a clear error and the others go on.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from fake_vllm import FakeVLLM, ToyBackend, ToyLM, ToyTokenizer

from speclive.acceptance import BiasedRule, GreedyRule, TopKRule
from speclive.decoder import GenerationConfig, StepEvent
from speclive.drafting.history import HistoryDrafter
from speclive.drafting.ngram import NgramDrafter
from speclive.engines import vllm as ev
from speclive.engines.vllm import VLLMEngine, logprob_matrix
from speclive.errors import ConfigError, EngineUnavailableError
from speclive.sessions.predictive import PredictiveResponder
from speclive.sessions.retranslate import ReTranslator

SOURCE = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"


@pytest.fixture(scope="module")
def lm():
    return ToyLM(seed=3)


@pytest.fixture(scope="module")
def server(lm):
    s = FakeVLLM(lm)
    yield s
    s.stop()


def engine_on(*servers, top_k: int = 20) -> VLLMEngine:
    return VLLMEngine([s.url for s in servers], ToyTokenizer(), top_k=top_k)  # type: ignore[arg-type]


def prefixes(text: str, step: int = 2) -> list[str]:
    words = text.split()
    return [" ".join(words[:n]) for n in range(step, len(words) + 1, step)]


# ---------------------------------------------------------------------------------- adapter
def _row_dict(logp: np.ndarray, k: int, own: int) -> dict[int, float]:
    order = np.argsort(-logp, kind="stable")[:k]
    d = {int(t): float(logp[t]) for t in order}
    d.setdefault(own, float(logp[own]))
    return d


@pytest.mark.parametrize("scale", [0.3, 2.0, 8.0])
def test_rules_decide_on_the_adapted_topk_as_on_full_logits(scale):
    rng = np.random.default_rng(int(scale * 10))
    vocab, k = 300, 6
    rules = [GreedyRule(), TopKRule(1), TopKRule(3), TopKRule(6), BiasedRule(0.2), BiasedRule(0.6)]
    for _ in range(150):
        logits = scale * rng.standard_normal((4, vocab))
        logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        # a chain of 3 draft tokens: sometimes the argmax, sometimes a near or a far token
        draft = [int(rng.choice(np.argsort(-logp[i])[: rng.choice([1, 3, 50])])) for i in range(3)]
        rows = [_row_dict(logp[i], k, draft[i] if i < 3 else -1) for i in range(3)]
        rows.append(_row_dict(logp[3], k, int(np.argmax(logp[3]))))
        matrix, ids = logprob_matrix(rows, k, vocab)
        col = {t: j for j, t in enumerate(ids)}
        parents = [-1, 0, 1, 2]
        for rule in rules:
            full = rule.accept([0, *draft], parents, logits)
            compact = rule.accept([0, *(col[t] for t in draft)], parents, matrix)
            assert compact.path == full.path, rule.name
            assert ids[compact.bonus] == full.bonus, rule.name


def test_adapter_softmax_is_exact_for_listed_tokens():
    rng = np.random.default_rng(1)
    logits = 1.5 * rng.standard_normal(500)
    logp = logits - np.log(np.exp(logits).sum())
    rows = [_row_dict(logp, 5, 123)]
    matrix, ids = logprob_matrix(rows, 5, 500)
    p = np.exp(matrix[0] - matrix[0].max())
    p /= p.sum()
    for j, t in enumerate(ids):
        assert p[j] == pytest.approx(np.exp(logp[t]), rel=1e-9)
    assert matrix.shape[1] <= 500


# ---------------------------------------------------------------------------------- sessions
def test_ssbd_lossless_over_vllm_is_the_reference_greedy(lm, server):
    eng = engine_on(server)
    ref = ReTranslator(ToyBackend(lm), baseline=True, max_tokens=24, mask_k=0)
    plain = ReTranslator(eng, baseline=True, max_tokens=24, mask_k=0)
    spec = ReTranslator(eng, beta=0.0, max_tokens=24, mask_k=0)
    accepted = 0
    for src in prefixes(SOURCE):
        r, a, b = ref.update(src), plain.update(src), spec.update(src)
        assert a.token_ids == r.token_ids
        assert b.token_ids == r.token_ids
        accepted += b.accepted
    assert accepted > 0  # the previous translation was drafted and kept
    spec.close()
    plain.close()


@pytest.mark.parametrize("beta", [0.3, 0.7])
def test_biased_ssbd_over_vllm_matches_the_in_process_rule(lm, server, beta):
    eng = engine_on(server)
    # the in-process reference verifies the whole previous output in one pass, as the engine does
    ref = ReTranslator(ToyBackend(lm), beta=beta, chunked=False, max_tokens=24, mask_k=0)
    spec = ReTranslator(eng, beta=beta, max_tokens=24, mask_k=0)
    greedy = ReTranslator(ToyBackend(lm), baseline=True, max_tokens=24, mask_k=0)
    differs = False
    for src in prefixes(SOURCE):
        r, s, g = ref.update(src), spec.update(src), greedy.update(src)
        assert s.token_ids == r.token_ids
        assert s.accepted == r.accepted
        differs |= s.token_ids != g.token_ids
    assert differs  # the bias changed the output somewhere (else this test shows nothing)
    assert spec.metrics()["accepted"] > 0
    spec.close()


def test_predgen_greedy_over_vllm_answers_as_the_cascade(lm, server):
    eng = engine_on(server)
    question = "what is the fastest way to learn a new language quickly and well"
    ref = PredictiveResponder(ToyBackend(lm), baseline=True, max_tokens=30)
    ref.update(question)
    want = ref.finish().token_ids
    for verifier in ("greedy", "topk:3"):
        s = PredictiveResponder(eng, verifier=verifier, max_tokens=30)
        for p in prefixes(question, 3):
            s.update(p)
        got = s.finish(question)
        if verifier == "greedy":
            assert got.token_ids == want
        assert got.response
        s.close()
    with pytest.raises(ConfigError, match="log-probs per position"):
        PredictiveResponder(engine_on(server, top_k=2), verifier="topk:3")
    with pytest.raises(ConfigError, match="reflection"):
        PredictiveResponder(eng, verifier="reflection")


def test_one_scoring_request_then_a_streamed_continuation(lm):
    srv = FakeVLLM(lm)
    try:
        eng = engine_on(srv)
        s = ReTranslator(eng, beta=0.0, max_tokens=20, mask_k=0)
        ref = ReTranslator(ToyBackend(lm), baseline=True, max_tokens=20, mask_k=0)
        continued = 0
        prev = s.update("alpha")
        for src in prefixes(SOURCE, 1):
            srv.requests.clear()
            u = s.update(src)
            assert u.token_ids == ref.update(src).token_ids
            reqs = srv.completions()
            prompt = s.prompt_ids(src)
            score = reqs[0]
            # the whole previous output, but for the slot the bonus token fills (max_tokens=20)
            assert score["prompt"] == prompt + prev.token_ids[:19]
            assert score["max_tokens"] == 1 and score["temperature"] == 0.0
            assert score["prompt_logprobs"] == 20
            n = u.accepted + 1  # accepted prefix + bonus token
            if len(u.token_ids) > n:  # more to generate: one streamed continuation from there
                assert len(reqs) == 2
                cont = reqs[1]
                assert cont["stream"] is True and "prompt_logprobs" not in cont
                assert cont["prompt"] == prompt + u.token_ids[:n]
                continued += 1
            else:
                assert len(reqs) == 1
            prev = u
        assert continued > 0
    finally:
        srv.stop()


def test_the_vllm_decoder_verifies_a_prepared_draft_and_keeps_the_in_process_books(lm, server):
    """The drafter says what it drafts from (``prepared_draft``): the previous output, its
    first ``forced`` tokens tagged so; a step-by-step drafter is refused. ``stepwise`` is
    ``generate`` (vLLM runs every pass) and accounts the steps as the in-process loop does."""
    eng = engine_on(server)
    with pytest.raises(ConfigError, match="previous output only"):
        eng.make_decoder(NgramDrafter())
    prompt = [3, 5, 7, 9]
    cfg = GenerationConfig(max_tokens=12, ignore_eos=True)
    plain = eng.make_decoder()
    ref = plain.run(prompt, cfg)
    plain.close()
    d = HistoryDrafter()
    d.set_history([*ref.token_ids[:6], (ref.token_ids[6] + 1) % eng.vocab_size], forced=2)
    assert d.prepared_draft(4).sources == ["forced", "forced", "history", "history"]
    dec = eng.make_decoder(d)
    steps = dec.stepwise(prompt, cfg)
    events = []
    while True:
        try:
            events.append(steps.send(None))
        except StopIteration as done:
            res = done.value
            break
    dec.close()
    assert all(isinstance(ev, StepEvent) for ev in events)
    assert res.token_ids == ref.token_ids
    st = res.stats
    assert (st.drafted, st.accepted) == (7, 6)
    assert st.drafted_by_source == {"forced": 2, "history": 5}
    assert st.accepted_by_source == {"forced": 2, "history": 4}
    assert events[0].sources == {"forced": 2, "history": 4} and events[0].tokens == ref.token_ids[:7]
    assert st.target_forwards == 1 + (len(ref.token_ids) - 7)


# ---------------------------------------------------------------------------------- replicas
def test_sessions_stick_to_a_replica_and_new_ones_go_to_the_least_loaded(lm):
    a, b = FakeVLLM(lm), FakeVLLM(lm)
    try:
        eng = engine_on(a, b)
        s1 = ReTranslator(eng, beta=0.0, max_tokens=8)
        s2 = ReTranslator(eng, beta=0.0, max_tokens=8)
        assert {s1.decoder.replica.url, s2.decoder.replica.url} == {a.url, b.url}
        s3 = ReTranslator(eng, beta=0.0, max_tokens=8)
        assert s3.decoder.replica.sessions == 2
        other = s2 if s3.decoder.replica is s1.decoder.replica else s1
        other.close()
        s4 = ReTranslator(eng, beta=0.0, max_tokens=8)  # that replica holds no session now
        assert s4.decoder.replica is other.decoder.replica
        assert s4.decoder.replica is not s3.decoder.replica
        s2 = s4 if other is s2 else s2
        for s in (s2, s3):
            for src in prefixes(SOURCE, 4):
                s.update(src)
        by_url = {a.url: a, b.url: b}
        for s in (s2, s3):  # every request of a session went to its own replica
            mine = by_url[s.decoder.replica.url]
            assert len(mine.requests) >= len(s.updates)
        assert len(a.requests) + len(b.requests) == sum(len(x.requests) for x in (a, b))
    finally:
        a.stop()
        b.stop()


def test_a_dead_replica_fails_its_sessions_and_the_rest_go_on(lm, monkeypatch):
    a, b = FakeVLLM(lm), FakeVLLM(lm)
    eng = engine_on(a, b)
    on_a = ReTranslator(eng, beta=0.0, max_tokens=8)
    on_b = ReTranslator(eng, beta=0.0, max_tokens=8)
    if on_a.decoder.replica.url != a.url:
        on_a, on_b = on_b, on_a
    on_a.update("one two")
    a.stop()
    with pytest.raises(EngineUnavailableError, match=a.url.replace(".", r"\.")):
        on_a.update("one two three")
    with pytest.raises(EngineUnavailableError, match="session is closed"):
        on_a.update("one two three four")
    ref = ReTranslator(ToyBackend(lm), baseline=True, max_tokens=8)
    assert on_b.update("one two three").token_ids == ref.update("one two three").token_ids
    # new sessions avoid the dead replica (its health check fails too)
    monkeypatch.setattr(ev, "RETRY_DEAD_S", 0.0)
    for _ in range(3):
        s = ReTranslator(eng, beta=0.0, max_tokens=8)
        assert s.decoder.replica.url == b.url
        s.update("one two")
    b.stop()
    with pytest.raises(EngineUnavailableError):
        on_b.update("one two three four")
    with pytest.raises(EngineUnavailableError, match="no vLLM replica"):
        ReTranslator(eng, beta=0.0)


def test_a_503_takes_the_replica_out_and_a_500_fails_only_the_request(lm):
    a, b = FakeVLLM(lm), FakeVLLM(lm)
    try:
        eng = engine_on(a, b)
        s = ReTranslator(eng, beta=0.0, max_tokens=8)
        srv = a if s.decoder.replica.url == a.url else b
        other = b if srv is a else a
        srv.status = 500
        with pytest.raises(EngineUnavailableError, match="HTTP 500"):
            s.update("one two")
        assert s.decoder.replica.alive  # one bad answer: the replica stays in
        srv.status = 503
        with pytest.raises(EngineUnavailableError, match="failed"):
            s.update("one two")
        assert not s.decoder.replica.alive
        assert ReTranslator(eng, beta=0.0).decoder.replica.url == other.url
    finally:
        a.stop()
        b.stop()


def test_engine_errors_are_clear(lm, server):
    with pytest.raises(ConfigError, match="--vllm-url"):
        VLLMEngine([], ToyTokenizer())  # type: ignore[arg-type]
    with pytest.raises(EngineUnavailableError, match="cannot reach vLLM"):
        VLLMEngine(["http://127.0.0.1:9"], ToyTokenizer())  # type: ignore[arg-type]
    eng = engine_on(server, top_k=21)  # more log-probs than the server allows: its 400 says so
    s = ReTranslator(eng, beta=0.0, max_tokens=8)
    s.update("one two")
    with pytest.raises(EngineUnavailableError, match="greater than max allowed"):
        s.update("one two three")


def test_cli_engine_options_are_checked_before_loading(capsys):
    from speclive.cli import main

    assert main(["retranslate", "--engine", "vllm", "hello there"]) == 2
    assert "--vllm-url" in capsys.readouterr().err
    assert main(["predgen", "--vllm-url", "http://127.0.0.1:9", "--no-tts", "hello"]) == 2
    assert "--engine vllm" in capsys.readouterr().err
    assert main(["live", "chat", "missing.wav", "--engine", "vllm"]) == 2
    assert "--vllm-url" in capsys.readouterr().err
    assert main(["serve", "--engine", "vllm"]) == 2
    assert "--vllm-url" in capsys.readouterr().err
    # a replica that is not there: a clear error, not a traceback
    assert main(["retranslate", "--engine", "vllm", "--vllm-url", "http://127.0.0.1:9", "hello"]) == 2
    assert "cannot reach vLLM at http://127.0.0.1:9" in capsys.readouterr().err


def test_bench_scale_runs_and_reports(lm, server, tmp_path):
    from speclive_bench.scale import ScaleBenchOptions, markdown, run_scale_bench, write_outputs

    opts = ScaleBenchOptions(
        sessions=(1, 3), rounds=1, ssbd_max_tokens=12, chat_max_tokens=12, cpm=60000.0, lag_k=6
    )
    result = run_scale_bench(opts, log=lambda m: None, engine=engine_on(server))
    summ = result["summary"]
    cells = {(r["workload"], r["sessions"], r["method"]) for r in summ}
    for n in (1, 3):
        for m in ("ar", "ssbd b=0", "ssbd b=0.2"):
            assert ("retranslate", n, m) in cells
        for m in ("prefill", "predgen"):
            assert ("chat", n, m) in cells
    for r in summ:
        assert r["samples"] > 0 and r["mean_s"] > 0
        if r["method"] in ("ssbd b=0", "predgen"):  # lossless, and the fake server is deterministic
            a, b = r["identical"].split("/")
            assert a == b and int(b) == r["sessions"]
        if r["workload"] == "retranslate" and r["method"] != "ar":  # every update compared with ar's
            a, b = (int(x) for x in r["equal_updates"].split("/"))
            assert 0 < b and a <= b and (a == b or r["method"] == "ssbd b=0.2")
    assert sum(1 for r in result["records"] if r["workload"] == "chat") == 2 * (1 + 3)
    paths = write_outputs(result, tmp_path, "scale-test", plot_it=False)
    assert "Re-translation (SSBD)" in markdown(result)
    assert {p.suffix for p in paths} == {".json", ".md"}


def test_serve_with_the_vllm_engine_forwards_chat_completions(lm, server):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from speclive.server.app import create_app
    from speclive.server.config import ServerConfig

    eng = engine_on(server)
    cfg = ServerConfig(model="toy-model", engine="vllm", vllm_urls=(server.url,))
    app = create_app(cfg, backend=eng)
    messages = [{"role": "user", "content": "tell me about the weather"}]
    prompt = ToyTokenizer().chat(messages)
    want = ToyTokenizer().decode(lm.greedy(prompt, 20, {0}))
    n = len(server.requests)
    with TestClient(app) as client:
        r = client.post(
            "/v1/chat/completions", json={"model": "toy-model", "messages": messages, "max_tokens": 20}
        )
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == want
        body = {"model": "toy-model", "messages": messages, "max_tokens": 20, "stream": True}
        with client.stream("POST", "/v1/chat/completions", json=body) as s:
            text = ""
            for line in s.iter_lines():
                if line.startswith("data: {"):
                    for c in json.loads(line[6:])["choices"]:
                        text += c.get("delta", {}).get("content") or ""
        assert text == want
    forwarded = server.requests[n:]
    assert len(forwarded) == 2 and all(q["prompt"] == prompt and q["stream"] for q in forwarded)
    with pytest.raises(ConfigError, match="--vllm-url"):
        ServerConfig(engine="vllm")
