"""Live speech pipelines: turn taking, the honest clock, voice chat and live translation.

Logic runs on synthetic VAD probabilities and a scripted transcriber (fast, deterministic);
exactness runs the real SmolLM2-135M (fp32 transformers) with real Piper speech through the
real Silero VAD: greedy PredGen gives the cascade's answer token for token.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest

from speclive.asr.audio import SAMPLE_RATE, to_mono_16k
from speclive.cli import main
from speclive.errors import ConfigError
from speclive.live import LiveTranscriber, LiveTranslator, TurnConfig, VirtualClock, VoiceChat, play
from speclive.live.clock import WallClock, chunks_of
from speclive.live.pipeline import LiveConfig, as_mono_16k
from speclive.live.vad import FRAME, StreamingVAD, TurnDetector
from speclive.sessions.predictive import PredGenConfig
from speclive.sessions.retranslate import RetranslateConfig, ReTranslator

QUESTIONS = [
    "What is the boiling point of water at sea level?",
    "Give me two tips for staying focused while working from home.",
    "Describe a sunset over the ocean in a few words.",
]


# ---- turn detection on synthetic probabilities ----------------------------------------------
def _frames(seconds: float, p: float) -> np.ndarray:
    return np.full(int(round(seconds * SAMPLE_RATE / FRAME)), p, np.float32)


def test_turn_detector_start_pause_resume_end():
    det = TurnDetector(TurnConfig(min_speech_s=0.1, pause_s=0.2, end_s=0.5))
    probs = np.concatenate(
        [_frames(0.5, 0.0), _frames(1.0, 0.9), _frames(0.3, 0.0), _frames(0.6, 0.9), _frames(1.0, 0.0)]
    )
    kinds = [(c.kind, round(c.audio_t, 2)) for c in det.feed(probs)]
    assert [k for k, _ in kinds] == ["start", "pause", "resume", "pause", "end"]
    frame = FRAME / SAMPLE_RATE
    assert kinds[0][1] == pytest.approx(0.5, abs=2 * frame)  # speech started at 0.5 s
    assert kinds[-1][1] == pytest.approx(2.4, abs=2 * frame)  # and last ended at 2.4 s
    # a short blip is not a turn
    det2 = TurnDetector(TurnConfig(min_speech_s=0.2))
    assert det2.feed(np.concatenate([_frames(0.1, 0.9), _frames(1.0, 0.0)])) == []


def test_no_partial_pass_starts_while_a_pause_may_be_starting():
    """A partial transcription pass waits while the VAD hears silence shorter than ``pause_s``:
    the pause's final pass would otherwise wait for it."""
    from speclive.live.pipeline import LivePipeline, _Turn

    pipe = LivePipeline(ScriptedTranscriber("one two", 1.0, 0.3), LiveConfig(turn=TurnConfig(pause_s=0.2)))
    det = pipe.turns
    det.feed(_frames(2.0, 0.9))  # speaking for 2 s: a partial pass is due (step 1 s)
    turn = _Turn(1, start_t=0.0, audio=[np.zeros(2 * SAMPLE_RATE, np.float32)])
    assert det.silence_s == 0.0 and pipe._asr_due(turn)
    det.feed(_frames(0.1, 0.0))  # 0.1 s of silence: a pause may be starting
    assert 0.0 < det.silence_s < 0.2 and not pipe._asr_due(turn)
    det.feed(_frames(0.05, 0.9))  # the voice goes on
    assert det.silence_s == 0.0 and pipe._asr_due(turn)
    turn.speech_end_t = 2.0  # paused: the final pass covers it
    assert not pipe._asr_due(turn)


def test_a_turn_left_behind_is_freed_without_the_cycle_collector():
    """Nothing of a turn refers back to it (its streaming recognizer holds the passes, not the
    turn): when the pipeline lets go of a turn, reference counting frees it and its audio at
    once. A cycle would keep every turn's audio until Python's cycle collector ran."""
    import gc
    import weakref

    from speclive.live.pipeline import LivePipeline
    from speclive.live.vad import TurnChange

    pipe = LivePipeline(ScriptedTranscriber("one two", 1.0, 0.3), LiveConfig(turn=TurnConfig(pause_s=0.2)))
    pipe.recent = [np.zeros(SAMPLE_RATE, np.float32)]
    pipe.received = SAMPLE_RATE
    was = gc.isenabled()
    gc.disable()
    try:
        pipe._turn_change(TurnChange("start", 0.5, 0.5), 0)
        turn = weakref.ref(pipe.turn)
        assert pipe.turn.asr is not None and pipe.turn.audio  # a streaming turn with its audio
        pipe.turn = None
        assert turn() is None
    finally:
        if was:
            gc.enable()


