"""Load the models a live pipeline needs once, and build pipelines over them by name.

The CLI, the benchmark and the server all go through ``load_live_models`` and
``make_pipeline``, so a pipeline is configured the same way everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from speclive.asr.transcribe import TranscribeConfig, Transcriber
from speclive.errors import ConfigError
from speclive.live.clock import Clock
from speclive.live.pipeline import LiveConfig, LivePipeline
from speclive.live.smartturn import SmartTurn
from speclive.live.transcriber import LiveTranscriber
from speclive.live.translator import LiveTranslator
from speclive.live.turnpolicy import TurnPolicyConfig
from speclive.live.vad import TurnConfig
from speclive.live.voicechat import VoiceChat
from speclive.loader import load_backend
from speclive.tts.piper import PiperTTS

KINDS = ("chat", "translate", "transcribe")


@dataclass
class LiveModelsConfig:
    #: the LLM (registry name, .gguf path, HF folder or hub id) and its backend
    model: str = "qwen2.5-coder-0.5b-instruct"
    backend: str = "llamacpp"
    device: str = "cpu"
    threads: int | None = None
    #: Whisper target, its draft and the decoding method (``asr.transcribe.METHODS``)
    asr_model: str = "whisper-base"
    asr_draft: str = "whisper-tiny.en"
    asr_method: str = "specasr"
    #: the target encodes the audio plus this margin, not Whisper's 30 s window (a live turn
    #: is a few seconds, so the encoder runs over a fraction of the frames; a looping transcript
    #: falls back to the full window).
    #: None: the full window
    asr_margin_s: float | None = 1.0
    #: draft each transcription pass with the previous passes' hypotheses (False: decode
    #: every pass from scratch, the baseline; the transcripts are the same)
    stream_draft: bool = True
    #: the model of the streaming partial passes: "target" or "draft" (``TranscribeConfig``)
    stream_partials: str = "target"
    #: Piper voice; None: no speech output
    voice: str | None = "piper-joe-medium"
    #: what to load: an LLM is not needed to transcribe
    need_llm: bool = True
    #: run the LLM on these `vllm serve` replicas instead of in process (``backend`` unused)
    vllm_urls: tuple[str, ...] = ()
    vllm_top_k: int = 20
    #: the audio end-of-turn model of semantic turn detection (registry name or .onnx path),
    #: loaded when a pipeline first needs it
    turn_model: str = "smart-turn-v3.2"


@dataclass
class LiveModels:
    cfg: LiveModelsConfig
    transcriber: object
    llm: object | None = None
    tts: object | None = None
    warm: bool = field(default=False)
    _turn_model: object | None = None

    def turn_model(self) -> object:
        """The audio end-of-turn model (``live.smartturn.SmartTurn``), loaded on first use."""
        if self._turn_model is None:
            self._turn_model = SmartTurn(self.cfg.turn_model)
        return self._turn_model

    def warm_up(self) -> None:
        """One tiny run of each model, so the first turn is not the one paying for lazy setup."""
        import numpy as np

        if self.warm:
            return
        tone = (0.1 * np.sin(np.arange(8000) * 0.05)).astype(np.float32)
        self.transcriber.transcribe(tone)  # type: ignore[attr-defined]
        if self.tts is not None:
            self.tts.synthesize("Ready.")  # type: ignore[attr-defined]
        # a vLLM engine (``in_process`` False) is warm
        if self.llm is not None and self.llm.in_process:  # type: ignore[attr-defined]
            llm = self.llm
            state = llm.new_state()  # type: ignore[attr-defined]
            try:
                llm.extend(state, llm.tokenizer.encode("Hello"), last_only=True)  # type: ignore[attr-defined]
            finally:
                llm.release(state)  # type: ignore[attr-defined]
        self.warm = True


def load_live_models(cfg: LiveModelsConfig | None = None) -> LiveModels:
    cfg = cfg or LiveModelsConfig()
    tr = Transcriber(
        TranscribeConfig(
            model=cfg.asr_model,
            method=cfg.asr_method,
            draft=cfg.asr_draft,
            threads=cfg.threads,
            target_audio_margin_s=cfg.asr_margin_s,
            stream_partials=cfg.stream_partials,
        )
    )
    llm = None
    if cfg.need_llm and cfg.vllm_urls:
        from speclive.engines.vllm import connect  # lazy: the vLLM client needs httpx (the serve extra)

        llm = connect(cfg.vllm_urls, model=cfg.model, top_k=cfg.vllm_top_k)
    elif cfg.need_llm:
        llm = load_backend(cfg.model, cfg.backend, threads=cfg.threads, device=cfg.device)
    tts = None
    if cfg.voice:
        tts = PiperTTS(cfg.voice)
    return LiveModels(cfg, tr, llm, tts)


def make_pipeline(
    kind: str,
    models: LiveModels,
    mode: str | None = None,
    clock: Clock | None = None,
    turn: TurnConfig | None = None,
    sample_rate: int = 16_000,
    predgen=None,
    retranslate=None,
    asr_step_s: float = 1.0,
    speak: bool | None = None,
    stream_draft: bool | None = None,
    stream_partials: str | None = None,
    turn_detection: str = "server_vad",
    policy: TurnPolicyConfig | None = None,
) -> LivePipeline:
    """A pipeline of ``kind`` (chat | translate | transcribe) over loaded ``models``.

    ``mode``: for chat ``predgen`` (default) | cascade | prefill | preemptive; for translate
    ``ssbd`` (default) | ar | cascade. ``predgen``/``retranslate``: their session configs.
    ``speak``: synthesize the answer (chat, default on) or the finished translated sentences
    (translate, default off: the bundled voice speaks English). ``stream_draft`` /
    ``stream_partials``: the streaming ASR's settings for this pipeline (None: the models').
    ``turn_detection``: ``server_vad`` (a silence of ``turn.end_s`` ends a turn) or
    ``semantic`` (``policy`` ends it, from the audio turn model and, in chat, the LM).
    """
    if kind not in KINDS:
        raise ConfigError(f"invalid pipeline {kind!r}; allowed values: {', '.join(KINDS)}")
    live = LiveConfig(
        turn=turn or TurnConfig(),
        asr_step_s=asr_step_s,
        stream_draft=models.cfg.stream_draft if stream_draft is None else stream_draft,
        stream_partials=stream_partials,
        turn_detection=turn_detection,
        policy=policy or TurnPolicyConfig(),
    )
    if kind == "transcribe":
        return LiveTranscriber(
            models.transcriber, live, clock, sample_rate, turn_model=_turn_model_for(models, live)
        )
    if models.llm is None:
        raise ConfigError(f"the {kind} pipeline needs an LLM (load_live_models with need_llm=True)")
    if kind == "chat":
        return VoiceChat(
            models.llm,  # type: ignore[arg-type]
            models.transcriber,
            tts=models.tts if speak is not False else None,  # type: ignore[arg-type]
            mode=mode or "predgen",
            predgen=predgen,
            config=live,
            clock=clock,
            sample_rate=sample_rate,
            turn_model=_turn_model_for(models, live),
        )
    return LiveTranslator(
        models.llm,  # type: ignore[arg-type]
        models.transcriber,
        mode=mode or "ssbd",
        retranslate=retranslate,
        tts=models.tts if speak else None,  # type: ignore[arg-type]
        config=live,
        clock=clock,
        sample_rate=sample_rate,
        turn_model=_turn_model_for(models, live),
    )


def _turn_model_for(models: LiveModels, live: LiveConfig) -> object | None:
    """The audio turn model where the pipeline's policy reads it (None otherwise)."""
    if live.turn_detection != "semantic" or live.policy.kind not in ("audio", "fused"):
        return None
    return models.turn_model()
