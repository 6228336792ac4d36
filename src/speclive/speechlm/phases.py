"""Per-request phase machine: text -> transition -> audio -> drain -> done.

The machine never looks at positions: each step it is told which vocabulary *region* the model's
unmasked primary distribution prefers (``Region.TEXT`` or ``Region.AUDIO``, from the argmax over the
disjoint regions) and answers with a :class:`StepPlan` saying what this step emits:

- ``text``: sample one text token (vocabulary masked to text);
- ``force``: emit a deterministic bridging token (transition phase);
- ``audio``: sample the streams flagged in ``active`` (the others get their pad code, the delay);
- ``finish``: nothing more to emit.

The audio phase ends when the model's argmax leaves the audio region (or at ``max_audio_frames``);
the drain that follows emits ``S - 1`` steps in which finished streams are padded, so the delayed
grid is complete for de-interleaving.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from speclive.speechlm.delay import stream_active


class Phase(StrEnum):
    TEXT = "text"
    TRANSITION = "transition"
    AUDIO = "audio"
    DRAIN = "drain"
    DONE = "done"


class Region(StrEnum):
    TEXT = "text"
    AUDIO = "audio"


MODES = ("text", "text_audio")


@dataclass(frozen=True)
class PhaseConfig:
    """What one request may emit. Defaults suit the tiny test models."""

    mode: str = "text_audio"  #: "text": text only; "text_audio": text, then speech
    n_streams: int = 8  #: S, codebook streams of the audio phase
    bridge: tuple[int, ...] = ()  #: bridging tokens forced between text and audio
    eos: int | None = None  #: text token that ends the request
    max_text_tokens: int = 64  #: text tokens before the switch to audio (or the end, in text mode)
    min_text_tokens: int = 0  #: text tokens before the model may switch to audio
    max_audio_frames: int = 64  #: audio frames T at most
    min_audio_frames: int = 1  #: frames before the model may end the audio phase
    audio_only: bool = False  #: start in the audio phase (models without text, e.g. MusicGen)


@dataclass(frozen=True)
class StepPlan:
    kind: str  #: "text" | "force" | "audio" | "finish"
    token: int | None = None  #: the forced token of a "force" step
    active: tuple[bool, ...] = ()  #: per stream: sample (True) or pad (False), "audio" steps


@dataclass
class PhaseState:
    """Where one request is; mutated by :func:`plan` and the ``commit_*`` functions."""

    cfg: PhaseConfig
    phase: Phase = Phase.TEXT
    n_text: int = 0
    n_bridge: int = 0
    audio_step: int = 0  #: delayed rows emitted so far
    n_frames: int | None = None  #: T, known once the drain starts
    log: list[Phase] = field(default_factory=list)  #: phase of every emitted step

    def __post_init__(self) -> None:
        if self.cfg.mode not in MODES:
            raise ValueError(f"unknown mode {self.cfg.mode!r}; use one of {MODES}")
        if self.cfg.audio_only:
            self.phase = Phase.AUDIO

    @property
    def done(self) -> bool:
        return self.phase is Phase.DONE

    @property
    def in_audio(self) -> bool:
        """Audio or drain: the steps where CFG merges logits."""
        return self.phase in (Phase.AUDIO, Phase.DRAIN)


def plan(st: PhaseState, region: Region | None) -> StepPlan:
    """Decide this step's emission from the region the model's unmasked argmax falls in."""
    c = st.cfg
    if st.phase is Phase.TEXT:
        wants = region is Region.AUDIO and st.n_text >= c.min_text_tokens
        switch = c.mode == "text_audio" and (wants or st.n_text >= c.max_text_tokens)
        if not switch:
            return StepPlan("text")
        st.phase = Phase.TRANSITION
    if st.phase is Phase.TRANSITION:
        if st.n_bridge < len(c.bridge):
            return StepPlan("force", token=c.bridge[st.n_bridge])
        st.phase = Phase.AUDIO
    if st.phase is Phase.AUDIO:
        t = st.audio_step
        ended = region is Region.TEXT or t >= c.max_audio_frames
        if not (ended and t >= c.min_audio_frames):
            return StepPlan("audio", active=tuple(stream_active(t, i, None) for i in range(c.n_streams)))
        st.n_frames = t
        st.phase = Phase.DRAIN
    if st.phase is Phase.DRAIN:
        t = st.audio_step
        if t >= st.n_frames + c.n_streams - 1:
            st.phase = Phase.DONE
            return StepPlan("finish")
        return StepPlan("audio", active=tuple(stream_active(t, i, st.n_frames) for i in range(c.n_streams)))
    return StepPlan("finish")


def commit_text(st: PhaseState, token: int) -> None:
    st.log.append(Phase.TEXT)
    if st.cfg.eos is not None and token == st.cfg.eos:
        st.phase = Phase.DONE
        return
    st.n_text += 1
    if st.cfg.mode == "text" and st.n_text >= st.cfg.max_text_tokens:
        st.phase = Phase.DONE


def commit_force(st: PhaseState) -> None:
    st.log.append(Phase.TRANSITION)
    st.n_bridge += 1


def commit_audio(st: PhaseState) -> None:
    st.log.append(st.phase)
    st.audio_step += 1
    if st.phase is Phase.DRAIN and st.audio_step >= st.n_frames + st.cfg.n_streams - 1:
        st.phase = Phase.DONE
