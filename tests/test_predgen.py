"""PredGen predictive responder on real models: SmolLM2-135M + the Piper joe-medium voice.

Greedy verification must reproduce the plain cascade token for token (fp32 transformers);
pre-synthesized audio is used exactly when the first sentence survives; the honest clock
counts compute time; bad input is handled.
"""

from __future__ import annotations

import json
import time
import wave

import pytest

from speclive.backends.base import common_prefix_len
from speclive.cli import main
from speclive.errors import ConfigError, ContextOverflowError, SessionClosedError
from speclive.sessions import predictive
from speclive.sessions.predictive import PredictiveResponder, chat_prompt
from speclive.sessions.simulate import simulate_user, word_arrivals
from speclive.tts.sentences import first_sentence_end, split_sentences

SMALL = "smollm2-135m-instruct"
PROMPTS = [
    "Give me two tips for staying focused while working from home.",
    "What is the boiling point of water at sea level?",
    "Describe a sunset over the ocean in a few words.",
]


@pytest.fixture(scope="module")
def piper():
    from speclive.tts.piper import PiperTTS

    tts = PiperTTS("piper-joe-medium")
    tts.synthesize("Warm up.")
    return tts


# ---- pure helpers -----------------------------------------------------------------------------
def test_sentence_ends():
    assert first_sentence_end("Hello there. How") == len("Hello there.")
    assert first_sentence_end("Pi is 3.14 and") == -1  # a decimal point is no sentence end
    assert first_sentence_end("Done!") == -1  # not confirmed until the next character
    assert first_sentence_end("Done!", complete=True) == 5
    assert first_sentence_end("1. Apples are red. Pears") == len("1. Apples are red.")
    assert first_sentence_end("Really?! Yes") == len("Really?!")
    assert split_sentences("It is red. Is it blue? Yes it is!") == ["It is red.", "Is it blue?", "Yes it is!"]
    assert first_sentence_end("See e.g. this. And") == len("See e.g. this.")


def test_a_first_clause_of_enough_words_ends_the_first_unit():
    text = "The capital of France is Paris, which is known for art. More"
    assert first_sentence_end(text, clause_words=4) == len("The capital of France is Paris,")
    assert first_sentence_end(text, clause_words=8) == len(
        "The capital of France is Paris, which is known for art."
    )
    assert first_sentence_end("Sure, here is a haiku: rain", clause_words=4) == len("Sure, here is a haiku:")
    assert first_sentence_end("Yes. Paris, the capital, is big", clause_words=1) == len(
        "Yes."
    )  # sentence first
    assert first_sentence_end("It costs 1,000 dollars. Yes", clause_words=2) == len("It costs 1,000 dollars.")
    assert first_sentence_end("One two three four five", clause_words=4) == -1  # no clause end yet


def test_a_long_first_unit_ends_after_max_words_at_a_word_that_does_not_hang():
    text = "Octopuses have three hearts and blue blood which pumps"
    # the sixth word "and" would hang: the unit takes the next word that does not
    assert first_sentence_end(text, max_words=4) == len("Octopuses have three hearts")
    assert first_sentence_end(text, max_words=5) == len("Octopuses have three hearts and blue")
    # the cut waits until the next word has begun (a mark may still follow the space)
    assert first_sentence_end("Octopuses have three hearts ", max_words=4) == -1
    # a sentence or clause that ends sooner comes first
    assert first_sentence_end("Yes. Octopuses have three hearts and", max_words=2) == len("Yes.")
    well = "Well, octopuses have three hearts and"
    assert first_sentence_end(well, clause_words=1, max_words=3) == len("Well,")
    assert first_sentence_end("Octopuses have hearts. Three of", max_words=3) == len("Octopuses have hearts.")
    # a run of hanging words ends after the slack
    assert first_sentence_end("I was in the of to a an it", max_words=2) == len("I was in the of")
    assert first_sentence_end(text, max_words=0) == -1  # off
    assert first_sentence_end("Two words", complete=True, max_words=6) == len("Two words")


