"""End-of-turn policies: when a silence in the user's speech ends their turn.

A policy sees three things at a pause: the silence so far, the audio model's probability that
the turn is complete (Smart Turn, on the turn's audio up to the pause) and the answering LM's
probability that the user's message ends with the words heard (the chat template's
end-of-user-message token after the transcript, read inside the passes that speculate the
answer). It ends the turn the first moment its score clears a bar that falls with the silence:

    bar(s) = threshold * (1 - (s - min_silence) / (max_silence - min_silence)),  s >= min_silence

so a confident score ends the turn at the first short silence (``min_silence_s``), a doubtful
one needs a longer silence, and ``max_silence_s`` ends any turn (the fallback, where the bar
reaches 0). Kinds:

- ``silence``: no model, the turn ends after ``max_silence_s`` (the classic VAD timeout);
- ``audio`` / ``text``: that one probability is the score;
- ``fused``: the weighted geometric mean ``text^w * audio^(1-w)`` (``w = text_weight``), so
  either model can veto a cut-off; where one signal is missing the other is the score.

``eagerness`` (``low | medium | high | auto``, as OpenAI's ``semantic_vad`` names them) picks
a calibrated ``threshold`` and ``max_silence_s``; ``auto`` is ``medium``. The presets and how
they were calibrated are in docs/turns.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from speclive.errors import ConfigError

KINDS = ("silence", "audio", "text", "fused")
EAGERNESS = ("low", "medium", "high", "auto")

#: eagerness -> (threshold at the first check, silence that ends any turn) of the fused policy,
#: and the text probability's weight in it: calibrated on the turn set's dev split, the fastest
#: setting within 15 / 20 / 30 % false cut-offs (docs/turns.md)
PRESETS: dict[str, tuple[float, float]] = {
    "low": (0.9, 2.0),
    "medium": (0.4, 2.0),
    "high": (0.3, 2.0),
}
TEXT_WEIGHT = 0.9


@dataclass
class TurnPolicyConfig:
    #: silence | audio | text | fused (module docstring)
    kind: str = "fused"
    #: low | medium | high | auto: the preset of ``threshold`` and ``max_silence_s``
    eagerness: str = "auto"
    #: the score a turn needs at ``min_silence_s`` (None: the eagerness preset)
    threshold: float | None = None
    #: the first silence at which the turn may end (the first check)
    min_silence_s: float = 0.1
    #: the silence that ends every turn (None: the eagerness preset; for ``silence``, the timeout)
    max_silence_s: float | None = None
    #: ``fused``: the text probability's weight in the geometric mean (the audio's is 1 - w)
    text_weight: float = TEXT_WEIGHT

    def resolved(self) -> TurnPolicyConfig:
        """A copy with the preset filled in and every field checked (``ConfigError``)."""
        if self.kind not in KINDS:
            raise ConfigError(f"invalid turn policy {self.kind!r}; allowed values: {', '.join(KINDS)}")
        if self.eagerness not in EAGERNESS:
            allowed = ", ".join(EAGERNESS)
            raise ConfigError(f"invalid eagerness {self.eagerness!r}; allowed values: {allowed}")
        preset = PRESETS["medium" if self.eagerness == "auto" else self.eagerness]
        out = TurnPolicyConfig(
            kind=self.kind,
            eagerness=self.eagerness,
            threshold=preset[0] if self.threshold is None else float(self.threshold),
            min_silence_s=float(self.min_silence_s),
            max_silence_s=preset[1] if self.max_silence_s is None else float(self.max_silence_s),
            text_weight=float(self.text_weight),
        )
        assert out.threshold is not None and out.max_silence_s is not None
        if not 0.0 <= out.threshold <= 1.0:
            raise ConfigError(f"turn threshold must be in [0, 1], got {out.threshold}")
        if not 0.0 < out.min_silence_s <= out.max_silence_s:
            raise ConfigError(
                f"need 0 < min_silence_s <= max_silence_s, got {out.min_silence_s} and {out.max_silence_s}"
            )
        if not 0.0 <= out.text_weight <= 1.0:
            raise ConfigError(f"text_weight must be in [0, 1], got {out.text_weight}")
        return out


@dataclass
class TurnSignals:
    """The probabilities a policy reads at one pause (None: not computed / not available)."""

    audio: float | None = None
    text: float | None = None


class TurnPolicy:
    """``decide(signals, silence_s)``: whether the turn ends now (module docstring)."""

    def __init__(self, config: TurnPolicyConfig | None = None):
        self.cfg = (config or TurnPolicyConfig()).resolved()

    @property
    def needs_audio(self) -> bool:
        return self.cfg.kind in ("audio", "fused")

    @property
    def needs_text(self) -> bool:
        return self.cfg.kind in ("text", "fused")

    @property
    def min_silence_s(self) -> float:
        return self.cfg.min_silence_s

    @property
    def max_silence_s(self) -> float:
        assert self.cfg.max_silence_s is not None
        return self.cfg.max_silence_s

    def ready(self, s: TurnSignals) -> bool:
        """Whether the signals this policy reads are all there (a missing text signal of a
        backend that cannot give one counts as there: see ``score``)."""
        return not (self.needs_audio and s.audio is None)

    def score(self, s: TurnSignals) -> float | None:
        """The policy's probability that the turn is over (None: no model, or no signal)."""
        k = self.cfg.kind
        if k == "silence":
            return None
        if k == "audio":
            return s.audio
        if k == "text":
            return s.text
        if s.text is None:
            return s.audio
        if s.audio is None:
            return s.text
        w = self.cfg.text_weight
        return float(max(s.text, 0.0) ** w * max(s.audio, 0.0) ** (1.0 - w))

    def bar(self, silence_s: float) -> float:
        """The score that ends the turn after ``silence_s`` of silence (above 1: not yet)."""
        lo, hi = self.cfg.min_silence_s, self.max_silence_s
        if silence_s >= hi - 1e-9:
            return 0.0
        if silence_s < lo - 1e-9:
            return 2.0
        assert self.cfg.threshold is not None
        return self.cfg.threshold * (1.0 - (silence_s - lo) / max(1e-9, hi - lo))

    def decide(self, s: TurnSignals, silence_s: float) -> bool:
        if silence_s >= self.max_silence_s - 1e-9:
            return True
        score = self.score(s)
        return score is not None and score >= self.bar(silence_s)

    def silence_needed(self, s: TurnSignals) -> float:
        """The silence after which ``decide`` says yes with these signals (the latency the
        policy adds, for sweeps): ``max_silence_s`` without a score."""
        score = self.score(s)
        lo, hi = self.cfg.min_silence_s, self.max_silence_s
        assert self.cfg.threshold is not None
        if score is None:
            return hi
        if score >= self.cfg.threshold:
            return lo
        if self.cfg.threshold <= 0:
            return lo
        return lo + (hi - lo) * (1.0 - score / self.cfg.threshold)
