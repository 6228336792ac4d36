"""SSBD live re-translation: re-translate a growing source, drafting with the previous output.

Each ``update(partial)`` re-translates the whole partial source (re-translation keeps quality
and lets the output revise itself), but instead of decoding from scratch it runs ONE
speculative decode of the engine with:

- the previous translation as the draft (``HistoryDrafter``: whole previous output first, then
  recycled spans of it after a divergence),
- biased verification for the previous output only: P' = (1-β)P + β·onehot(draft)
  (SSBD eq. 5, ``SourceRule({"history": BiasedRule(β)})``); recycled and continuation tokens
  stay under lossless greedy verification,
- the target's KV cache kept across updates: the decoder trims it to the common prefix of the
  old and new prompt, so only the changed tail of the source and the new output are computed.

Mask-k (Arivazhagan et al. 2020) hides the last k output tokens of non-final updates. With
``display_only=True`` (SSBD's proposal) only the display is masked and the draft keeps them;
with ``display_only=False`` the draft is trimmed too (fewer erasures, less reuse).

``baseline=True`` is plain autoregressive re-translation through the same engine and cache
reuse, so a speedup measured against it is due to the drafting alone.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from speclive.acceptance import BiasedRule, GreedyRule, SourceRule
from speclive.backends.base import Backend
from speclive.decoder import GenerationConfig, make_decoder
from speclive.drafting.history import HistoryDrafter
from speclive.errors import ConfigError, SessionClosedError
from speclive.sessions.metrics import normalized_erasure

LANGUAGES = {
    "de": "German",
    "zh": "Chinese (Simplified)",
    "ja": "Japanese",
    "fr": "French",
    "es": "Spanish",
    "it": "Italian",
    "pt": "Portuguese",
    "ru": "Russian",
    "ko": "Korean",
}

SYSTEM_PROMPT = (
    "You are a professional simultaneous interpreter. Translate the user's English text into "
    "{language}. The text may stop in the middle of a sentence: translate exactly what is "
    "there, do not complete it, do not add anything. Output only the translation."
)


@dataclass
class RetranslationUpdate:
    """One re-translation: what was translated, the full output and what is displayed."""

    source: str
    output: str
    display: str
    final: bool
    token_ids: list[int] = field(repr=False)
    #: previous-output tokens offered as the draft / accepted from it
    drafted: int = 0
    accepted: int = 0
    #: tokens taken from recycled spans of the previous output after a divergence
    recycled: int = 0
    new_tokens: int = 0
    target_forwards: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["token_ids"]
        return d


@dataclass
class RetranslateConfig:
    target_lang: str = "de"
    #: bias towards the previous output in verification (0 = lossless greedy verification)
    beta: float = 0.2
    #: output tokens hidden at the end of non-final updates (0 = off)
    mask_k: int = 3
    #: mask only the display (True) or also trim the draft (False)
    display_only: bool = True
    #: plain autoregressive re-translation (the reference)
    baseline: bool = False
    #: after a divergence, draft recycled spans of the previous output
    recycle: bool = True
    #: draft the previous output in cost-curve-sized chunks (False: all of it in one pass, as
    #: SSBD's Algorithm 1 -- on a CPU a long verification costs nearly as much as AR steps)
    chunked: bool = True
    max_tokens: int = 256

    def validate(self) -> None:
        if self.target_lang not in LANGUAGES:
            raise ConfigError(
                f"invalid target language {self.target_lang!r}; allowed values: {', '.join(LANGUAGES)}"
            )
        if not 0.0 <= self.beta < 1.0:
            raise ConfigError(f"beta must be in [0, 1), got {self.beta}")
        if self.mask_k < 0:
            raise ConfigError(f"mask_k must be >= 0, got {self.mask_k}")
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")


class ReTranslator:
    """Session: ``update(partial)`` per source revision, ``finish()`` once at the end."""

    #: ``update`` takes no deadline (``sessions.simulate.StreamingSession``)
    supports_deadline = False

    def __init__(self, model: Backend, config: RetranslateConfig | None = None, **overrides):
        cfg = config or RetranslateConfig()
        if overrides:
            cfg = RetranslateConfig(**{**asdict(cfg), **overrides})
        cfg.validate()
        self.cfg = cfg
        self.backend = model
        self.tok = model.tokenizer
        if cfg.baseline:
            self.drafter, rule = None, GreedyRule()
        else:
            self.drafter = HistoryDrafter(recycle=cfg.recycle, chunked=cfg.chunked)
            rule = SourceRule({"history": BiasedRule(cfg.beta)}) if cfg.beta > 0 else GreedyRule()
        self.decoder = make_decoder(model, self.drafter, rule)
        self.system = SYSTEM_PROMPT.format(language=LANGUAGES[cfg.target_lang])
        self.updates: list[RetranslationUpdate] = []
        self._prev: list[int] = []
        self._source = ""
        self.finished = False

    # ---- the session protocol ------------------------------------------------------------
    def update(self, partial: str) -> RetranslationUpdate:
        """Re-translate the source as it stands now (it may grow, shrink or be rewritten)."""
        if self.finished:
            raise SessionClosedError("update() after finish(): this re-translation session is closed")
        return self._step(partial, final=False)

    def finish(self, final: str | None = None) -> RetranslationUpdate:
        """Translate the complete source (default: the last update's) and close the session."""
        if self.finished:
            raise SessionClosedError("finish() called twice: this re-translation session is closed")
        u = self._step(self._source if final is None else final, final=True)
        self.finished = True
        return u

    def close(self) -> None:
        self.decoder.close()

    # ---- internals -----------------------------------------------------------------------
    def prompt_ids(self, source: str) -> list[int]:
        return self.tok.chat(
            [{"role": "system", "content": self.system}, {"role": "user", "content": source}]
        )

    def _display(self, ids: list[int], final: bool) -> str:
        k = self.cfg.mask_k
        if final or k == 0:
            return self.tok.decode(ids).strip()
        return self.tok.decode(ids[: max(0, len(ids) - k)]).strip()

    def _step(self, source: str, final: bool) -> RetranslationUpdate:
        source = " ".join(source.split())
        if not source:
            self._source = source
            self._prev = []
            u = RetranslationUpdate(source, "", "", final, [])
            self.updates.append(u)
            return u
        prompt = self.prompt_ids(source)
        draft = self._prev
        if self.cfg.mask_k and not self.cfg.display_only:
            draft = draft[: max(0, len(draft) - self.cfg.mask_k)]
        if self.drafter is not None:
            self.drafter.set_history(draft)
        gen = GenerationConfig(max_tokens=self.cfg.max_tokens, max_draft_nodes=512)
        t0 = time.perf_counter()
        res = self.decoder.run(prompt, gen)
        seconds = time.perf_counter() - t0
        s = res.stats
        ids = res.token_ids
        self._source = source  # only now: a failed update (too long) leaves the session as it was
        self._prev = ids
        u = RetranslationUpdate(
            source=source,
            output=res.text.strip(),
            display=self._display(ids, final),
            final=final,
            token_ids=ids,
            drafted=s.drafted_by_source.get("history", 0),
            accepted=s.accepted_by_source.get("history", 0),
            recycled=s.accepted_by_source.get("recycled", 0),
            new_tokens=len(ids),
            target_forwards=s.target_forwards,
            seconds=seconds,
        )
        self.updates.append(u)
        return u

    # ---- metrics -------------------------------------------------------------------------
    def metrics(self) -> dict:
        """Stream metrics (SSBD §Experiment): NE on the display, A/D, A/O, forwards, tokens/s."""
        ups = self.updates
        drafted = sum(u.drafted for u in ups)
        accepted = sum(u.accepted for u in ups)
        out = sum(u.new_tokens for u in ups)
        secs = sum(u.seconds for u in ups)
        return {
            "normalized_erasure": normalized_erasure([u.display for u in ups], self.cfg.target_lang),
            "acceptance_per_draft": accepted / drafted if drafted else 0.0,
            "accepted_per_output": accepted / out if out else 0.0,
            "recycled_per_output": sum(u.recycled for u in ups) / out if out else 0.0,
            "target_forwards": sum(u.target_forwards for u in ups),
            "drafted": drafted,
            "accepted": accepted,
            "output_tokens": out,
            "seconds": secs,
            "tokens_per_second": out / secs if secs > 0 else 0.0,
            "updates": len(ups),
        }
