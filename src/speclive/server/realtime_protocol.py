"""The shared vocabulary of the realtime protocol (``WS /v1/realtime``): its error, its ids, the
beta protocol's event names and the close codes the server uses."""

from __future__ import annotations

import uuid

#: close codes: a client that stopped reading, an idle session, a server that cannot take the
#: session or its turn now ("try again later")
CLOSE_SLOW, CLOSE_IDLE, CLOSE_OVERLOADED = 1008, 1000, 1013
#: the beta protocol's names of the events the GA protocol renamed (a client asks for the beta
#: with the ``OpenAI-Beta: realtime=v1`` header or the ``openai-beta.realtime-v1`` subprotocol)
BETA_NAMES = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
}


def new_id(prefix: str) -> str:
    """A fresh id of the protocol's shape: ``prefix`` + ``_`` + 20 hex digits."""
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


class ProtocolError(Exception):
    """A client event the session cannot take: sent back as an ``error`` event (``code``,
    ``message``, ``param``), and the session goes on."""

    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.code, self.message, self.param = code, message, param
