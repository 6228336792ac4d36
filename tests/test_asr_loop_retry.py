"""A trimmed window that loops is decoded again over wider windows before the full one.

Real tiny.en, float32: the first test clip with 0.1 s of silence after it makes the trimmed
window (audio + 1 s) start the text over at its end, the loop guard's case."""

from __future__ import annotations

import numpy as np
import pytest
from asr_fixtures import clips_16k

from speclive.asr.audio import SAMPLE_RATE
from speclive.asr.transcribe import TranscribeConfig, Transcriber


def _looping_clip() -> np.ndarray:
    _, audio = clips_16k()[0]
    return np.concatenate([audio, np.zeros(SAMPLE_RATE // 10, np.float32)])


def _windows(ladder: tuple[float, ...]) -> tuple[list[float | None], object]:
    """The margins of every window the transcription encodes, and its transcript."""
    from speclive.asr.whisper import load_whisper

    target = load_whisper("whisper-tiny.en", audio_margin_s=1.0)
    seen: list[float | None] = []
    set_audio = target.set_audio

    def spy(audio):
        seen.append(target.audio_margin_s)
        return set_audio(audio)

    target.set_audio = spy  # type: ignore[method-assign]
    cfg = TranscribeConfig(
        model="whisper-tiny.en", method="ar", target_audio_margin_s=1.0, loop_retry_margins_s=ladder
    )
    result = Transcriber(cfg, target=target).transcribe(_looping_clip(), loop_fallback=True)
    assert target.audio_margin_s == 1.0  # the trimmed margin is restored
    return seen, result


def _plain(margin: float | None) -> list[int]:
    from speclive.asr.whisper import load_whisper

    cfg = TranscribeConfig(
        model="whisper-tiny.en", method="ar", target_audio_margin_s=margin, loop_retry_margins_s=()
    )
    target = load_whisper("whisper-tiny.en", audio_margin_s=margin)
    return [int(t) for t in Transcriber(cfg, target=target).transcribe(_looping_clip()).token_ids]


@pytest.mark.parametrize(
    ("ladder", "windows", "retries", "reference"),
    [
        ((), [1.0, None], 0, None),  # straight to the full window
        ((5.0,), [1.0, 5.0], 0, 5.0),  # 5 s of padding ends the loop
        ((3.0,), [1.0, 3.0, None], 1, None),  # 3 s loops too: the full window decides
    ],
)
def test_a_looping_window_is_retried_wider(ladder, windows, retries, reference):
    seen, result = _windows(ladder)
    assert seen == windows
    assert result.stats.loops == 1 and result.stats.loop_retries == retries
    # the retry is that window's own greedy transcript (drafting by the loop's text is lossless)
    assert [int(t) for t in result.token_ids] == _plain(reference)
    assert result.text == "The quick brown fox jumps over the lazy dog."


def test_a_partial_is_not_retried():
    """A streaming partial keeps what came before the loop and costs no second window."""
    from speclive.asr.whisper import load_whisper

    target = load_whisper("whisper-tiny.en", audio_margin_s=1.0)
    cfg = TranscribeConfig(model="whisper-tiny.en", method="ar", target_audio_margin_s=1.0)
    result = Transcriber(cfg, target=target).transcribe(_looping_clip(), loop_fallback=False)
    assert result.stats.loops == 1 and result.stats.loop_retries == 0
    assert result.stats.encode_ms > 0 and result.text.startswith("The quick brown fox")
