"""``LiveTranslator``: speech in, a live translation out, re-translated with SSBD as words arrive.

Streaming transcription -> the sentence in progress is re-translated on every new partial
transcript by a ``ReTranslator`` (SSBD: the previous translation is the draft, verified with a
bias towards it; display-only mask-k) -> ``TranslationUpdate`` events with the ``stable`` part
(sentences the transcript has committed, translated once more and final) and the ``tentative``
part (the sentence in progress as displayed). At the end of a turn the rest of the final
transcript is translated and becomes stable. Finished sentences can be spoken (``tts``).

``mode``: ``ssbd`` (the default), ``ar`` (the same re-translation with plain greedy decoding:
the baseline SSBD is measured against) or ``cascade`` (no live display: each turn is translated
once, after it ends).

When partial transcripts arrive faster than they are translated, only the newest is
translated (a stale source is never worth the compute), for every mode alike.
"""

from __future__ import annotations

import re
import time

from speclive.backends.base import Backend
from speclive.errors import ConfigError
from speclive.live.clock import Clock
from speclive.live.events import AudioChunk, Event, TranscriptPartial, TranslationUpdate, TurnMetrics
from speclive.live.pipeline import LiveConfig, LivePipeline, _Turn
from speclive.sessions.retranslate import RetranslateConfig, ReTranslator
from speclive.tts.base import TTS

MODES = ("ssbd", "ar", "cascade")
_SENTENCE_END = re.compile(r"[.?!][\"')\]]*$")


class LiveTranslator(LivePipeline):
    def __init__(
        self,
        llm: Backend,
        transcriber,
        mode: str = "ssbd",
        retranslate: RetranslateConfig | None = None,
        tts: TTS | None = None,
        config: LiveConfig | None = None,
        clock: Clock | None = None,
        sample_rate: int = 16_000,
        turn_model=None,
    ):
        if mode not in MODES:
            raise ConfigError(f"invalid mode {mode!r}; allowed values: {', '.join(MODES)}")
        cfg = config or LiveConfig()
        cfg.partials = cfg.early_final = mode != "cascade"
        super().__init__(transcriber, cfg, clock, sample_rate, turn_model=turn_model)
        rcfg = retranslate or RetranslateConfig()
        rcfg.validate()
        self.rcfg = RetranslateConfig(**{**rcfg.__dict__, "baseline": mode != "ssbd"})
        self.llm = llm
        self.mode = mode
        self.tts = tts
        self.stable: list[str] = []  # finished sentences' translations, all turns
        self.session: ReTranslator | None = None
        self.done_words = 0  # words of the turn's transcript already translated for good
        self.pending: TranscriptPartial | None = None
        self.shown = ""  # the translation now displayed (stable + tentative)
        self.play_end = 0.0
        self.turn_stable_from = 0
        self.turn_updates: list[dict] = []

    # ---- helpers ----------------------------------------------------------------------------
    def _new_session(self) -> ReTranslator:
        if self.session is not None:
            self.session.close()
        self.session = ReTranslator(self.llm, self.rcfg)
        return self.session

    def _stable_text(self) -> str:
        return " ".join(s for s in self.stable if s)

    def _timed(self, turn: _Turn, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        self._charge(turn, "llm", time.perf_counter() - t0)
        return out

    def _speak(self, turn: _Turn, text: str) -> list[Event]:
        if self.tts is None or not text:
            return []
        audio = self.tts.synthesize(text)
        self._charge(turn, "tts", audio.synth_s)
        now = self.clock()
        start = max(now, self.play_end)
        self.play_end = start + audio.duration_s
        return [
            AudioChunk(
                now,
                samples=audio.samples,
                sample_rate=audio.sample_rate,
                text=text,
                play_at=start,
                duration_s=audio.duration_s,
            )
        ]

    def _finalize(self, turn: _Turn, source_words: list[str]) -> list[Event]:
        """Translate ``source_words`` once more as a finished sentence; it becomes stable."""
        if not source_words:
            return []
        session = self.session or self._new_session()
        u = self._timed(turn, session.finish, " ".join(source_words))
        self.stable.append(u.output)
        self.done_words += len(source_words)
        self.session = None
        session.close()
        return self._speak(turn, u.output)

    # ---- hooks ------------------------------------------------------------------------------
    def _on_turn_start(self, turn: _Turn) -> list[Event]:
        self.done_words = 0
        self.pending = None
        self.turn_stable_from = len(self.stable)
        self.turn_updates = []
        return []

    def _on_partial(self, turn: _Turn, partial: TranscriptPartial) -> list[Event]:
        self.pending = partial
        return []

    def _work(self, deadline: float | None) -> list[Event] | None:
        turn, p = self.turn, self.pending
        if turn is None or turn.ended or p is None:
            return None
        self.pending = None
        events: list[Event] = []
        words = p.text.split()
        committed = len(p.stable.split())
        # a sentence the transcript has committed (and gone past) is translated for good
        for i in range(self.done_words, committed - 1):
            if _SENTENCE_END.search(words[i]):
                events += self._finalize(turn, words[self.done_words : i + 1])
        rest = words[self.done_words :]
        if not rest:
            return events
        session = self.session or self._new_session()
        u = self._timed(turn, session.update, " ".join(rest))
        return events + [self._display(turn, u.display, " ".join(rest), p.audio_t, final=False)]

    def _display(self, turn: _Turn, tentative: str, source: str, audio_t: float, final: bool) -> Event:
        now = self.clock()
        ev = TranslationUpdate(
            now, stable=self._stable_text(), tentative=tentative, source=source, final=final, audio_t=audio_t
        )
        self.shown = " ".join(x for x in (ev.stable, tentative) if x)
        self.turn_updates.append({"t": now, "audio_t": audio_t, "display": self.shown, "final": final})
        return ev

    def _on_end(self, turn: _Turn) -> list[Event]:
        words = (turn.final or "").split()
        events: list[Event] = []
        if words:
            # the final transcript may split differently from the partials: what the partials
            # finalized stays, the rest of the final transcript is translated now
            events += self._finalize(turn, words[self.done_words :])
        if self.session is not None:
            self.session.close()
            self.session = None
        end = turn.speech_end_t if turn.speech_end_t is not None else turn.start_t
        audio_t = turn.audio_start_t + turn.final_audio_s
        events.append(self._display(turn, "", turn.final or "", audio_t, final=True))
        eot = turn.eot_t if turn.eot_t is not None else self.clock()
        now = self.clock()
        events.append(
            TurnMetrics(
                now,
                turn=turn.index,
                transcript=turn.final or "",
                translation=" ".join(s for s in self.stable[self.turn_stable_from :] if s),
                latency_s=now - end,
                eot_delay_s=eot - end,
                speech_end_t=end,
                asr_s=turn.compute["asr"],
                llm_s=turn.compute["llm"],
                tts_s=turn.compute["tts"],
                asr_passes=turn.asr_passes,
                max_lag_s=turn.max_lag_s,
                extra={"mode": self.mode, "updates": list(self.turn_updates)},
            )
        )
        return events

    def _release(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None