def test_word_arrivals_at_600_cpm():
    arr = word_arrivals("ab cd", 600)  # 10 characters per second
    assert arr == [("ab", pytest.approx(0.2)), ("cd", pytest.approx(0.5))]
    with pytest.raises(ValueError):
        word_arrivals("a", 0)


class _Recorder:
    """Only the session protocol; each update costs real time, to check the clock."""

    supports_deadline = False

    def __init__(self, cost_s: float):
        self.cost, self.calls = cost_s, []

    def update(self, partial):
        self.calls.append(partial)
        time.sleep(self.cost)

    def finish(self, final):
        self.calls.append(("final", final))
        return "done"


def test_honest_clock_counts_compute_and_overrun():
    # 10 chars/s: words end at 0.1, 0.3, 0.5, 0.7 s; each update takes 0.25 s
    rec = _Recorder(0.25)
    result, tl = simulate_user(rec, "a b c d", cpm=600)
    assert result == "done" and rec.calls[-1] == ("final", "a b c d")
    # poll at 0.1 ("a"); busy until 0.35 -> "a b" (0.3 arrived); busy until ~0.6 -> "a b c";
    # busy until ~0.85 > 0.7: the finish waits ~0.15 s for the session
    assert rec.calls[:3] == ["a", "a b", "a b c"]
    # ~0.15 s; sleeps only ever overshoot, so a loaded machine can only make it longer
    assert 0.1 <= tl["wait_s"] < 0.6
    fast = _Recorder(0.0)
    _, tl = simulate_user(fast, "a b c d", cpm=600)
    assert fast.calls[:3] == ["a", "a b", "a b c"] and tl["wait_s"] == 0.0


# ---- real model ---------------------------------------------------------------------------------
def _answer(backend, prompt, **kw):
    s = PredictiveResponder(backend, max_tokens=40, speak_rest=False, **kw)
    try:
        resp, tl = simulate_user(s, prompt, cpm=600)
    finally:
        s.close()
    return resp, tl, s


def test_greedy_reproduces_the_cascade_exactly(hf_smol):
    drafted = accepted = 0
    bases = {}
    for prompt in PROMPTS:
        base, _, _ = bases[prompt] = _answer(hf_smol, prompt, baseline=True)
        pred, tl, s = _answer(hf_smol, prompt, verifier="greedy")
        assert pred.token_ids == base.token_ids, prompt
        assert pred.response == base.response and pred.first_sentence == base.first_sentence
        # it speculated on partial prompts (how many depends on the machine's speed)
        assert tl["updates"] and tl["updates"][0]["words"] < len(prompt.split())
        drafted += sum(u.drafted for u in s.updates)
        accepted += sum(u.accepted for u in s.updates)
    # earlier candidates were drafted and (SmolLM2 changes its mind a lot) some were reused
    assert drafted > 0 and accepted > 0
    # verifying the first sentence in chunks gives the same answer too
    chunked, _, _ = _answer(hf_smol, PROMPTS[0], verifier="greedy", first_pass="chunks")
    assert chunked.token_ids == bases[PROMPTS[0]][0].token_ids


