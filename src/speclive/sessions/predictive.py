"""PredGen: answer while the user is still speaking (input-time speculation for voice chat).

The session is fed partial prompts (``update``) and the final one (``finish``). On every
partial prompt it runs ONE speculative decode of the engine whose draft is the previous
candidate answer (``HistoryDrafter``): the target verifies the old candidate against the new
prompt in one pass (fused with the few new prompt tokens), keeps what the verifier accepts,
continues from the first rejected token until the candidate's first sentence is complete, and
pre-synthesizes that sentence with TTS whenever it changed. On ``finish`` the same happens
with the complete prompt; if the first sentence comes out unchanged its audio is already there
and plays at once, otherwise it is synthesized now. The rest of the answer then streams
sentence by sentence.

Verifiers (PredGen §3.1): ``greedy`` (lossless: the answer is exactly the target's greedy
answer to the full prompt), ``topk:K`` (accept previous-candidate tokens within the target's
top-K), ``reflection`` (the model judges, with the appendix A.2 yes/no prompt, whether the
candidate's first sentence is consistent with the partial prompt; yes accepts that sentence
whole, no falls back to greedy). Partial prompts use the appendix A.3 system prompt.

``baseline=True`` is the plain cascade: wait for the full prompt, generate, then TTS.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from speclive.acceptance import ForcedRule, GreedyRule, SourceRule, TopKRule
from speclive.backends.base import Backend
from speclive.decoder import GenerationConfig, SpeculativeDecoder
from speclive.drafting.history import HistoryDrafter
from speclive.errors import ConfigError, SessionClosedError
from speclive.tts.base import TTS, Audio
from speclive.tts.sentences import first_sentence_end, split_sentences

SYSTEM_PROMPT = (
    "The instruction provided by the user may be truncated. In such cases, respond based on your "
    "best guess of the incomplete instruction. Do not complain about incomplete prompts."
)
REFLECTION_PROMPT = (
    "You are given an incomplete prompt and the model's speculative partial answer.\n"
    "Please judge whether the partial prompt is consistent with the model's answer.\n"
    "Partial Prompt: {prompt}\n"
    "Partial Answer: {answer}"
)
VERIFIERS = ("greedy", "topk:K", "reflection")
FIRST_PASS = ("sentence", "chunks")


@dataclass
class PredGenConfig:
    #: greedy | topk:K | reflection
    verifier: str = "greedy"
    max_tokens: int = 256
    #: tokens generated past the end of the first sentence while speculating
    lookahead: int = 0
    system: str = SYSTEM_PROMPT
    #: plain cascade: no speculation before the full prompt
    baseline: bool = False
    #: synthesize the sentences after the first too (a real voice chat does; benchmarks may not)
    speak_rest: bool = True
    #: pre-synthesize a first sentence that survived a verification against newer input even
    #: when the synthesis will overrun the next word (it delays that update, never loses input).
    #: Off, a long sentence whose synthesis takes longer than a word is never pre-synthesized.
    presynth_stable: bool = True
    #: pre-synthesize every new first sentence at once, even one seen for the first time whose
    #: synthesis overruns the next word (a sentence produced by the last update before the user
    #: stops otherwise reaches ``finish`` without audio although the final verification keeps it).
    #: Off: on 40 MT-Bench questions it made greedy slower, 1.46x vs 1.72x
    #: (predgen-qwen0.5b-llamacpp-turn1-40q-eager): the syntheses delay the updates, and the
    #: wait at the end of the input grew more than the TTS time it saved
    presynth_eager: bool = False
    #: how the candidate's first sentence is verified: "sentence" = all of it in one pass (the
    #: paper), "chunks" = cost-curve-sized chunks, which stop at the first rejected chunk
    #: instead of paying for a whole long sentence rejected early. Measured on 12 MT-Bench
    #: questions (predgen-qwen0.5b-llamacpp-turn1-firstpass): greedy 1.46x with one pass vs
    #: 1.35x with chunks -- the accepted sentences' extra passes cost more than the early
    #: rejections saved -- so one pass stays the default.
    first_pass: str = "sentence"


@dataclass
class CandidateUpdate:
    """What one partial prompt produced."""

    partial: str
    candidate: str
    first_sentence: str
    drafted: int = 0
    accepted: int = 0
    forwards: int = 0
    seconds: float = 0.0
    #: the first sentence changed and was synthesized again in this update
    resynthesized: bool = False
    tts_s: float = 0.0


@dataclass
class PredGenResponse:
    """The answer to the final prompt and its latency figures (from the call to ``finish``)."""

    response: str
    first_sentence: str
    token_ids: list[int] = field(repr=False)
    #: time to first sentence: finish() until the first sentence's text is complete
    ttfs_s: float = 0.0
    #: LLM forward passes until then (1 = the final verification accepted it all)
    nfetfs: int = 0
    #: finish() until the first sentence's audio can start
    audio_latency_s: float = 0.0
    presynth_used: bool = False
    first_audio: Audio | None = field(default=None, repr=False)
    audio: list[Audio] = field(default_factory=list, repr=False)
    total_s: float = 0.0
    forwards: int = 0


#: method options after '@' besides FIRST_PASS: "fits" = pre-synthesize only what fits before
#: the next word (``presynth_stable=False``); "eager" = every new first sentence
#: (``presynth_eager=True``)
METHOD_OPTIONS = (*FIRST_PASS, "fits", "eager")


def parse_method(method: str) -> tuple[str, dict]:
    """``VERIFIER[@OPTION...]`` (e.g. ``greedy@chunks``, ``greedy@fits``) -> (verifier, config
    overrides); the benchmark's way of naming variants measured side by side."""
    verifier, *opts = method.split("@")
    _parse_verifier(verifier)
    kw: dict = {}
    for o in opts:
        if o in FIRST_PASS:
            kw["first_pass"] = o
        elif o == "fits":
            kw["presynth_stable"] = False
        elif o == "eager":
            kw["presynth_eager"] = True
        else:
            allowed = ", ".join(METHOD_OPTIONS)
            raise ConfigError(f"invalid option {o!r} in method {method!r}; allowed after '@': {allowed}")
    return verifier, kw