def test_turn_detector_caps_long_turns_and_validates():
    det = TurnDetector(TurnConfig(max_turn_s=2.0))
    kinds = [c.kind for c in det.feed(_frames(3.0, 0.9))]
    assert kinds[:2] == ["start", "capped"]
    with pytest.raises(ConfigError):
        TurnConfig(pause_s=0.6, end_s=0.5).validate()
    with pytest.raises(ConfigError):
        TurnConfig(threshold=1.5).validate()


def test_streaming_vad_equals_one_pass():
    from faster_whisper.vad import get_vad_model

    rng = np.random.default_rng(0)
    audio = (0.3 * np.sin(np.arange(3 * SAMPLE_RATE) * 0.07) * rng.random(3 * SAMPLE_RATE)).astype(np.float32)
    audio = audio[: len(audio) // FRAME * FRAME]
    whole = get_vad_model()(audio).ravel()
    vad = StreamingVAD()
    parts = [vad(audio[i : i + 1234]) for i in range(0, len(audio), 1234)]  # chunks unaligned to frames
    assert np.allclose(np.concatenate(parts), whole)


def test_pcm_conversion():
    stereo44 = np.zeros((44100, 2), np.int16)
    stereo44[:, 0] = 16384
    mono = as_mono_16k(stereo44, 44100)
    assert mono.dtype == np.float32 and len(mono) == SAMPLE_RATE
    assert mono[100:200].mean() == pytest.approx(0.25, abs=0.01)
    with pytest.raises(ConfigError):
        as_mono_16k(np.zeros(10, np.int32))


# ---- clocks -------------------------------------------------------------------------------
def test_virtual_clock_charges_compute_and_skips_idle():
    c = VirtualClock()
    c.wait_until(10.0)  # idle: no sleeping
    assert 10.0 <= c() < 10.5  # only the compute since then is added (more on a loaded machine)
    time.sleep(0.05)  # compute is charged
    assert 10.05 <= c() < 10.5  # a sleep never undershoots; a loaded machine may overshoot
    c.wait_until(5.0)  # the past: nothing happens
    assert c() > 10.0
    w = WallClock()
    w.wait_until(0.05)
    assert w() >= 0.05


class _BusyPipeline:
    """Each push costs ``cost`` seconds of compute: the input queues up behind it."""

    def __init__(self, cost: float):
        self.clock = VirtualClock()
        self.cost, self.pushed = cost, 0

    def push(self, chunk):
        time.sleep(self.cost)
        self.pushed += len(chunk)
        return []

    def step(self, deadline=None):
        return None

    def close(self):
        return []


def test_play_reports_queueing():
    fast = _BusyPipeline(0.0)
    res = play(fast, np.zeros(SAMPLE_RATE, np.float32), chunk_s=0.1)
    # no compute, no lag (but what a loaded machine adds): 10 chunks behind would be 0.5 s
    assert fast.pushed == SAMPLE_RATE and res.max_lag_s < 0.15
    slow = _BusyPipeline(0.15)  # 0.15 s of work per 0.1 s of audio: it falls behind
    res = play(slow, np.zeros(SAMPLE_RATE, np.float32), chunk_s=0.1)
    assert res.max_lag_s > 0.3


# ---- pipelines over a scripted transcriber -------------------------------------------------
@dataclass
class _Text:
    text: str


class ScriptedTranscriber:
    """Transcribes a known utterance: the words spoken so far, by audio duration (partials grow
    like a streaming recognizer's), and the whole text once the audio covers the speech."""

    def __init__(self, text: str, speech_s: float, lead_s: float):
        self.words, self.speech_s, self.lead_s = text.split(), speech_s, lead_s
        self.cfg = SimpleNamespace(method="specasr")
        self.calls = 0

    def transcribe(self, audio, loop_fallback: bool = True, hint=None):
        self.calls += 1
        # the VAD ends speech a little before the synthetic voice's last sample
        heard = max(0.0, len(audio) / SAMPLE_RATE - self.lead_s + 0.4)
        n = len(self.words) if heard >= self.speech_s else int(len(self.words) * heard / self.speech_s)
        return _Text(" ".join(self.words[:n]))


@pytest.fixture(scope="module")
def piper():
    from speclive.tts.piper import PiperTTS

    tts = PiperTTS("piper-joe-medium", varied=False)
    tts.synthesize("Warm up.")
    return tts


def _spoken(piper, text: str, lead: float = 0.5, tail: float = 1.2) -> tuple[np.ndarray, float]:
    a = piper.synthesize(text)
    speech = to_mono_16k(a.samples, a.sample_rate)
    z = lambda s: np.zeros(int(s * SAMPLE_RATE), np.float32)  # noqa: E731
    return np.concatenate([z(lead), speech, z(tail)]), len(speech) / SAMPLE_RATE


def _run_chat(backend, piper, text, mode, tts=None, **kw):
    audio, speech_s = _spoken(piper, text)
    tr = ScriptedTranscriber(text, speech_s, lead_s=0.3)  # the turn audio starts 0.3 s early
    vc = VoiceChat(
        backend,
        tr,
        tts=tts,
        mode=mode,
        predgen=PredGenConfig(max_tokens=32, line_breaks=True),
        clock=VirtualClock(),
        **kw,
    )
    res = play(vc, audio)
    return vc, res


def _turns(res):
    return [e for e in res.events if e.type == "turn_metrics"]


def test_voicechat_greedy_equals_the_cascade(hf_smol, piper):
    speculated = 0
    for q in QUESTIONS:
        answers = {}
        for mode in ("cascade", "predgen", "prefill", "preemptive"):
            vc, res = _run_chat(hf_smol, piper, q, mode)
            (m,) = _turns(res)
            assert m.transcript == q
            answers[mode] = m.answer
            types = [e.type for e in res.events]
            assert (
                types.index("speech_started") < types.index("transcript_final") < types.index("turn_metrics")
            )
            assert m.latency_s is not None and m.latency_s >= m.eot_delay_s - 1e-6
            if mode == "predgen":
                speculated += sum(e.type == "speculation" for e in res.events)
            if mode == "cascade":  # nothing runs before the end of the turn
                assert not any(e.type in ("speculation", "transcript_partial") for e in res.events)
        assert len(set(answers.values())) == 1, answers
    assert speculated > 0


def test_voicechat_audio_barge_in_and_history(hf_smol, piper):
    q1, q2 = QUESTIONS[0], QUESTIONS[2]
    a1, s1 = _spoken(piper, q1, tail=0.0)
    a2, s2 = _spoken(piper, q2, lead=0.0)
    heard: list[float] = []  # when the first answer audio plays

    def caller():
        """The first question, silence until its answer is heard (however long the machine
        takes to answer), 0.3 s more of it, then the second question: during the answer."""
        yield from chunks_of(a1)
        silence = np.zeros(int(0.1 * SAMPLE_RATE), np.float32)
        for _ in range(600):  # at most a minute of it
            if heard and vc.clock() >= heard[0] + 0.3:
                break
            yield silence
        yield from chunks_of(a2)

    class TwoTurns(ScriptedTranscriber):
        def transcribe(self, audio, loop_fallback=True, hint=None):
            return _Text(q1 if self.calls_for(audio) == 1 else q2)

        def calls_for(self, audio):
            return 1 if vc.n_turns == 1 else 2

    tr = TwoTurns(q1, s1, 0.3)
    vc = VoiceChat(hf_smol, tr, tts=piper, predgen=PredGenConfig(max_tokens=40), clock=VirtualClock())
    res = play(vc, caller(), on_event=lambda e: heard.append(e.play_at) if e.type == "audio" else None)
    kinds = [e.type for e in res.events]
    assert heard and "interrupted" in kinds
    chunks = [e for e in res.events if e.type == "audio"]
    assert chunks and all(c.samples.size and c.sample_rate == piper.sample_rate for c in chunks)
    assert chunks[0].play_at >= [e.t for e in res.events if e.type == "speech_stopped" and e.end_of_turn][0]
    inter = next(e for e in res.events if e.type == "interrupted")
    # the history keeps what was played before the barge-in, then the second turn
    assert vc.history[0] == {"role": "user", "content": q1}
    if inter.played:
        assert vc.history[1] == {"role": "assistant", "content": inter.played}
    assert vc.history[-2] == {"role": "user", "content": q2}
    assert len(_turns(res)) >= 2
    # a conversation keeps its answers' text, not their audio (sent as events already)
    assert vc.answers and all(not a.audio and a.first_audio is None for a in vc.answers)


def test_silence_and_noise_give_no_speech(hf_smol):
    tr = ScriptedTranscriber("unused", 1.0, 0.0)
    vc = VoiceChat(hf_smol, tr, clock=VirtualClock())
    res = play(vc, np.zeros(2 * SAMPLE_RATE, np.float32))
    assert [e.code for e in res.events if e.type == "notice"] == ["no_speech"]
    assert tr.calls == 0 and not _turns(res)


def test_speech_past_the_cap_ends_the_turn(hf_smol, piper):
    text = QUESTIONS[1]
    audio, speech_s = _spoken(piper, text)
    tr = ScriptedTranscriber(text, speech_s, 0.3)
    vc = VoiceChat(
        hf_smol,
        tr,
        mode="cascade",
        predgen=PredGenConfig(max_tokens=8),
        config=LiveConfig(turn=TurnConfig(max_turn_s=1.5)),
        clock=VirtualClock(),
    )
    res = play(vc, audio)
    assert "max_speech" in [e.code for e in res.events if e.type == "notice"]
    # nothing heard is dropped: the capped turn and what followed are both transcribed
    finals = [e.text for e in res.events if e.type == "transcript_final"]
    assert finals and finals[0]


def test_live_translator_lossless_equals_ar(hf_smol, piper):
    """beta = 0 is lossless: every live display is the greedy translation of the source it shows.

    Which partial transcripts get translated depends on how fast the machine computes (the
    virtual clock charges real compute), so each display is checked against a fresh greedy
    translation of its own source rather than against another run's sequence of displays."""
    text = "The weather changes quickly. Hikers should carry a warm jacket."
    rcfg = RetranslateConfig(beta=0.0, max_tokens=40)
    reference: dict[str, str] = {}

    def greedy_display(source: str) -> str:
        if source not in reference:
            ref = ReTranslator(hf_smol, RetranslateConfig(**{**rcfg.__dict__, "baseline": True}))
            reference[source] = ref.update(source).display
            ref.close()
        return reference[source]

    finals = {}
    for mode in ("ar", "ssbd", "cascade"):
        audio, speech_s = _spoken(piper, text)
        tr = ScriptedTranscriber(text, speech_s, 0.3)
        lt = LiveTranslator(hf_smol, tr, mode=mode, retranslate=rcfg, clock=VirtualClock())
        res = play(lt, audio)
        ups = [e for e in res.events if e.type == "translation"]
        assert ups and ups[-1].final and not ups[-1].tentative
        (m,) = _turns(res)
        finals[mode] = m.translation
        if mode == "cascade":
            assert len(ups) == 1  # no live display
            continue
        live = [u for u in ups if not u.final]
        assert live
        for u in live:
            assert u.tentative == greedy_display(u.source), (mode, u.source)

    # each finished sentence is translated once more, greedily. Where the first sentence ends
    # is timing too: a partial that committed it finalizes it alone, else the end of the turn
    # finalizes both sentences together. Either way each live mode's final is a greedy one.
    def greedy_final(source: str) -> str:
        ref = ReTranslator(hf_smol, RetranslateConfig(**{**rcfg.__dict__, "baseline": True}))
        out = ref.finish(source).output
        ref.close()
        return out

    first, second = "The weather changes quickly.", "Hikers should carry a warm jacket."
    allowed = {f"{greedy_final(first)} {greedy_final(second)}", greedy_final(f"{first} {second}")}
    for mode in ("ar", "ssbd"):
        assert finals[mode] in allowed, (mode, finals[mode], allowed)


def test_live_transcriber_and_bad_modes(hf_smol, piper):
    text = QUESTIONS[0]
    audio, speech_s = _spoken(piper, text)
    lt = LiveTranscriber(ScriptedTranscriber(text, speech_s, 0.3), clock=VirtualClock())
    res = play(lt, audio)
    partials = [e for e in res.events if e.type == "transcript_partial"]
    assert partials and [e.text for e in res.events if e.type == "transcript_final"] == [text]
    with pytest.raises(ConfigError, match="mode"):
        VoiceChat(hf_smol, lt.transcriber, mode="fast")
    with pytest.raises(ConfigError, match="mode"):
        LiveTranslator(hf_smol, lt.transcriber, mode="fast")
    with pytest.raises(ConfigError, match="closed"):
        lt.push(np.zeros(10, np.float32))


# ---- the voice system prompt (no model) -----------------------------------------------------
def test_voice_sessions_use_the_voice_prompt_and_text_sessions_keep_predgens():
    from speclive.live.build import LiveModels, LiveModelsConfig
    from speclive.live.vad import TurnConfig
    from speclive.live.voicechat import VOICE_MAX_TOKENS, VOICE_SYSTEM_PROMPT, voice_predgen
    from speclive.server.realtime_settings import (
        LEAST_WINDOW,
        SessionSettings,
        conversation_window,
        pipeline_for,
    )
    from speclive.sessions.predictive import SYSTEM_PROMPT, USER_ROOM

    # the voice prompt keeps PredGen's truncated-input instruction and asks for spoken style
    assert VOICE_SYSTEM_PROMPT.startswith(SYSTEM_PROMPT) and VOICE_SYSTEM_PROMPT != SYSTEM_PROMPT
    for words in ("one to three short spoken sentences", "markdown", "lists", "emojis", "code"):
        assert words in VOICE_SYSTEM_PROMPT
    cfg = voice_predgen(verifier="topk:3")
    assert cfg.system == VOICE_SYSTEM_PROMPT and cfg.max_tokens == VOICE_MAX_TOKENS == 96
    assert cfg.verifier == "topk:3" and cfg.line_breaks and cfg.first_clause_words > 0 and cfg.first_words > 0
    assert voice_predgen(system="custom", max_tokens=40).system == "custom"
    # VoiceChat without settings and the server's realtime voice session get the voice prompt
    assert VoiceChat(object(), None).pcfg.system == VOICE_SYSTEM_PROMPT  # type: ignore[arg-type]
    models = LiveModels(LiveModelsConfig(), transcriber=object(), llm=object())
    pipe = pipeline_for(SessionSettings(mode="chat"), models, TurnConfig())
    assert isinstance(pipe, VoiceChat)
    assert pipe.pcfg.system == VOICE_SYSTEM_PROMPT and pipe.pcfg.max_tokens == VOICE_MAX_TOKENS
    assert pipe.pcfg.context_tokens is None  # a backend without a limit on its states
    # a server's llama.cpp backend: each conversation gets its share of the shared KV cells
    shared = type("Llama", (), {"n_cells": 9216, "max_states": 6})()
    models = LiveModels(LiveModelsConfig(), transcriber=object(), llm=shared)
    pipe = pipeline_for(SessionSettings(mode="chat"), models, TurnConfig())
    assert pipe.pcfg.context_tokens == 1536
    many = type("Llama", (), {"n_cells": 2048, "max_states": 64})()  # never less than a few turns
    assert conversation_window(many) == LEAST_WINDOW > VOICE_MAX_TOKENS + USER_ROOM
    # text sessions (speclive predgen, bench predgen: PredGenConfig's defaults) keep PredGen's
    assert PredGenConfig().system == SYSTEM_PROMPT and PredGenConfig().max_tokens == 256


# ---- the CLI, end to end with the real Whisper ---------------------------------------------
def test_cli_live_chat_and_transcribe(tmp_path, piper, capsys):
    from speclive.tts.base import Audio, write_wav

    audio, _ = _spoken(piper, QUESTIONS[0])
    wav = tmp_path / "q.wav"
    # stereo 44.1 kHz input: resampled and mixed down
    from scipy.signal import resample_poly

    st = resample_poly(audio, 441, 160).astype(np.float32)
    write_wav(wav, Audio(st, 44100, 0.0))
    out = tmp_path / "answer.wav"
    rc = main(
        [
            "live",
            "chat",
            str(wav),
            "--model",
            "smollm2-135m-instruct",
            "--max-tokens",
            "24",
            "--json",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    (turn,) = d["turns"]
    assert "boiling" in turn["transcript"].lower() and turn["answer"]
    assert turn["latency_s"] > 0 and turn["asr_s"] > 0 and d["mode"] == "predgen"
    assert out.exists() and out.stat().st_size > 10_000
    assert main(["live", "transcribe", str(wav)]) == 0
    assert "boiling" in capsys.readouterr().out.lower()


def test_cli_live_bad_input(tmp_path, capsys):
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not audio at all")
    assert main(["live", "chat", str(bad)]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["live", "transcribe", str(tmp_path / "missing.wav")]) == 2
    assert "no such audio file" in capsys.readouterr().err
    from speclive.tts.base import Audio, write_wav

    empty = tmp_path / "empty.wav"
    write_wav(empty, Audio(np.zeros(0, np.float32), 16000, 0.0))
    assert main(["live", "chat", str(empty)]) == 2
    assert "no audio samples" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["live", "chat", str(bad), "--baseline", "fastest"])


def test_speech_after_the_end_of_turn_continues_an_unanswered_turn(hf_smol, piper):
    a1, _ = _spoken(piper, "What is the boiling point", tail=0.0)
    a2, _ = _spoken(piper, "of water at sea level?", lead=0.0)
    gap = np.zeros(int(0.7 * SAMPLE_RATE), np.float32)  # longer than the end-of-turn silence
    full = "What is the boiling point of water at sea level?"

    class Whole(ScriptedTranscriber):
        def transcribe(self, audio, loop_fallback=True, hint=None):
            self.calls += 1
            return _Text(full if len(audio) > len(a1) + len(gap) else "What is the boiling point")

    vc = VoiceChat(hf_smol, Whole(full, 1.0, 0.0), predgen=PredGenConfig(max_tokens=16), clock=VirtualClock())
    events = []
    for chunk in (a1, gap, a2, np.zeros(SAMPLE_RATE, np.float32)):  # no compute in between:
        events += vc.push(chunk)  # the first end of turn is not answered before speech resumes
    events += vc.close()
    assert [e.end_of_turn for e in events if e.type == "speech_stopped" and e.end_of_turn] == [True, True]
    (m,) = [e for e in events if e.type == "turn_metrics"]
    assert m.transcript == full and m.answer  # one turn, with every word
    assert not any(e.type == "interrupted" for e in events)


class _CountingBackend:
    """The real backend, counting the KV states it holds."""

    def __init__(self, inner):
        self._inner, self.live = inner, 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def new_state(self):
        self.live += 1
        return self._inner.new_state()

    def fork(self, state):
        self.live += 1
        return self._inner.fork(state)

    def release(self, state):
        self.live -= 1
        self._inner.release(state)


def test_background_work_and_abort_free_the_states_without_finishing(hf_smol, piper):
    q = QUESTIONS[0]
    audio, speech_s = _spoken(piper, q)
    llm = _CountingBackend(hf_smol)
    vc = VoiceChat(
        llm,
        ScriptedTranscriber(q, speech_s, lead_s=0.3),
        predgen=PredGenConfig(max_tokens=32),
        clock=VirtualClock(),
    )
    assert vc.background  # nobody speaks yet: anything it does is optional
    half = len(audio) // 2
    vc.push(audio[:half])
    assert vc.turn is not None and vc.background  # the user speaks: partials and speculation
    vc.push(audio[half:])
    assert vc.turn.ended and not vc.background  # end of turn: the user waits for the answer
    texts = []
    while not texts:  # the final transcript, then the answer's first text
        texts = [e for e in vc.step() or [] if e.type == "answer_delta"]
    assert llm.live > 0
    # the turn's end is handled, but the answer is still being produced: the session is busy
    assert vc.turn.end_done and vc.reply is not None and vc.working
    vc.abort()
    assert llm.live == 0 and vc.closed and vc.reply is None
    assert vc.step() is None and vc.close() == []  # nothing is computed after an abort
    with pytest.raises(ConfigError):
        vc.push(audio[:100])