def test_presynthesized_audio_is_used_when_the_first_sentence_survives(hf_smol, piper):
    prompt = PROMPTS[1]
    s = PredictiveResponder(hf_smol, tts=piper, max_tokens=40, speak_rest=False)
    u = s.update(prompt)  # the user's last words were already heard
    assert u.resynthesized and u.tts_s > 0 and s.presynth is not None
    resp = s.finish(prompt)
    assert resp.presynth_used and resp.first_sentence == s.presynth[0]
    # the candidate was made for this very prompt: its first sentence needs no pass at all
    assert resp.nfetfs == 0
    assert resp.audio_latency_s == pytest.approx(resp.ttfs_s)
    assert resp.first_audio is not None and resp.first_audio.duration_s > 0.3
    s.close()

    # verified in cost-curve-sized chunks, the surviving sentence still plays at once
    c = PredictiveResponder(hf_smol, tts=piper, max_tokens=40, speak_rest=False, first_pass="chunks")
    heard = prompt.lower()  # the last partial transcript differs (in case only)
    c.update(heard)
    rc = c.finish(prompt)
    assert rc.presynth_used and rc.token_ids == resp.token_ids and rc.nfetfs >= 1
    # verified in one pass, the whole surviving first sentence costs exactly one
    o = PredictiveResponder(hf_smol, tts=piper, max_tokens=40, speak_rest=False)
    o.update(heard)
    ro = o.finish(prompt)
    assert ro.presynth_used and ro.token_ids == resp.token_ids and ro.nfetfs == 1
    o.close()
    c.close()
    with pytest.raises(ConfigError, match="first_pass"):
        PredictiveResponder(hf_smol, first_pass="half")

    base = PredictiveResponder(hf_smol, tts=piper, max_tokens=40, speak_rest=False, baseline=True)
    b = base.finish(prompt)
    assert not b.presynth_used and b.nfetfs > 1
    assert b.audio_latency_s == pytest.approx(b.ttfs_s + b.first_audio.synth_s)
    assert b.token_ids == resp.token_ids
    base.close()


def test_deadline_yields_and_the_next_update_reuses_the_partial_candidate(hf_smol, piper):
    prompt = PROMPTS[1]
    s = PredictiveResponder(hf_smol, tts=piper, max_tokens=40, speak_rest=False)
    u = s.update(prompt, deadline=time.perf_counter())  # newer input is already waiting
    assert 1 <= len(s.candidate) < 40 and u.first_sentence == "" and s.presynth is None
    partial = list(s.candidate)
    u2 = s.update(prompt)  # no deadline: resumes the cut-off candidate, finishes the sentence
    assert s.candidate[: len(partial)] == partial and u2.drafted == 0  # continued, not re-verified
    assert u2.first_sentence and s.presynth is not None
    resp = s.finish(prompt)
    base = PredictiveResponder(hf_smol, max_tokens=40, speak_rest=False, baseline=True)
    assert resp.token_ids == base.finish(prompt).token_ids and resp.presynth_used
    s.close()
    base.close()


def test_a_stable_first_sentence_is_presynthesized_even_when_it_overruns(hf_smol, piper):
    """A first sentence whose synthesis never fits before the next word (a long sentence, fast
    speech) is still pre-synthesized once it survives a verification against newer input;
    with ``presynth_stable=False`` (bench option ``@fits``) it never is."""
    prompt = PROMPTS[1]
    for stable in (True, False):
        s = PredictiveResponder(hf_smol, tts=piper, max_tokens=40, speak_rest=False, presynth_stable=stable)
        s._synth_per_char = 10.0  # as measured on a slow voice: no synthesis fits in 60 s
        u1 = s.update(prompt, deadline=time.perf_counter() + 60)
        assert u1.first_sentence and not u1.resynthesized and s.presynth is None
        u2 = s.update(prompt, deadline=time.perf_counter() + 60)  # verified again: it survives
        assert u2.first_sentence == u1.first_sentence
        assert u2.resynthesized == stable and (s.presynth is not None) == stable
        resp = s.finish(prompt)
        assert resp.presynth_used == stable
        s.close()
    # ``presynth_eager`` (bench option ``@eager``): synthesized the first time it is seen
    s = PredictiveResponder(hf_smol, tts=piper, max_tokens=40, speak_rest=False, presynth_eager=True)
    s._synth_per_char = 10.0
    u1 = s.update(prompt, deadline=time.perf_counter() + 60)
    assert u1.first_sentence and u1.resynthesized and s.presynth is not None
    assert s.finish(prompt).presynth_used
    s.close()


