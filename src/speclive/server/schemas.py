"""Request bodies of the OpenAI-compatible endpoints (pydantic), and what the server refuses.

Unknown fields are ignored, as OpenAI-compatible servers do; fields whose meaning speclive
cannot honour (``n`` > 1, tools, log-probabilities, JSON modes, images) are refused with a 400
naming the field instead of being silently dropped.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from speclive.server.errors import APIError


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1)
    tools: list[Any] | None = None
    logprobs: bool | None = None
    response_format: dict[str, Any] | None = None

    def check_supported(self) -> None:
        if self.n != 1:
            raise APIError(400, "n > 1 is not supported: ask for one choice per request", param="n")
        if self.tools:
            raise APIError(400, "tool calling is not supported by this server", param="tools")
        if self.logprobs:
            raise APIError(400, "logprobs are not supported by this server", param="logprobs")
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            raise APIError(400, "only response_format {'type': 'text'} is supported", param="response_format")
        if isinstance(self.stop, list) and len(self.stop) > 4:
            raise APIError(400, "at most 4 stop sequences are allowed", param="stop")

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return tuple(s for s in stops if s)

    def chat_messages(self) -> list[dict[str, str]]:
        """Messages for the chat template (``developer`` is OpenAI's new name of ``system``)."""
        roles = {"developer": "system"}
        return [{"role": roles.get(m.role, m.role), "content": m.text()} for m in self.messages]


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    input: str = Field(min_length=1)
    voice: str
    response_format: str = "wav"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    instructions: str | None = None
    stream_format: str | None = None
