"""Semantic turn-taking: the end-of-turn policy, the LM's end-of-message probe, and speculative
playback in the voice chat (the answer at the first short silence; a cut-off answer stops when
the user goes on, and the whole turn is answered once).

Logic runs on a scripted transcriber and a scripted audio turn model; the LM is the real
SmolLM2-135M (fp32 transformers), speech is Piper's through the real Silero VAD.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest

from speclive.asr.audio import SAMPLE_RATE, to_mono_16k
from speclive.errors import ConfigError
from speclive.live import VirtualClock, VoiceChat, play
from speclive.live.clock import chunks_of
from speclive.live.pipeline import LiveConfig
from speclive.live.turnpolicy import TurnPolicy, TurnPolicyConfig, TurnSignals
from speclive.live.vad import FRAME, TurnConfig, TurnDetector
from speclive.sessions.predictive import PredGenConfig, PredictiveResponder


# ---- the policy ------------------------------------------------------------------------------
def test_policy_bar_falls_with_the_silence_and_the_fallback_ends_every_turn():
    p = TurnPolicy(
        TurnPolicyConfig(kind="fused", threshold=0.6, min_silence_s=0.1, max_silence_s=1.1, text_weight=0.5)
    )
    assert p.bar(0.05) > 1.0  # before the first check nothing ends the turn
    assert p.bar(0.1) == pytest.approx(0.6)
    assert p.bar(0.6) == pytest.approx(0.3)
    assert p.bar(1.1) == 0.0
    sure, doubtful = TurnSignals(audio=0.9, text=0.8), TurnSignals(audio=0.9, text=0.01)
    assert p.decide(sure, 0.1) and not p.decide(sure, 0.05)
    assert not p.decide(doubtful, 0.5) and p.decide(doubtful, 1.1)
    # the geometric mean: one confident signal cannot outvote the other
    assert p.score(doubtful) == pytest.approx((0.9 * 0.01) ** 0.5)
    assert p.silence_needed(sure) == pytest.approx(0.1)
    assert 0.1 < p.silence_needed(doubtful) < 1.1
    # a missing signal: the other one decides
    assert p.score(TurnSignals(audio=0.7)) == 0.7 and p.score(TurnSignals(text=0.2)) == 0.2
    assert TurnPolicy(TurnPolicyConfig(kind="silence", max_silence_s=0.8)).score(sure) is None
    assert TurnPolicy(TurnPolicyConfig(kind="text")).score(sure) == 0.8
    assert not TurnPolicy(TurnPolicyConfig(kind="audio")).ready(TurnSignals(text=0.9))


def test_policy_presets_and_bad_settings():
    low = TurnPolicy(TurnPolicyConfig(eagerness="low")).cfg
    high = TurnPolicy(TurnPolicyConfig(eagerness="high")).cfg
    auto = TurnPolicy(TurnPolicyConfig(eagerness="auto")).cfg
    med = TurnPolicy(TurnPolicyConfig(eagerness="medium")).cfg
    assert low.threshold > high.threshold and low.max_silence_s >= high.max_silence_s
    assert (auto.threshold, auto.max_silence_s) == (med.threshold, med.max_silence_s)
    for bad in (
        {"kind": "psychic"},
        {"eagerness": "eager"},
        {"threshold": 1.5},
        {"min_silence_s": 0.0},
        {"min_silence_s": 2.0, "max_silence_s": 1.0},
        {"text_weight": -0.1},
    ):
        with pytest.raises(ConfigError):
            TurnPolicy(TurnPolicyConfig(**bad))
    with pytest.raises(ConfigError):
        VoiceChat(None, None, config=LiveConfig(turn_detection="psychic"))
    with pytest.raises(ConfigError, match="audio turn model"):
        VoiceChat(None, None, config=LiveConfig(turn_detection="semantic"))


def test_turn_detector_end_now():
    d = TurnDetector(TurnConfig())
    assert d.end_now() is None
    frames = lambda s, p: np.full(int(round(s * SAMPLE_RATE / FRAME)), p, np.float32)  # noqa: E731
    assert [c.kind for c in d.feed(frames(0.5, 0.9))] == ["start"]
    assert [c.kind for c in d.feed(frames(0.25, 0.0))] == ["pause"]
    ch = d.end_now()
    assert ch is not None and ch.kind == "end" and ch.audio_t == pytest.approx(0.512, abs=0.04)
    assert d.end_now() is None and [c.kind for c in d.feed(frames(0.2, 0.9))] == ["start"]


# ---- the LM's probe --------------------------------------------------------------------------
def test_probe_reads_the_end_of_message_row_without_changing_the_answer(hf_smol):
    q = "What is the boiling point of water?"
    plain = PredictiveResponder(hf_smol, PredGenConfig(max_tokens=12), mode="cascade").finish(q)
    r = PredictiveResponder(hf_smol, PredGenConfig(max_tokens=12))
    r.update("What is the boiling point")
    r.update(q)
    assert set(r.end_probs) == {"What is the boiling point", q}
    # the same probability as a plain forward pass over the prompt up to the user's last word
    prompt = r.prompt_ids(q)
    k = len(prompt) - r._user_suffix
    state = hf_smol.new_state()
    row = hf_smol.extend(state, prompt[:k])[-1]
    hf_smol.release(state)
    z = np.exp(row - row.max())
    assert r.end_probs[q] == pytest.approx(float(z[prompt[k]] / z.sum()), abs=1e-4)
    assert prompt[k] not in r.tok.encode(q)  # a template token, not the user's text
    # the row before it, in the same pass: the marked variant weighs the final "?" by the
    # model's own P("?") there
    prev = hf_smol.new_state()
    row_prev = hf_smol.extend(prev, prompt[: k - 1])[-1]
    hf_smol.release(prev)
    zp = np.exp(row_prev - row_prev.max())
    zp /= zp.sum()
    want = zp[prompt[k]] + zp[prompt[k - 1]] * float(z[prompt[k]] / z.sum())
    assert r.end_probs_marked[q] == pytest.approx(float(want), abs=1e-4)
    # a prefill reads it too, and the greedy answer is the cascade's
    fresh = PredictiveResponder(hf_smol, PredGenConfig(max_tokens=12))
    assert fresh.end_of_turn_prob(q) == pytest.approx(r.end_probs[q], abs=1e-4)
    assert fresh.finish(q).response == plain.response == r.finish(q).response


# ---- speculative playback --------------------------------------------------------------------
@dataclass
class _Text:
    text: str


@pytest.fixture(scope="module")
def piper():
    from speclive.tts.piper import PiperTTS

    tts = PiperTTS("piper-joe-medium", varied=False)
    tts.synthesize("Warm up.")
    return tts


@pytest.fixture(scope="module")
def llm(hf_smol):
    """The LM, warmed up: a cold first forward pass would fall behind the audio."""
    PredictiveResponder(hf_smol, PredGenConfig(max_tokens=4)).finish("Hello there.")
    return hf_smol


def _speech(piper, text: str) -> np.ndarray:
    a = piper.synthesize(text)
    return to_mono_16k(a.samples, a.sample_rate)


def _z(s: float) -> np.ndarray:
    return np.zeros(int(s * SAMPLE_RATE), np.float32)


class PiecesTranscriber:
    """Hears the first ``n`` pieces of a turn once the audio covers their end."""

    def __init__(self, pieces: list[str], ends_s: list[float]):
        self.pieces, self.ends_s = pieces, ends_s
        self.cfg = SimpleNamespace(method="specasr")

    def transcribe(self, audio, loop_fallback: bool = True, hint=None):
        heard = len(audio) / SAMPLE_RATE
        n = sum(heard >= e - 0.25 for e in self.ends_s)
        return _Text(" ".join(self.pieces[:n]))


class ScriptedTurnModel:
    """P(turn complete): ``p_end`` once the audio reaches past ``end_s`` (turn-audio seconds),
    ``p_mid`` before."""

    def __init__(self, end_s: float, p_mid: float, p_end: float):
        self.end_s, self.p_mid, self.p_end, self.calls = end_s, p_mid, p_end, 0

    def predict(self, audio: np.ndarray) -> float:
        self.calls += 1
        return self.p_end if len(audio) / SAMPLE_RATE >= self.end_s else self.p_mid


def _chat(llm, tr, model, kind="fused", tts=None, **policy):
    cfg = LiveConfig(
        turn_detection="semantic",
        policy=TurnPolicyConfig(kind=kind, **{"min_silence_s": 0.1, "max_silence_s": 1.2, **policy}),
    )
    return VoiceChat(
        llm,
        tr,
        tts=tts,
        predgen=PredGenConfig(max_tokens=16, line_breaks=True),
        config=cfg,
        clock=VirtualClock(),
        turn_model=model,
    )


def test_a_complete_turn_is_answered_at_the_first_short_silence(llm, piper):
    q = "What is the boiling point of water?"
    speech = _speech(piper, q)
    lead = 0.5
    audio = np.concatenate([_z(lead), speech, _z(2.5)])
    end = lead + len(speech) / SAMPLE_RATE
    tr = PiecesTranscriber([q], [end - lead + 0.3])  # turn audio starts 0.3 s before the VAD start
    model = ScriptedTurnModel(0.0, 0.9, 0.9)
    # a fallback far off: only the policy can end this turn early (however slow the machine)
    vc = _chat(llm, tr, model, kind="audio", threshold=0.5, max_silence_s=2.4)
    res = play(vc, audio)
    (m,) = [e for e in res.events if e.type == "turn_metrics"]
    preds = [e for e in res.events if e.type == "turn_prediction"]
    assert preds and preds[-1].end and preds[-1].audio_p == 0.9, [(round(e.t, 2), e.type) for e in res.events]
    assert m.extra["predicted"] and m.eot_delay_s < 2.4 - 0.5
    assert m.transcript == q and m.answer
    cascade = PredictiveResponder(llm, PredGenConfig(max_tokens=16, line_breaks=True), mode="cascade")
    assert m.answer == cascade.finish(q).response


def test_a_mid_turn_pause_the_models_doubt_is_not_cut_off(llm, piper):
    first, rest = "I want to learn a new language and", "which one is the easiest?"
    s1, s2 = _speech(piper, first), _speech(piper, rest)
    audio = np.concatenate([_z(0.5), s1, _z(0.9), s2, _z(2.5)])
    ends = [0.3 + len(s1) / SAMPLE_RATE, 0.3 + (len(s1) + len(s2)) / SAMPLE_RATE + 0.9]
    tr = PiecesTranscriber([first, rest], ends)
    model = ScriptedTurnModel(ends[1] - 0.1, p_mid=0.05, p_end=0.95)
    vc = _chat(llm, tr, model, kind="fused", threshold=0.3, max_silence_s=2.4)
    res = play(vc, audio)
    (m,) = [e for e in res.events if e.type == "turn_metrics"]
    assert m.transcript == f"{first} {rest}"
    ends_of_turn = [e for e in res.events if e.type == "speech_stopped" and e.end_of_turn]
    assert len(ends_of_turn) == 1  # the pause did not end the turn
    preds = [e for e in res.events if e.type == "turn_prediction"]
    assert any(not p.end and p.text_p is not None for p in preds)  # the pause was judged, and held


def test_a_cut_off_answer_stops_when_the_user_goes_on_and_the_whole_turn_is_answered(llm, piper):
    first, rest = "I have a question.", "How far away is the moon?"
    s1, s2 = _speech(piper, first), _speech(piper, rest)
    tr_ends = [0.3 + len(s1) / SAMPLE_RATE, 10.0]
    heard: list[float] = []

    def caller():
        """The first sentence, silence until the (wrongly early) answer has played 0.3 s, then
        the rest of the turn: the speaker was only pausing."""
        yield from chunks_of(np.concatenate([_z(0.5), s1]))
        silence = _z(0.05)
        for _ in range(400):
            if heard and vc.clock() >= heard[0] + 0.3:
                break
            yield silence
        tr.ends_s[1] = (sum(len(x) for x in vc.turn.audio) + len(s2)) / SAMPLE_RATE  # type: ignore[union-attr]
        yield from chunks_of(np.concatenate([s2, _z(2.5)]))

    tr = PiecesTranscriber([first, rest], tr_ends)
    model = ScriptedTurnModel(0.0, 0.99, 0.99)  # the audio model is sure both times
    vc = _chat(llm, tr, model, kind="audio", threshold=0.5, tts=piper, max_silence_s=3.0)
    res = play(vc, caller(), on_event=lambda e: heard.append(e.play_at) if e.type == "audio" else None)
    kinds = [e.type for e in res.events]
    assert heard and "interrupted" in kinds
    cut = [p for p in vc.playbacks if p["cut"]]
    assert len(cut) == 1
    resumed = next(e for e in res.events if e.type == "speech_started" and e.t > heard[0])
    assert cut[0]["end_t"] - resumed.t < FRAME / SAMPLE_RATE + 0.11  # stopped when the VAD heard it
    metrics = [e for e in res.events if e.type == "turn_metrics"]
    assert len(metrics) == 1 and metrics[0].transcript == f"{first} {rest}"  # one turn, answered once
    played = next(e for e in res.events if e.type == "interrupted").played
    assert vc.history[0] == {"role": "user", "content": first}
    assert vc.history[1]["role"] == "assistant" and (not played or vc.history[1]["content"] == played)
    assert vc.history[-2] == {"role": "user", "content": f"{first} {rest}"}


def test_cli_semantic_json_gives_each_turn_its_timeline_and_the_playbacks(tmp_path, piper, capsys):
    """Two turns in one WAV, the second with a 0.8 s pause in the middle: two turns in the JSON,
    each with the VAD's end of speech, the decision and the first audio on the input's clock."""
    from speclive.cli import main
    from speclive.tts.base import Audio, write_wav

    q1 = _speech(piper, "What is the capital of France?")
    a, b = _speech(piper, "And what about"), _speech(piper, "the capital of Spain?")
    audio = np.concatenate([_z(0.5), q1, _z(6.0), a, _z(0.8), b, _z(4.0)])
    wav = tmp_path / "two.wav"
    write_wav(wav, Audio(audio, SAMPLE_RATE, 0.0))
    args = ["live", "chat", str(wav), "--model", "smollm2-135m-instruct", "--max-tokens", "12"]
    assert main([*args, "--turn-detection", "semantic", "--eagerness", "low", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["turn_detection"] == "semantic"
    assert len(d["turns"]) == 2
    t1, t2 = d["turns"]
    assert "france" in t1["transcript"].lower() and "spain" in t2["transcript"].lower()
    for t in d["turns"]:
        assert t["speech_end_t"] <= t["decided_t"] <= t["audio_start_t"]
    pause_at = len(np.concatenate([_z(0.5), q1, _z(6.0), a])) / SAMPLE_RATE
    assert t2["speech_end_t"] > pause_at  # the pause did not end the second turn
    assert d["playbacks"] and all(p["end_t"] > p["start_t"] for p in d["playbacks"])
    assert {p["turn"] for p in d["playbacks"]} == {1, 2}
    with pytest.raises(SystemExit):
        main([*args, "--turn-detection", "psychic"])


# ---- bad input -------------------------------------------------------------------------------
def test_semantic_detection_on_silence_noise_and_clipped_speech(llm, piper):
    """Silence and noise give a no-speech notice and never run the turn model; clipped speech
    is still one turn, answered once."""
    for audio in (_z(3.0), np.random.default_rng(0).normal(0, 0.01, 3 * SAMPLE_RATE).astype(np.float32)):
        model = ScriptedTurnModel(0.0, 0.9, 0.9)
        vc = _chat(llm, PiecesTranscriber(["unused"], [9.0]), model)
        res = play(vc, audio)
        assert [e.code for e in res.events if e.type == "notice"] == ["no_speech"]
        assert model.calls == 0 and not [e for e in res.events if e.type == "turn_metrics"]
    q = "What is the boiling point of water?"
    speech = np.clip(8.0 * _speech(piper, q), -1.0, 1.0)  # hard-clipped at full scale
    tr = PiecesTranscriber([q], [0.3 + len(speech) / SAMPLE_RATE])
    vc = _chat(llm, tr, ScriptedTurnModel(0.0, 0.9, 0.9), kind="audio", threshold=0.5, max_silence_s=2.4)
    res = play(vc, np.concatenate([_z(0.5), speech, _z(3.0)]))
    (m,) = [e for e in res.events if e.type == "turn_metrics"]
    assert m.transcript == q and m.answer and m.extra["predicted"]


def test_a_speaker_who_keeps_resuming_is_cut_each_time_within_the_vad_frame(llm, piper):
    """A confident model at every pause and a speaker who goes on three times: an early answer
    stops as the VAD hears the voice again, and the whole turn is answered once."""
    pieces = ["I have a question.", "Actually two.", "No, three.", "How far away is the moon?"]
    speech = [_speech(piper, p) for p in pieces]
    heard: list[float] = []
    tr = PiecesTranscriber(pieces, [1e9] * len(pieces))

    def caller():
        yield from chunks_of(np.concatenate([_z(0.5), speech[0]]))
        for i, s in enumerate(speech[1:], start=1):
            tr.ends_s[i - 1] = sum(len(x) for x in vc.turn.audio) / SAMPLE_RATE  # type: ignore[union-attr]
            n = len(heard)
            for _ in range(1200):  # silence until this early answer has played 0.2 s
                if len(heard) > n and vc.clock() >= heard[-1] + 0.2:
                    break
                yield _z(0.05)
            yield from chunks_of(s)
        tr.ends_s[-1] = sum(len(x) for x in vc.turn.audio) / SAMPLE_RATE  # type: ignore[union-attr]
        yield from chunks_of(_z(3.0))

    vc = _chat(
        llm, tr, ScriptedTurnModel(0.0, 0.99, 0.99), kind="audio", threshold=0.5, tts=piper, max_silence_s=3.0
    )
    res = play(vc, caller(), on_event=lambda e: heard.append(e.play_at) if e.type == "audio" else None)
    starts = [e.t for e in res.events if e.type == "speech_started"]
    # an early answer still playing when the voice came back stopped there (a short one may
    # have ended on its own); every early answer heard stays in the history
    assert sum(e.type == "interrupted" for e in res.events) >= 1
    cut = [p for p in vc.playbacks if p["cut"]]
    assert cut
    for p in cut:
        assert min(abs(p["end_t"] - t) for t in starts) < 0.11
    metrics = [e for e in res.events if e.type == "turn_metrics"]
    assert len(metrics) == 1 and metrics[0].transcript == " ".join(pieces)
    assert sum(m["role"] == "assistant" for m in vc.history) >= 2  # what was heard, and the answer