def test_simulated_user_passes_the_next_arrival_as_deadline():
    class _Yielding(_Recorder):
        supports_deadline = True

        def update(self, partial, deadline=None):
            self.calls.append((partial, deadline - time.perf_counter()))

    rec = _Yielding(0.0)
    simulate_user(rec, "a b c d", cpm=600)  # words end at 0.1, 0.3, 0.5, 0.7 s
    assert [c[0] for c in rec.calls[:3]] == ["a", "a b", "a b c"]
    # the next word arrives 0.2 s after each poll; a late poll (a loaded machine) only leaves
    # less, so the bound is one-sided: the current word's arrival (0 s) or the one after the
    # next (0.4 s) would fail it
    assert all(0.1 < c[1] <= 0.2 + 1e-3 for c in rec.calls[:3]), rec.calls[:3]


@pytest.mark.parametrize("verifier", ["topk:3", "reflection"])
def test_relaxed_verifiers_run(llama_smol, verifier):
    # updates without deadlines: each one verifies the previous candidate, whatever the load
    words = PROMPTS[0].split()
    s = PredictiveResponder(llama_smol, verifier=verifier, max_tokens=40, speak_rest=False)
    for n in range(max(1, len(words) - 3), len(words)):
        s.update(" ".join(words[:n]))
    resp = s.finish(PROMPTS[0])  # the last word is new: the candidate is verified
    assert resp.response and resp.first_sentence and resp.nfetfs >= 1
    assert sum(u.drafted for u in s.updates) > 0
    s.close()


def test_rewritten_partials_and_bad_input(hf_smol):
    s = PredictiveResponder(hf_smol, max_tokens=24, speak_rest=False)
    assert s.update("   ").candidate == ""
    s.update("Tell me about dogs and")
    s.update("Tell me about cats")  # an ASR revision rewrote the tail
    with pytest.raises(ContextOverflowError):
        s.update("word " * 9000)
    s.update("Tell me about cats in two sentences")  # still usable
    resp = s.finish()
    base = PredictiveResponder(hf_smol, max_tokens=24, baseline=True)
    assert resp.token_ids == base.finish("Tell me about cats in two sentences").token_ids
    with pytest.raises(SessionClosedError):
        s.finish()
    with pytest.raises(SessionClosedError):
        s.update("more")
    with pytest.raises(ConfigError, match="allowed values"):
        PredictiveResponder(hf_smol, verifier="magic")
    with pytest.raises(ConfigError, match="empty prompt"):
        PredictiveResponder(hf_smol).finish("  ")
    s.close()
    base.close()


def test_cli_json_and_wav(capsys, tmp_path):
    wav = tmp_path / "answer.wav"
    rc = main(["predgen", "--model", SMALL, "--max-tokens", "24", "--json", "--wav", str(wav), PROMPTS[1]])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"response", "first_sentence", "metrics"}
    assert set(out["metrics"]) >= {"ttfs_ms", "nfetfs", "audio_latency_ms", "presynth_used"}
    with wave.open(str(wav)) as w:
        assert w.getframerate() == 22050 and w.getnframes() > 0
    rc = main(
        ["predgen", "--model", SMALL, "--no-tts", "--baseline", "--json", "--max-tokens", "16", "Hi there"]
    )
    assert rc == 0 and json.loads(capsys.readouterr().out)["metrics"]["presynth_used"] is False
    rc = main(["predgen", "--verifier", "magic", "hello"])
    assert rc == 2 and "allowed values" in capsys.readouterr().err


