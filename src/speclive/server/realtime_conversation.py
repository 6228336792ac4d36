"""A realtime session's conversation: what its live pipeline emits, as the protocol's server events.

The user's turn becomes an item (``input_audio_buffer.speech_started`` / ``speech_stopped`` /
``committed``, ``conversation.item.created``, its transcription deltas); the answer becomes a
response (``response.created`` ... ``response.done``, with its transcript and audio deltas);
speclive's own events (speculation, transcript, translation, turn prediction, notices, turn
metrics) go out as they come. ``PIPELINE_EVENTS`` is the table: pipeline event class -> handler.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from speclive.live import events as ev
from speclive.server.audio import pcm16, resample
from speclive.server.realtime_protocol import new_id
from speclive.server.realtime_settings import SessionSettings

#: audio per response.output_audio.delta event
DELTA_S = 0.2


class Send(Protocol):
    async def __call__(self, type_: str, **payload: Any) -> None: ...


class SendError(Protocol):
    async def __call__(
        self, code: str, message: str, param: str | None = None, event_id: str | None = None
    ) -> None: ...


@dataclass
class _Response:
    id: str
    item_id: str
    text: list[str] = field(default_factory=list)
    audio_s: float = 0.0
    cancelled: bool = False
    started: bool = False


class Conversation:
    """The items of one session's conversation, and the mapping of pipeline events to server
    events. ``send`` / ``error`` send an event; ``settings`` gives the session's settings now."""

    def __init__(self, send: Send, error: SendError, settings: Callable[[], SessionSettings]):
        self.send = send
        self.error = error
        self.settings = settings
        self.user_item: str | None = None
        self.prev_item: str | None = None
        self.response: _Response | None = None
        #: the client cancelled this turn's answer: the pipeline's further answer text and
        #: audio of the turn are dropped (not sent as a new response) until its metrics arrive
        self.dropping = False
        self.sent_transcript = ""

    async def on_event(self, e: ev.Event) -> None:
        """Send what pipeline event ``e`` means in the protocol (its handler in ``PIPELINE_EVENTS``)."""
        if self.dropping and isinstance(e, ev.AnswerDelta | ev.AudioChunk):
            return
        for cls in type(e).__mro__:
            handler = self.PIPELINE_EVENTS.get(cls)
            if handler is not None:
                await handler(self, e)
                return

    # ---- the user's turn ----------------------------------------------------------------
    async def _speech_started(self, e: ev.SpeechStarted) -> None:
        self.user_item = new_id("item")
        self.sent_transcript = ""
        await self.send(
            "input_audio_buffer.speech_started",
            audio_start_ms=int(e.audio_t * 1000),
            item_id=self.user_item,
        )

    async def _speech_stopped(self, e: ev.SpeechStopped) -> None:
        await self.send(
            "input_audio_buffer.speech_stopped",
            audio_end_ms=int(e.audio_t * 1000),
            item_id=self.user_item,
        )
        if not e.end_of_turn:
            return
        await self.send(
            "input_audio_buffer.committed", item_id=self.user_item, previous_item_id=self.prev_item
        )
        await self.send(
            "conversation.item.created",
            previous_item_id=self.prev_item,
            item={
                "id": self.user_item,
                "object": "realtime.item",
                "type": "message",
                "role": "user",
                "status": "completed",
                "content": [{"type": "input_audio", "transcript": None}],
            },
        )
        self.prev_item = self.user_item

    async def _transcript_partial(self, e: ev.TranscriptPartial) -> None:
        text = e.text
        delta = text[len(self.sent_transcript) :] if text.startswith(self.sent_transcript) else ""
        if delta:
            await self.send(
                "conversation.item.input_audio_transcription.delta",
                item_id=self.user_item,
                content_index=0,
                delta=delta,
            )
            self.sent_transcript = text
        await self.send("speclive.transcript", item_id=self.user_item, stable=e.stable, tentative=e.tentative)

    async def _transcript_final(self, e: ev.TranscriptFinal) -> None:
        await self.send(
            "conversation.item.input_audio_transcription.completed",
            item_id=self.user_item,
            content_index=0,
            transcript=e.text,
        )

    # ---- speclive's own events --------------------------------------------------------------
    async def _speculation(self, e: ev.Speculation) -> None:
        await self.send(
            "speclive.speculation",
            item_id=self.user_item,
            partial=e.partial,
            candidate=e.candidate,
            first_sentence=e.first_sentence,
            drafted=e.drafted,
            accepted=e.accepted,
            presynthesized=e.presynthesized,
        )

    async def _translation(self, e: ev.TranslationUpdate) -> None:
        await self.send(
            "speclive.translation",
            item_id=self.user_item,
            stable=e.stable,
            tentative=e.tentative,
            source=e.source,
            final=e.final,
        )

    async def _turn_prediction(self, e: ev.TurnPrediction) -> None:
        await self.send(
            "speclive.turn_prediction",
            item_id=self.user_item,
            audio_p=e.audio_p,
            text_p=e.text_p,
            score=e.score,
            bar=e.bar,
            silence_s=round(e.silence_s, 3),
            end=e.end,
        )

    async def _notice(self, e: ev.Notice) -> None:
        await self.send("speclive.notice", code=e.code, message=e.message)
        if e.code == "max_speech":  # a limit the client hit: also an error, as OpenAI's
            await self.error("turn_too_long", e.message)

    # ---- the answer ---------------------------------------------------------------------
    async def _answer_delta(self, e: ev.AnswerDelta) -> None:
        r = await self.begin_response()
        r.text.append(e.text)
        if not r.cancelled:
            await self.send(
                "response.output_audio_transcript.delta",
                response_id=r.id,
                item_id=r.item_id,
                output_index=0,
                content_index=0,
                delta=e.text,
            )

    async def _audio_chunk(self, e: ev.AudioChunk) -> None:
        r = await self.begin_response()
        if not r.cancelled and self.settings().speak:
            await self.send_audio(r, e)

    async def _interrupted(self, e: ev.Interrupted) -> None:
        await self.send("speclive.interrupted", played=e.played)
        # the pipeline stopped the answer: nothing more of it comes, so a cancelled one's drop
        # ends here (a turn taken up again sends no metrics before its next answer)
        self.dropping = False
        if self.response is not None:
            self.response.cancelled = True
            await self.end_response("cancelled")

    async def _turn_metrics(self, e: ev.TurnMetrics) -> None:
        metrics = {k: v for k, v in e.to_json().items() if k not in ("type", "extra")}
        await self.send("speclive.turn_metrics", item_id=self.user_item, **metrics)
        self.dropping = False
        if self.response is not None:
            await self.end_response("cancelled" if self.response.cancelled else "completed")

    PIPELINE_EVENTS: ClassVar[dict[type[ev.Event], Callable[[Conversation, Any], Awaitable[None]]]] = {
        ev.SpeechStarted: _speech_started,
        ev.SpeechStopped: _speech_stopped,
        ev.TranscriptPartial: _transcript_partial,
        ev.TranscriptFinal: _transcript_final,
        ev.Speculation: _speculation,
        ev.AnswerDelta: _answer_delta,
        ev.AudioChunk: _audio_chunk,
        ev.TranslationUpdate: _translation,
        ev.TurnPrediction: _turn_prediction,
        ev.Interrupted: _interrupted,
        ev.Notice: _notice,
        ev.TurnMetrics: _turn_metrics,
    }

    # ---- responses ----------------------------------------------------------------------
    async def cancel_response(self) -> None:
        """The client cancelled the answer (``response.cancel``): it ends as cancelled, and what
        the pipeline still says for this turn is dropped."""
        if self.response is not None:
            self.response.cancelled = True
            self.dropping = True
            await self.end_response("cancelled")

    async def drop_pipeline(self) -> None:
        """The session replaces its pipeline: an answer still open ends (``incomplete``; what
        the old pipeline still had to say never comes), and nothing is dropped any more."""
        self.dropping = False
        if self.response is not None:
            await self.end_response("cancelled" if self.response.cancelled else "incomplete")

    async def fail_response(self) -> None:
        """The server failed while computing the answer: the response in progress ends as
        ``failed``; the next answer starts a response of its own."""
        self.dropping = False
        await self.end_response("failed")

    async def begin_response(self) -> _Response:
        if self.response is None:
            self.response = _Response(new_id("resp"), new_id("item"))
        r = self.response
        if not r.started:
            r.started = True
            await self.send(
                "response.created",
                response={"id": r.id, "object": "realtime.response", "status": "in_progress", "output": []},
            )
            item = {
                "id": r.item_id,
                "object": "realtime.item",
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            await self.send("response.output_item.added", response_id=r.id, output_index=0, item=item)
            await self.send(
                "response.content_part.added",
                response_id=r.id,
                item_id=r.item_id,
                output_index=0,
                content_index=0,
                part={"type": "audio", "transcript": ""},
            )
        return r

    async def send_audio(self, r: _Response, chunk: ev.AudioChunk) -> None:
        rate = self.settings().output_rate
        samples = (
            resample(chunk.samples, chunk.sample_rate, rate) if chunk.sample_rate != rate else chunk.samples
        )
        step = int(DELTA_S * rate)
        for i in range(0, len(samples), step):
            if r.cancelled or self.response is not r:
                return  # ended while its audio went out (a cancel, a barge-in): no delta after its done
            data = base64.b64encode(pcm16(samples[i : i + step])).decode("ascii")
            await self.send(
                "response.output_audio.delta",
                response_id=r.id,
                item_id=r.item_id,
                output_index=0,
                content_index=0,
                delta=data,
            )
        r.audio_s += len(samples) / rate

    async def end_response(self, status: str) -> None:
        r, self.response = self.response, None
        if r is None or not r.started:
            return
        text = "".join(r.text)
        base = {"response_id": r.id, "item_id": r.item_id, "output_index": 0, "content_index": 0}
        await self.send("response.output_audio.done", **base)
        await self.send("response.output_audio_transcript.done", **base, transcript=text)
        await self.send("response.content_part.done", **base, part={"type": "audio", "transcript": text})
        item = {
            "id": r.item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "assistant",
            "status": "completed" if status == "completed" else "incomplete",
            "content": [{"type": "audio", "transcript": text}],
        }
        await self.send("response.output_item.done", response_id=r.id, output_index=0, item=item)
        await self.send(
            "response.done",
            response={
                "id": r.id,
                "object": "realtime.response",
                "status": status,
                "output": [item],
                "usage": None,
            },
        )
        self.prev_item = r.item_id
