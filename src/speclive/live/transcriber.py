"""``LiveTranscriber``: speech in, partial and final transcripts out (no answer).

The common pipeline alone: VAD turns, streaming partials while the user speaks, one final
transcript per turn. Its ``TurnMetrics`` carry the transcript and the ASR cost.
"""

from __future__ import annotations

from speclive.live.events import Event, TurnMetrics
from speclive.live.pipeline import LivePipeline, _Turn


class LiveTranscriber(LivePipeline):
    def _on_end(self, turn: _Turn) -> list[Event]:
        end = turn.speech_end_t if turn.speech_end_t is not None else turn.start_t
        eot = turn.eot_t if turn.eot_t is not None else self.clock()
        now = self.clock()
        return [
            TurnMetrics(
                now,
                turn=turn.index,
                transcript=turn.final or "",
                eot_delay_s=eot - end,
                speech_end_t=end,
                asr_s=turn.compute["asr"],
                asr_passes=turn.asr_passes,
                max_lag_s=turn.max_lag_s,
                extra={"final_after_speech_s": round(now - end, 4)},
            )
        ]