def test_bench_classifies_greedy_divergences(llama_smol):
    """The predgen bench's exactness check: at the first token where a greedy answer differs
    from the baseline's, plain AR's top-2 gap decides near-tie or BUG. A token changed where
    AR is sure must be a BUG; the prompt is the one the session answered (whitespace of the
    spoken question normalized, so a question with line breaks is checked correctly)."""
    import numpy as np
    from test_exactness import first_divergence, greedy_reference

    from speclive_bench.predgen import _mark_agreement, check_greedy_exactness

    question = "Name three colours.\nThen name\ttwo animals."
    base, _ = simulate_user(PredictiveResponder(llama_smol, baseline=True, max_tokens=24), question)
    ids = list(base.token_ids)
    prompt = PredictiveResponder(llama_smol).prompt_ids(" ".join(question.split()))
    # the top-2 gap of every step in one AR pass: change the token where AR is surest (within
    # the prefix this pass shares with the session's answer)
    ref, gaps = greedy_reference(llama_smol, prompt, len(ids))
    same, _ = first_divergence(ref, ids, gaps)
    pos = int(np.argmax(gaps[: max(1, same)]))
    assert gaps[pos] > 1.0
    wrong = ids[:pos] + [(ids[pos] + 1) % llama_smol.vocab_size]
    rec = {"id": 1, "turn": 1, "question": question}
    records = [
        {**rec, "method": "baseline", "token_ids": ids, "first_sentence": "", "response": base.response},
        {**rec, "method": "greedy", "token_ids": ids, "first_sentence": ""},
        {**rec, "method": "greedy@fits", "token_ids": wrong, "first_sentence": ""},
        {**rec, "method": "topk:3", "token_ids": wrong, "first_sentence": ""},
    ]
    _mark_agreement(records)
    found = check_greedy_exactness(records, llama_smol)  # the default bar: NEAR_TIE_GAP
    assert [(d["method"], d["position"], d["verdict"]) for d in found] == [("greedy@fits", pos, "bug")]
    assert found[0]["rerun_matches_ref"]  # AR re-run on the normalized prompt reproduces the baseline


def test_a_long_conversation_drops_its_oldest_turns_to_fit_the_context(llama_smol):
    turn = "Tell me more about the history of the Roman empire and its emperors, please. " * 8
    history = []
    for i in range(30):
        history += [{"role": "user", "content": f"{i}: {turn}"}, {"role": "assistant", "content": turn}]
    s = PredictiveResponder(llama_smol, max_tokens=64, history=history)
    ids = s.prompt_ids("And what came after?")
    assert len(ids) + 64 <= llama_smol.n_ctx
    text = llama_smol.tokenizer.decode(ids)
    assert "29: Tell me" in text and "0: Tell me" not in text  # the newest turns stay
    assert len(chat_prompt(llama_smol.tokenizer, "And what came after?", history)) > llama_smol.n_ctx
    # the cut leaves the history at most half the window, so the conversation can grow back
    room = llama_smol.n_ctx - 64 - predictive.USER_ROOM
    kept = history[2 * s.left_out :]
    assert len(chat_prompt(llama_smol.tokenizer, "", kept, s.cfg.system)) <= room * predictive.SHIFT_TO
    assert len(chat_prompt(llama_smol.tokenizer, "", history[2 * s.left_out - 2 :], s.cfg.system)) > (
        room * predictive.SHIFT_TO
    )  # and leaves out no more turns than that takes
    short = PredictiveResponder(llama_smol, max_tokens=64, history=history[-2:])
    assert short.prompt_ids("Hi") == chat_prompt(llama_smol.tokenizer, "Hi", history[-2:])
    # a message too long for the room left makes that prompt leave out more turns, not the cut
    long_q = "Why? " * 300
    ids = s.prompt_ids(long_q)
    assert len(ids) + 64 <= llama_smol.n_ctx and s.left_out == (len(history) - len(kept)) // 2
    assert "Why? Why?" in llama_smol.tokenizer.decode(ids)