def chat_prompt(
    tok, partial: str, history: list[dict[str, str]] | None = None, system: str = SYSTEM_PROMPT
) -> list[int]:
    """Token ids of the session's chat prompt for the user text ``partial`` (the system prompt,
    the earlier turns, then the user turn)."""
    msgs = [{"role": "system", "content": system}, *(history or [])]
    return tok.chat([*msgs, {"role": "user", "content": partial}])


def _parse_verifier(spec: str):
    name, _, arg = spec.strip().lower().partition(":")
    if name == "greedy" and not arg:
        return "greedy", SourceRule({"forced": ForcedRule()}, default=GreedyRule())
    if name == "topk":
        try:
            k = int(arg or 3)
        except ValueError:
            raise ConfigError(f"invalid verifier {spec!r}: top-k needs an integer, e.g. topk:3") from None
        return "topk", SourceRule({"history": TopKRule(k), "forced": ForcedRule()}, default=GreedyRule())
    if name == "reflection" and not arg:
        return "reflection", SourceRule({"forced": ForcedRule()}, default=GreedyRule())
    raise ConfigError(f"invalid verifier {spec!r}; allowed values: {', '.join(VERIFIERS)}")


class PredictiveResponder:
    """Session: ``update(partial)`` while the user speaks, ``finish()`` once at the end."""

    def __init__(
        self,
        model: Backend,
        config: PredGenConfig | None = None,
        tts: TTS | None = None,
        history: list[dict[str, str]] | None = None,
        **overrides,
    ):
        cfg = config or PredGenConfig()
        if overrides:
            cfg = PredGenConfig(**{**cfg.__dict__, **overrides})
        if cfg.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {cfg.max_tokens}")
        if cfg.first_pass not in FIRST_PASS:
            allowed = ", ".join(FIRST_PASS)
            raise ConfigError(f"invalid first_pass {cfg.first_pass!r}; allowed values: {allowed}")
        self.cfg = cfg
        self.kind, rule = _parse_verifier(cfg.verifier)
        self.one_pass_first = cfg.first_pass == "sentence"
        self.backend = model
        self.tok = model.tokenizer
        self.tts = tts
        self.history = list(history or [])
        self.drafter = None if cfg.baseline else HistoryDrafter(recycle=True)
        self.decoder = SpeculativeDecoder(model, self.drafter, None if cfg.baseline else rule)
        self._judge_state = model.new_state() if self.kind == "reflection" and not cfg.baseline else None
        self._yes, self._no = self._answer_ids("yes"), self._answer_ids("no")
        self.candidate: list[int] = []
        self.presynth: tuple[str, Audio] | None = None
        self.updates: list[CandidateUpdate] = []
        self.partial = ""  # the prompt the candidate answers
        self.latest = ""  # the newest partial prompt seen
        self._cut_off = False  # the last speculation stopped before its first sentence ended
        self._last_first = ""  # the first sentence the previous update produced
        self.finished = False
        self._synth_per_char: float | None = None

    # ---- prompts -------------------------------------------------------------------------
    def prompt_ids(self, partial: str) -> list[int]:
        """The chat prompt; the system prompt is there for the final prompt too (and for the
        baseline), so greedy PredGen and the cascade answer the very same prompt."""
        return chat_prompt(self.tok, partial, self.history, self.cfg.system)

    def _answer_ids(self, word: str) -> list[int]:
        ids = {self.tok.encode(w)[0] for w in (word, word.capitalize(), " " + word) if self.tok.encode(w)}
        return sorted(ids)

    def _judge(self, partial: str, sentence: str) -> bool:
        """Appendix A.2 self-reflection: is the candidate's first sentence consistent?"""
        assert self._judge_state is not None
        ids = self.tok.chat(
            [{"role": "user", "content": REFLECTION_PROMPT.format(prompt=partial, answer=sentence)}]
        )
        row = self.backend.sync(self._judge_state, ids)[-1]
        return float(np.max(row[self._yes])) > float(np.max(row[self._no]))

    # ---- the engine run shared by update and finish ---------------------------------------
    def _run(self, partial: str, final: bool, deadline: float | None = None, resume: bool = False) -> dict:
        """Verify the candidate against ``partial`` and generate; stop after the first sentence
        (+ lookahead) unless ``final``, or at ``deadline`` (a ``time.perf_counter()`` value:
        newer input has arrived, so this speculation is stale). Returns what happened, with
        first-sentence timings.

        ``resume``: the candidate was cut off (by a deadline) before its first sentence ended;
        continue it under the same prompt (its cache is still there) instead of re-verifying it.
        """
        t0 = time.perf_counter()
        prompt = self.prompt_ids(partial)
        prefix = list(self.candidate) if resume else []
        judge_forwards = 0
        if resume:
            assert self.drafter is not None
            self.drafter.set_history([])
        elif self.drafter is not None:
            forced = first = 0
            old_text = self.tok.decode(self.candidate)
            end = first_sentence_end(old_text)
            if end > 0:
                first = self._tokens_covering(self.candidate, end)
                if self.kind == "reflection":
                    judge_forwards = 1
                    if self._judge(partial, old_text[:end]):
                        forced = first
            one_pass = first if self.one_pass_first else 0
            self.drafter.set_history(self.candidate, forced=forced, first_chunk=one_pass)
        gen = GenerationConfig(max_tokens=self.cfg.max_tokens, max_draft_nodes=512)
        out: list[int] = list(prefix)
        first_end, first_at, first_fw, extra = -1, None, 0, 0
        gen.max_tokens = max(1, self.cfg.max_tokens - len(prefix))
        events = self.decoder.generate(prompt + prefix, gen)
        try:
            for ev in events:
                stats = self.decoder.last_stats  # the generator made it on its first step
                out.extend(ev.tokens)
                if first_end < 0:
                    text = self.tok.decode(out)
                    first_end = first_sentence_end(text, complete=bool(stats.finish_reason))
                    if first_end >= 0:
                        first_at = time.perf_counter()
                        first_fw = judge_forwards + stats.prefill_forwards + stats.target_forwards
                elif not final:
                    extra += len(ev.tokens)
                if first_end >= 0 and not final and extra >= self.cfg.lookahead:
                    break
                if deadline is not None and not final and time.perf_counter() >= deadline:
                    break  # the partial candidate is kept: the next update verifies and extends it
        finally:
            events.close()
        stats = self.decoder.last_stats
        text = self.tok.decode(out)
        # cut off by a deadline before the first sentence ended: no first sentence (yet)
        cut_off = first_end < 0 and not final and not stats.finish_reason
        if first_end < 0 and not cut_off:  # the answer ended (or hit max_tokens) without a sentence end
            first_end = len(text.rstrip()) if text.strip() else -1
            first_at = time.perf_counter()
            first_fw = judge_forwards + stats.prefill_forwards + stats.target_forwards
        return {
            "t0": t0,
            "ids": out,
            "text": text,
            "first": text[:first_end].strip() if first_end >= 0 else "",
            "first_at": first_at,
            "first_forwards": first_fw,
            "forwards": judge_forwards + stats.prefill_forwards + stats.target_forwards,
            "drafted": sum(stats.drafted_by_source.get(s, 0) for s in ("history", "forced")),
            "accepted": sum(stats.accepted_by_source.get(s, 0) for s in ("history", "forced")),
        }

    def _tokens_covering(self, ids: list[int], chars: int) -> int:
        """Fewest leading tokens of ``ids`` whose text covers ``chars`` characters."""
        for n in range(1, len(ids) + 1):
            if len(self.tok.decode(ids[:n])) >= chars:
                return n
        return len(ids)

    def _synthesize(self, sentence: str) -> Audio | None:
        if self.tts is None or not sentence:
            return None
        audio = self.tts.synthesize(sentence)
        per_char = audio.synth_s / max(1, len(sentence))
        old = self._synth_per_char
        self._synth_per_char = per_char if old is None else 0.7 * old + 0.3 * per_char
        return audio

    def _synth_estimate(self, sentence: str) -> float:
        """Expected seconds to synthesize ``sentence`` (0 until the first synthesis measured it)."""
        return (self._synth_per_char or 0.0) * len(sentence)

    # ---- the session protocol ------------------------------------------------------------
    #: ``update`` takes a ``deadline`` (``simulate_user`` passes the next word's arrival)
    supports_deadline = True

    def update(self, partial: str, deadline: float | None = None) -> CandidateUpdate:
        """A new partial prompt: re-verify and extend the candidate, pre-synthesize its first
        sentence if it changed.

        ``deadline`` (a ``time.perf_counter()`` value) is when newer input will be waiting: the
        speculation yields then, as a live session polling its input between target passes
        would, keeping what it generated so far; the first sentence is pre-synthesized only if
        the synthesis is expected to finish by then.
        """
        if self.finished:
            raise SessionClosedError("update() after finish(): this PredGen session is closed")
        partial = " ".join(partial.split())
        if self.cfg.baseline or not partial:
            self.partial = self.latest = partial
            u = CandidateUpdate(partial, "", "")
            self.updates.append(u)
            return u
        # A candidate cut off before its first sentence ended is first completed under the
        # prompt it was made for: re-verifying it against every new word would cost as much as
        # the time between words on a CPU, and it would never grow. New words wait for the
        # next update (and are always checked by the final verification).
        resume = self._cut_off and bool(self.candidate) and bool(self.partial)
        # may raise (e.g. too long): the session stays as it was
        r = self._run(self.partial if resume else partial, final=False, deadline=deadline, resume=resume)
        self._cut_off = not r["first"]
        self.latest = partial
        if not resume:
            self.partial = partial
        self.candidate = r["ids"]
        u = CandidateUpdate(partial, r["text"], r["first"], r["drafted"], r["accepted"], r["forwards"], 0.0)
        fits = deadline is None or time.perf_counter() + self._synth_estimate(r["first"]) <= deadline
        # a sentence the verifier kept against newer input is likely the final one: worth
        # delaying the next update for (the new words wait, as during any long update)
        stable = self.cfg.presynth_stable and bool(r["first"]) and r["first"] == self._last_first
        self._last_first = r["first"]
        wanted = fits or stable or self.cfg.presynth_eager
        if r["first"] and wanted and (self.presynth is None or self.presynth[0] != r["first"]):
            audio = self._synthesize(r["first"])
            if audio is not None:
                self.presynth = (r["first"], audio)
                u.resynthesized, u.tts_s = True, audio.synth_s
        u.seconds = time.perf_counter() - r["t0"]
        self.updates.append(u)
        return u

    def finish(self, final: str | None = None) -> PredGenResponse:
        """The complete prompt: final verification, first sentence audio, then the rest."""
        if self.finished:
            raise SessionClosedError("finish() called twice: this PredGen session is closed")
        prompt = " ".join((self.latest if final is None else final).split())
        if not prompt:
            raise ConfigError("empty prompt: nothing to answer")
        self.finished = True
        r = self._run(prompt, final=True)
        first = r["first"]
        ttfs = r["first_at"] - r["t0"]
        presynth_used = self.presynth is not None and self.presynth[0] == first
        if presynth_used:
            first_audio: Audio | None = self.presynth[1]  # type: ignore[index]
            latency = ttfs
        else:
            # synthesized after the text was complete: its time adds to the latency
            first_audio = self._synthesize(first)
            latency = ttfs + (first_audio.synth_s if first_audio is not None else 0.0)
        audio = [first_audio] if first_audio is not None else []
        if self.cfg.speak_rest and self.tts is not None:
            audio += [self.tts.synthesize(s) for s in split_sentences(r["text"])[1:]]
        self.candidate = r["ids"]
        return PredGenResponse(
            response=r["text"].strip(),
            first_sentence=first,
            token_ids=r["ids"],
            ttfs_s=ttfs,
            nfetfs=r["first_forwards"],
            audio_latency_s=latency,
            presynth_used=presynth_used,
            first_audio=first_audio,
            audio=audio,
            total_s=time.perf_counter() - r["t0"],
            forwards=r["forwards"],
        )

    def close(self) -> None:
        self.decoder.close()
        if self._judge_state is not None:
            self.backend.release(self._judge_state)
