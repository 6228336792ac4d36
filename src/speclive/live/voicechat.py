"""``VoiceChat``: speech in, a spoken answer out, speculating while the user speaks.

VAD turn detection -> streaming transcription (SpecASR decode, LocalAgreement partials) ->
every new partial transcript feeds a ``PredictiveResponder`` while the user is still speaking
(the old candidate answer is verified against the new words, its first sentence
pre-synthesized) -> at a pause the whole turn is transcribed and the candidate verified against
that transcript -> at the end of turn the answer streams sentence by sentence, its first
sentence's audio usually ready already. Multi-turn history; barge-in (speech during the answer)
stops the answer, and the history keeps only what was played.

``mode`` picks the method: ``predgen`` (the default) or a baseline on the same models —
``cascade`` (wait for the end of turn, transcribe, generate, synthesize), ``prefill`` (the
cascade with the partial transcript prefilled while the user speaks) and ``preemptive``
(LiveKit-style: generate from each new transcript, keep it only if the final one is the same).

Playback is modelled, not performed: a sentence plays from when it is ready, the end of turn
and the end of the previous sentence, whichever is latest (``AudioChunk.play_at``). That is
what ``latency_s`` (end of speech -> first answer audio plays) and barge-in use.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from speclive.backends.base import Backend
from speclive.errors import ConfigError
from speclive.live.clock import Clock
from speclive.live.events import (
    AnswerDelta,
    AudioChunk,
    Event,
    Interrupted,
    Notice,
    Speculation,
    TranscriptPartial,
    TurnMetrics,
)
from speclive.live.pipeline import LiveConfig, LivePipeline, _Turn
from speclive.sessions.predictive import MODES, SYSTEM_PROMPT, PredGenConfig, PredictiveResponder, ReplyPart
from speclive.tts.base import TTS

#: words a voice answer's first spoken unit needs before a , ; or : may end it
VOICE_FIRST_CLAUSE = 4
#: about how many words a voice answer's first spoken unit may have when no sentence or clause
#: ends sooner: the first audio waits for a few tokens, not a whole sentence
VOICE_FIRST_WORDS = 6
#: most tokens a spoken answer may take (the voice prompt asks for one to three short sentences)
VOICE_MAX_TOKENS = 96
#: the system prompt of a voice session: PredGen's (the user's words may be truncated, since the
#: live pipeline answers partial transcripts speculatively) plus the style of a spoken answer.
#: Text sessions keep ``SYSTEM_PROMPT`` alone.
VOICE_SYSTEM_PROMPT = (
    SYSTEM_PROMPT + " Your answer will be spoken aloud. Answer in one to three short spoken "
    "sentences, in plain words. Do not use lists, markdown, headings, emojis or code. Write "
    "numbers as words where natural."
)


def voice_predgen(**overrides: Any) -> PredGenConfig:
    """PredGen settings for a spoken answer: the voice system prompt (``VOICE_SYSTEM_PROMPT``:
    short spoken sentences, no markdown), at most ``VOICE_MAX_TOKENS`` tokens, a line break
    ends a sentence too (a list's lead-in is spoken on its own) and the first unit may be a
    clause of ``VOICE_FIRST_CLAUSE`` words or more, or end after about ``VOICE_FIRST_WORDS``
    words, so its audio is ready sooner."""
    defaults: dict[str, Any] = {
        "system": VOICE_SYSTEM_PROMPT,
        "max_tokens": VOICE_MAX_TOKENS,
        "line_breaks": True,
        "first_clause_words": VOICE_FIRST_CLAUSE,
        "first_words": VOICE_FIRST_WORDS,
    }
    return PredGenConfig(**{**defaults, **overrides})


#: which transcripts each method listens to while the user speaks
_LISTENS = {"predgen": True, "prefill": True, "preemptive": True, "cascade": False}


@dataclass
class _Playing:
    start: float
    end: float
    text: str
    #: its entry in ``VoiceChat.playbacks``
    log: dict[str, Any] = field(default_factory=dict)


class VoiceChat(LivePipeline):
    def __init__(
        self,
        llm: Backend,
        transcriber,
        tts: TTS | None = None,
        mode: str = "predgen",
        predgen: PredGenConfig | None = None,
        config: LiveConfig | None = None,
        clock: Clock | None = None,
        sample_rate: int = 16_000,
        history: list[dict[str, str]] | None = None,
        turn_model=None,
    ):
        if mode not in MODES:
            raise ConfigError(f"invalid mode {mode!r}; allowed values: {', '.join(MODES)}")
        cfg = config or LiveConfig()
        cfg.partials = cfg.early_final = _LISTENS[mode]
        super().__init__(transcriber, cfg, clock, sample_rate, turn_model=turn_model)
        self.llm = llm
        self.tts = tts
        self.mode = mode
        self.pcfg = predgen or voice_predgen()
        self.history: list[dict[str, str]] = list(history or [])
        self.responder: PredictiveResponder | None = None
        self.reply: Iterator[ReplyPart] | None = None
        self.reply_turn: _Turn | None = None
        self.playing: list[_Playing] = []
        self._first_ready: float | None = None
        self._presynth_t: tuple[str, float] | None = None  # (first sentence, when its audio was made)
        self._answer = ""
        #: every complete answer of this conversation (text, token ids, latency figures; not
        #: its audio, which was emitted as ``AudioChunk`` events)
        self.answers: list = []
        #: every stretch of answer audio played: ``turn``, ``start_t``, ``end_t`` (clock
        #: times) and ``cut`` (the user's speech stopped it there)
        self.playbacks: list[dict[str, Any]] = []
        #: the history length whose prefix is in the LM's cache (-1: none)
        self._warm_for = -1
        #: the figures of an answered turn its speaker may still take up again
        self._held: tuple[TurnMetrics, _Turn] | None = None

    # ---- turn hooks -------------------------------------------------------------------------
    def _new_responder(self) -> PredictiveResponder:
        """The responder for a new turn: the conversation's one responder, restarted, so its KV
        cache (system prompt and earlier turns) serves the new turn's prompt too."""
        if self.responder is not None:
            self.responder.restart(self.history)
            return self.responder
        cfg = PredGenConfig(**{**self.pcfg.__dict__, "mode": self.mode, "baseline": False})
        self.responder = PredictiveResponder(self.llm, cfg, tts=self.tts, history=self.history)
        return self.responder

    def _on_turn_start(self, turn: _Turn) -> list[Event]:
        self._new_responder()
        self._presynth_t = None
        return []

    def _on_end(self, turn: _Turn) -> list[Event]:
        if not turn.final:
            return [Notice(self.clock(), "no_speech", "the turn had no words"), self._metrics(turn, None)]
        assert self.responder is not None
        self.reply = self.responder.respond(turn.final)
        self.reply_turn = turn
        self.playing, self._first_ready, self._answer = [], None, ""
        return []

    def _mergeable(self, turn: _Turn, at: float | None = None) -> bool:
        if not turn.end_done or self._within_predicted(turn, at):
            return True
        if turn is not self.reply_turn or self.reply is None:
            return False  # answered (or being played): new speech is a new turn
        if self.tts is None:
            return self._first_ready is None
        now = self.clock()
        return not any(p.start <= now for p in self.playing)

    def _on_reopen(self, turn: _Turn) -> list[Event]:
        """The user went on before any answer was heard, or soon after the policy ended their
        turn: the answer in progress stops and the turn is answered when it ends again. What
        was played of it stays in the history, after the words it answered."""
        now = self.clock()
        events: list[Event] = []
        self._held = None  # the turn goes on: it is answered (and counted) when it ends again
        if any(p.start < now for p in self.playing):
            events = self._interrupt(now, reopen=True)
        elif self.reply is not None or self._answer:
            # nothing was heard, but the answer's text went out: transports withdraw it
            events = [Interrupted(now, played="")]
        if self.reply is not None:
            self.reply.close()
        self.reply = self.reply_turn = None
        self.playing, self._first_ready, self._answer = [], None, ""
        self._new_responder()
        self._presynth_t = None
        return events

    def _interrupt(self, now: float, reopen: bool = False) -> list[Event]:
        """Barge-in: stop generating, keep what was played in the history (``reopen``: the turn
        it answered goes on, so its metrics come when it ends again)."""
        playing_now = any(p.end > now for p in self.playing)
        if self.reply is None and not playing_now:
            return []
        played = []
        for p in self.playing:
            if p.end <= now:
                played.append(p.text)
            elif p.start < now:  # cut mid-sentence: keep the share of it that was heard
                words = p.text.split()
                share = (now - p.start) / max(1e-6, p.end - p.start)
                played.append(" ".join(words[: int(len(words) * share)]))
                p.log.update(end_t=round(now, 4), cut=True)
            else:  # never started: it is not played at all
                p.log["dropped"] = True
        self.playbacks = [x for x in self.playbacks if not x.get("dropped")]
        played_text = " ".join(x for x in played if x).strip()
        events: list[Event] = []
        turn = self.reply_turn
        if self.reply is not None:
            self.reply.close()
            self.reply = None
            if turn is not None and not reopen:
                m = self._metrics(turn, None)
                m.extra["interrupted"] = True
                events.append(m)
        elif self.history and self.history[-1]["role"] == "assistant":
            self.history.pop()  # the answer was complete but not all of it was heard
        if turn is not None and turn.final:
            if not (self.history and self.history[-1]["role"] == "user"):
                self.history.append({"role": "user", "content": turn.final})
            if played_text:
                self.history.append({"role": "assistant", "content": played_text})
        self.playing = [p for p in self.playing if p.end <= now]
        self.reply_turn = None
        return [Interrupted(now, played=played_text), *events]

    # ---- semantic turn detection: the answering LM's reading ----------------------------------
    def _text_signal(self, turn: _Turn, compute: bool) -> float | None:
        r = self.responder
        if r is None or not turn.final:
            return None
        return r.end_of_turn_prob(turn.final) if compute else r.end_probs.get(turn.final)

    def _text_comes_with_work(self, turn: _Turn) -> bool:
        """The next speculation on the final transcript reads it in its first pass."""
        r = self.responder
        if r is None or self.mode == "cascade" or not r.backend.in_process or not turn.final:
            return False
        return turn.final != r.latest or r.incomplete

    # ---- compute ----------------------------------------------------------------------------
    def _work(self, deadline: float | None) -> list[Event] | None:
        held = self._release_held()
        if held:
            return held
        if self.reply is not None:
            return self._reply_steps(deadline)
        turn, r = self.turn, self.responder
        if turn is None or (turn.ended and turn.end_done):
            return self._warm_prefix()
        if turn.ended or r is None or self.mode == "cascade":
            return None
        text = turn.final if turn.final is not None else turn.partial
        if not text or (text == r.latest and not r.incomplete):
            return None
        if turn.final is not None:
            # the turn is probably over: the first sentence and its audio are worth finishing
            # now, in slices, so the VAD still hears the end of turn (or more speech) at once
            perf_deadline = None if deadline is None else self.clock.to_perf(deadline)
            synth_deadline = None
        else:
            # yield when the caller has new input (the VAD must hear a pause at once), but
            # leave time for a synthesis until the next transcription pass is due
            next_pass = turn.audio_start_t + turn.fed_s + self.cfg.asr_step_s
            perf_deadline = None if deadline is None else self.clock.to_perf(deadline)
            synth_deadline = self.clock.to_perf(next_pass)
        t0 = time.perf_counter()
        u = r.update(
            text, deadline=perf_deadline, synth_deadline=synth_deadline, settled=turn.final is not None
        )
        dt = time.perf_counter() - t0
        self._charge(turn, "tts", u.tts_s)
        self._charge(turn, "llm", dt - u.tts_s)
        if u.resynthesized:
            self._presynth_t = (u.first_sentence, self.clock())
        if self.mode == "prefill" or not u.first_sentence:
            return []  # a prefill, or a speculation that yielded before its first sentence ended
        return [
            Speculation(
                self.clock(),
                partial=text,
                candidate=u.candidate,
                first_sentence=u.first_sentence,
                drafted=u.drafted,
                accepted=u.accepted,
                presynthesized=r.presynth is not None and r.presynth[0] == u.first_sentence,
            )
        ]

    def _warm_prefix(self) -> list[Event] | None:
        """While nobody speaks: the system prompt and the history so far into the LM's cache
        (once per history), so the next turn's first pass computes only its own words. Every
        method does it, as a server caches its system prompt."""
        if self.closed or self._warm_for == len(self.history):
            return None
        r = self._new_responder()
        r.decoder.prefill(r.prompt_ids(""))
        self._warm_for = len(self.history)
        return []

    def _reply_steps(self, deadline: float | None) -> list[Event]:
        """Parts of the answer until ``deadline`` (one part without one), a sentence's audio or
        the end of the answer: a unit of some length, so an answer does not wait for a turn
        of a shared worker between every two tokens."""
        events: list[Event] = []
        while self.reply is not None:
            new = self._reply_step()
            events += new
            if deadline is None or self.clock() >= deadline or any(e.type == "audio" for e in new):
                break
        return events

    def _reply_step(self) -> list[Event]:
        assert self.reply is not None and self.reply_turn is not None
        turn = self.reply_turn
        t0 = time.perf_counter()
        try:
            part = next(self.reply)
        except StopIteration:  # pragma: no cover - respond() always ends with "done"
            self.reply = None
            return []
        dt = time.perf_counter() - t0
        now = self.clock()
        if part.kind == "text":
            self._charge(turn, "llm", dt)
            self._answer += part.text
            return [AnswerDelta(now, text=part.text)]
        if part.kind == "sentence":
            presynth = (
                part.index == 0
                and self._presynth_t is not None
                and self.responder is not None
                and self.responder.presynth is not None
                and part.audio is not None
                and part.audio is self.responder.presynth[1]
            )
            synth = part.audio.synth_s if part.audio is not None and not presynth else 0.0
            self._charge(turn, "tts", synth)
            self._charge(turn, "llm", dt - synth)
            if self._first_ready is None:
                # a pre-synthesized first sentence was ready when its speculation made it
                self._first_ready = self._presynth_t[1] if presynth else now  # type: ignore[index]
            if part.audio is None:
                return []
            eot = turn.eot_t if turn.eot_t is not None else now
            prev_end = self.playing[-1].end if self.playing else 0.0
            start = max(now, eot, prev_end)
            dur = part.audio.duration_s
            log = {
                "turn": turn.index,
                "start_t": round(start, 4),
                "end_t": round(start + dur, 4),
                "cut": False,
            }
            self.playbacks.append(log)
            self.playing.append(_Playing(start, start + dur, part.text, log))
            return [
                AudioChunk(
                    now,
                    samples=part.audio.samples,
                    sample_rate=part.audio.sample_rate,
                    sentence=part.index,
                    text=part.text,
                    play_at=start,
                    duration_s=dur,
                )
            ]
        # done
        self._charge(turn, "llm", dt)
        self.reply = None
        resp = part.response
        assert resp is not None
        # the answer's audio went out as events: a long conversation does not keep it
        self.answers.append(replace(resp, audio=[], first_audio=None))
        self.history += [
            {"role": "user", "content": turn.final or ""},
            {"role": "assistant", "content": resp.response},
        ]
        m = self._metrics(turn, resp)
        if self._within_predicted(turn):
            # the speaker may still go on (the policy ended the turn): the turn's figures wait
            # until that is over, as a turn taken up again is answered, and counted, once more
            self._held = (m, turn)
            return []
        return [m]

    def _release_held(self, force: bool = False) -> list[Event]:
        """The held figures of the last answered turn, once its speaker can no longer go on."""
        if self._held is None:
            return []
        m, turn = self._held
        if not force and self._within_predicted(turn):
            return []
        self._held = None
        return [m]

    def close(self) -> list[Event]:
        return super().close() + self._release_held(force=True)

    def _metrics(self, turn: _Turn, resp) -> TurnMetrics:
        r = self.responder
        ups = r.updates if r is not None else []
        end = turn.speech_end_t if turn.speech_end_t is not None else turn.start_t
        eot = turn.eot_t if turn.eot_t is not None else self.clock()
        first_play = self.playing[0].start if self.playing else None
        if first_play is None and self._first_ready is not None:  # no TTS: the text is what is ready
            first_play = max(self._first_ready, eot)
        ready = self._first_ready
        final_stats = resp.stats if resp is not None else None
        accepted = sum(u.accepted for u in ups)
        drafted = sum(u.drafted for u in ups)
        if final_stats is not None and self.mode == "predgen":
            hist = ("history", "forced")
            accepted += sum(final_stats.accepted_by_source.get(s, 0) for s in hist)
            drafted += sum(final_stats.drafted_by_source.get(s, 0) for s in hist)
        extra: dict[str, Any] = {"mode": self.mode}
        if self.policy is not None:
            extra.update(
                predicted=turn.predicted,
                audio_p=turn.signals.audio,
                text_p=turn.signals.text,
                turn_s=round(turn.compute["turn"], 4),
            )
        extra.update(decided_t=turn.decided_t, audio_start_t=first_play)
        if resp is not None:
            extra.update(
                first_sentence=resp.first_sentence,
                presynth_used=resp.presynth_used,
                ttfs_s=round(resp.ttfs_s, 4),
                nfetfs=resp.nfetfs,
                final_forwards=resp.forwards,
            )
        return TurnMetrics(
            self.clock(),
            turn=turn.index,
            transcript=turn.final or "",
            answer=resp.response if resp is not None else self._answer.strip(),
            latency_s=None if first_play is None else first_play - end,
            audio_ready_s=None if ready is None else ready - end,
            eot_delay_s=eot - end,
            speech_end_t=end,
            audio_ready_at_eot=ready is not None and ready <= eot + 1e-9,
            asr_s=turn.compute["asr"],
            llm_s=turn.compute["llm"],
            tts_s=turn.compute["tts"],
            asr_passes=turn.asr_passes,
            target_forwards=sum(u.forwards for u in ups) + (resp.forwards if resp is not None else 0),
            speculations=sum(1 for u in ups if u.candidate),
            drafted=drafted,
            accepted=accepted,
            max_lag_s=turn.max_lag_s,
            extra=extra,
        )

    @property
    def working(self) -> bool:
        # a turn whose figures are held may still be taken up again: it is not over yet
        return super().working or self.reply is not None or self._held is not None

    @property
    def background(self) -> bool:
        # while the user speaks (or nobody does) the units are partial transcripts and
        # speculation; from the end of a turn on, the user waits for the answer
        return self.turn is None or not self.turn.ended

    def _release(self) -> None:
        if self.reply is not None:
            self.reply.close()
            self.reply = None
        if self.responder is not None:
            self.responder.close()
            self.responder = None

    # keep the partial-transcript hook explicit: the text is read by ``_work``
    def _on_partial(self, turn: _Turn, partial: TranscriptPartial) -> list[Event]:
        return []