def test_a_growing_conversation_keeps_its_prompts_start_between_rare_cuts(llama_smol):
    """Turn after turn the prompt begins the same way (its cache is extended, not evaluated
    again) until the history outgrows the window; then half of it goes at once."""
    turn = "Tell me about the Roman emperors, their wars and their cities, please. " * 3
    s = PredictiveResponder(llama_smol, max_tokens=64, context_tokens=1024)
    history: list[dict[str, str]] = []
    previous: list[int] = []
    cuts = []
    for i in range(40):
        history += [{"role": "user", "content": f"{i}: {turn}"}, {"role": "assistant", "content": turn}]
        left_out = s.left_out
        s.restart(history)
        ids = s.prompt_ids("And then?")
        assert len(ids) + 64 <= 1024  # the session's window, not the model's whole context
        shared = common_prefix_len(previous, ids)
        if s.left_out != left_out:
            cuts.append(i)
            assert shared < len(previous) // 2  # the cut: the prompt's start changed
        elif previous:
            assert shared >= len(previous) - 16  # all but the last message: its cache is reused
        previous = ids
    per_turn = len(chat_prompt(llama_smol.tokenizer, "", history[-2:], s.cfg.system)) - len(
        chat_prompt(llama_smol.tokenizer, "", [], s.cfg.system)
    )
    half = (1024 - 64 - predictive.USER_ROOM) * predictive.SHIFT_TO
    assert len(cuts) >= 2, "40 turns outgrow a 1024-token window more than once"
    # each cut frees about half the window, so the next one comes that many turns later
    assert all(b - a >= half // per_turn - 1 for a, b in zip(cuts, cuts[1:], strict=False))
    # the cut follows from the histories alone: a fresh responder restarted turn by turn (as
    # ``bench longconv`` checks a session's answers) leaves out the same turns
    fresh = PredictiveResponder(llama_smol, max_tokens=64, context_tokens=1024)
    for n in range(2, len(history) + 1, 2):
        fresh.restart(history[:n])
    assert fresh.left_out == s.left_out and fresh.prompt_ids("And then?") == s.prompt_ids("And then?")
    with pytest.raises(ConfigError, match="context_tokens"):
        PredictiveResponder(llama_smol, max_tokens=64, context_tokens=150)


def test_a_long_history_is_fitted_with_few_tokenizations(monkeypatch):
    """Which turns fit is found by bisection: a conversation of 400 turns tokenizes its prompt
    about log2(400) times per pass, not once for each turn it leaves out."""
    from speclive.sessions import predictive

    calls = []
    monkeypatch.setattr(
        predictive,
        "chat_prompt",
        lambda tok, partial, hist, system: calls.append(1) or [0] * (10 + 5 * len(hist)),
    )
    history = [{"role": r, "content": "x"} for _ in range(400) for r in ("user", "assistant")]
    r = PredictiveResponder.__new__(PredictiveResponder)
    r.history, r.tok, r.left_out = history, None, 0
    r.cfg = predictive.PredGenConfig(max_tokens=100)
    r.backend = type("B", (), {"n_ctx": 1110})()
    ids = r.prompt_ids("q")
    assert len(ids) == 10 + 5 * 200  # 100 turns kept: 200 messages of 5 tokens fill the budget
    assert len(calls) <= 2 + 10


def test_a_restarted_responder_keeps_its_cache_and_answers_as_a_fresh_one(hf_smol, monkeypatch):
    q1, q2 = "What is the boiling point of water?", "And its freezing point?"
    r = PredictiveResponder(hf_smol, max_tokens=12)
    for w in ("What is", "What is the boiling"):
        r.update(w)
    a1 = r.finish(q1).response
    history = [{"role": "user", "content": q1}, {"role": "assistant", "content": a1}]
    state = r.decoder.state
    r.restart(history)  # the next turn of the same conversation
    assert r.decoder.state is state and state.tokens and r.candidate == [] and not r.finished
    kept: list[int] = []  # the state's length before each evaluation on it
    extend = hf_smol.extend

    def counting(st, tokens, parents=None, last_only=False, skip=0):
        if st is state:
            kept.append(len(st.tokens))
        return extend(st, tokens, parents, last_only, skip)

    monkeypatch.setattr(hf_smol, "extend", counting)
    r.update("And its")
    second = r.finish(q2)
    monkeypatch.undo()
    # the second turn's prompt holds the first turn's: that prefix was never dropped and
    # evaluated again (every evaluation on the state extended a cache that still held it)
    first_prompt = chat_prompt(hf_smol.tokenizer, q1, [], r.cfg.system)
    assert kept and min(kept) >= len(first_prompt), (kept, len(first_prompt))
    assert r.prompt_ids(q2)[: len(first_prompt)] == first_prompt
    fresh = PredictiveResponder(hf_smol, max_tokens=12, history=history)
    assert second.response == fresh.finish(q2).response  # lossless: the reused cache changes nothing
    fresh.close()
    r.close()
