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

Baselines (``mode``), plain autoregressive decoding of the same target, for honest comparison:

- ``cascade`` (``baseline=True``): wait for the full prompt, generate, then TTS;
- ``prefill``: the cascade, but every partial prompt is prefilled into the KV cache while the
  user speaks, so only the changed tail is computed at the end (no speculation);
- ``preemptive``: LiveKit-style preemptive generation: every new partial prompt restarts a plain
  generation of the first sentence (and its synthesis); the final prompt keeps it only when it
  is unchanged, else it is discarded and generated again (no verification, no partial reuse).

``respond()`` streams the answer to the final prompt (text deltas, then each sentence with its
audio as soon as it is complete), so a live pipeline can interleave it with listening and stop
it on barge-in; ``finish()`` runs it to the end.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from speclive.acceptance import ForcedRule, GreedyRule, SourceRule, TopKRule
from speclive.backends.base import Backend
from speclive.decoder import GenerationConfig, GenerationStats, make_decoder
from speclive.drafting.history import HistoryDrafter
from speclive.errors import ConfigError, SessionClosedError
from speclive.tts.base import TTS, Audio
from speclive.tts.sentences import first_sentence_end

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
#: ``predgen`` speculates; the others are the non-speculative baselines (module docstring)
MODES = ("predgen", "cascade", "prefill", "preemptive")


@dataclass
class PredGenConfig:
    #: greedy | topk:K | reflection
    verifier: str = "greedy"
    max_tokens: int = 256
    #: tokens generated past the end of the first sentence while speculating
    lookahead: int = 0
    system: str = SYSTEM_PROMPT
    #: predgen | cascade | prefill | preemptive (see the module docstring)
    mode: str = "predgen"
    #: shorthand for ``mode="cascade"``
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
    #: Off by default: the syntheses delay the updates more than they save (docs/sessions.md)
    presynth_eager: bool = False
    #: how the candidate's first sentence is verified: "sentence" = all of it in one pass (the
    #: paper), "chunks" = cost-curve-sized chunks, which stop at the first rejected chunk
    #: instead of paying for a whole long sentence rejected early (slower on the measured
    #: sets: the accepted sentences' extra passes cost more, docs/sessions.md)
    first_pass: str = "sentence"
    #: a line break ends a sentence too (shorter first sentences for a voice: a list's lead-in
    #: is spoken before its first item is generated)
    line_breaks: bool = False
    #: if > 0, the answer's first spoken unit may be a clause of at least this many words
    #: (ending at , ; or :) instead of a whole sentence: its audio is ready sooner
    first_clause_words: int = 0
    #: if > 0, the answer's first spoken unit ends after about this many words where no sentence
    #: or clause ends sooner (``tts.sentences.first_sentence_end``'s ``max_words``): the user
    #: hears the answer begin after a few tokens rather than a whole sentence
    first_words: int = 0
    #: the conversation's window: a prompt and its answer of ``max_tokens`` fit in this many
    #: tokens (at most the model's context; None: all of it). A server whose sessions share one
    #: KV cache gives each its share, so long conversations do not evict each other
    context_tokens: int | None = None


#: when a conversation outgrows its window, the oldest turns are left out until its history
#: fills at most this share of the window; that cut then stays while the conversation grows
#: back, so the prompt's prefix, and its KV cache, are reused turn after turn (llama-server's
#: context shift also discards half)
SHIFT_TO = 0.5
#: tokens kept free for the user's next message when the cut is chosen
USER_ROOM = 128


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
    #: the totals of the answer's generation
    stats: GenerationStats | None = field(default=None, repr=False)


@dataclass
class ReplyPart:
    """One piece of a streamed answer (``PredictiveResponder.respond``).

    ``kind``: ``"text"`` (``text`` is a delta of the answer), ``"sentence"`` (a complete
    sentence, its ``index`` and its ``audio`` when a TTS is attached; the first carries the
    latency figures of ``response``), ``"done"`` (``response`` holds the whole answer).
    """

    kind: str
    text: str = ""
    index: int = 0
    audio: Audio | None = field(default=None, repr=False)
    response: PredGenResponse | None = None


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


def _norm(text: str) -> str:
    return " ".join(text.split())


def _user_suffix_len(tok, system: str) -> int:
    """Tokens the chat template puts after the last user message's text (its end-of-message
    token first, then the assistant's header): the common tail of two prompts that differ only
    in that text. 0 when they share none (a template without such tokens)."""
    a = chat_prompt(tok, "yes", None, system)
    b = chat_prompt(tok, "no", None, system)
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def _token_probs(row: np.ndarray, tokens: list[int]) -> list[float]:
    """Softmax probabilities of ``tokens`` in a logits row (one normalisation)."""
    z = np.asarray(row, dtype=np.float64)
    m = float(z.max())
    total = float(np.exp(z - m).sum())
    return [float(np.exp(z[t] - m) / total) for t in tokens]


@dataclass
class _Reply:
    """The answer ``respond`` is streaming: what it generated and yielded so far."""

    #: ``time.perf_counter()`` when the final prompt arrived
    t0: float
    #: forward passes of the reflection judge before the generation
    judge_forwards: int
    #: the answer's token ids (a resumed candidate's first)
    out: list[int]
    text: str = ""
    #: characters of the answer yielded as text / as sentences
    shown: int = 0
    spoken: int = 0
    n_sentences: int = 0
    #: the first sentence (None: not complete yet), its time, forwards and audio
    first: str | None = None
    ttfs: float = 0.0
    latency: float = 0.0
    nfetfs: int = 0
    presynth_used: bool = False
    first_audio: Audio | None = None
    audio: list[Audio] = field(default_factory=list)
    #: generation events seen, and the generation's totals so far
    n_steps: int = 0
    stats: GenerationStats = field(default_factory=GenerationStats)


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
        if cfg.baseline:
            cfg.mode = "cascade"
        if cfg.mode not in MODES:
            raise ConfigError(f"invalid mode {cfg.mode!r}; allowed values: {', '.join(MODES)}")
        if cfg.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {cfg.max_tokens}")
        if cfg.context_tokens is not None and cfg.context_tokens <= cfg.max_tokens + USER_ROOM:
            raise ConfigError(
                f"context_tokens ({cfg.context_tokens}) must leave room for a message of "
                f"{USER_ROOM} tokens and an answer of max_tokens ({cfg.max_tokens})"
            )
        if cfg.first_pass not in FIRST_PASS:
            allowed = ", ".join(FIRST_PASS)
            raise ConfigError(f"invalid first_pass {cfg.first_pass!r}; allowed values: {allowed}")
        self.cfg = cfg
        self.mode = cfg.mode
        self.speculative = cfg.mode == "predgen"
        self.kind, rule = _parse_verifier(cfg.verifier)
        self.one_pass_first = cfg.first_pass == "sentence"
        if self.kind == "reflection" and self.speculative and not model.in_process:
            raise ConfigError(
                f"the reflection verifier reads the yes/no logits of an in-process backend; on the "
                f"{model.kind} engine use greedy or topk:K"
            )
        self.backend = model
        self.tok = model.tokenizer
        self.tts = tts
        self.drafter = HistoryDrafter(recycle=True) if self.speculative else None
        self.decoder = make_decoder(model, self.drafter, rule if self.speculative else None)
        self._judge_state = model.new_state() if self.kind == "reflection" and self.speculative else None
        self._yes, self._no = self._answer_ids("yes"), self._answer_ids("no")
        self._synth_per_char: float | None = None
        self._user_suffix = _user_suffix_len(self.tok, cfg.system)
        #: (user text, prompt position, end token, the text's last token) of the end-of-turn
        #: probe a run is reading
        self._probing: tuple[str, int, int, int] | None = None
        #: the oldest turns the prompts leave out (``_place_cut``)
        self.left_out = 0
        self.restart(history)

    def restart(self, history: list[dict[str, str]] | None = None) -> None:
        """A new turn of the conversation (``history``: the turns before it): what the last
        turn speculated goes; the KV cache stays, so the next prompt's shared prefix (system
        prompt and earlier turns) is not evaluated again."""
        self.history = list(history or [])
        self._place_cut()
        self.candidate: list[int] = []
        self.presynth: tuple[str, Audio] | None = None
        self.updates: list[CandidateUpdate] = []
        self.partial = ""  # the prompt the candidate answers
        self.latest = ""  # the newest partial prompt seen
        self._cut_off = False  # the last speculation stopped before its first sentence ended
        self._last_first = ""  # the first sentence the previous update produced
        self.finished = False
        #: P(the user's message ends here) per user text, read where a run had the row anyway
        self.end_probs: dict[str, float] = {}
        #: the same with the text's final punctuation mark weighed by the model (``_marked``)
        self.end_probs_marked: dict[str, float] = {}

    # ---- prompts -------------------------------------------------------------------------
    def _window(self) -> int:
        """Tokens a prompt may take: the conversation's window less the answer's room."""
        n = self.backend.n_ctx
        if self.cfg.context_tokens is not None:
            n = min(n, self.cfg.context_tokens)
        return n - self.cfg.max_tokens

    def _place_cut(self) -> None:
        """How many of the oldest turns (a user message and its answer) the prompts leave out,
        chosen when a turn starts: kept while the history and ``USER_ROOM`` fit the window,
        moved when they do not, until the history fills at most ``SHIFT_TO`` of it. Turn after
        turn the prompt then begins the same way, and the cache holding it is extended, not
        evaluated again; leaving out the fewest turns each time would change the prompt's start,
        and so re-evaluate the whole window, at every turn of a long conversation."""
        left_out = self.left_out
        if 2 * left_out > len(self.history):
            left_out = 0  # a new, shorter conversation
        room = self._window() - USER_ROOM
        if len(chat_prompt(self.tok, "", self.history[2 * left_out :], self.cfg.system)) > room:
            left_out, _ = self._fewest_left_out("", left_out, int(room * SHIFT_TO))
        self.left_out = left_out

    def _fewest_left_out(self, partial: str, start: int, limit: int) -> tuple[int, list[int]]:
        """The fewest oldest turns (at least ``start``) to leave out so that the prompt for
        ``partial`` takes at most ``limit`` tokens, and that prompt; every turn when even that
        does not fit. Found by bisection: the prompt only gets shorter as more are left out, and
        a conversation of hundreds of turns would otherwise tokenize its history once per turn."""
        history, system = self.history, self.cfg.system
        fits = (len(history) + 1) // 2  # every turn left out
        best = chat_prompt(self.tok, partial, history[2 * fits :], system)
        if len(best) > limit or fits <= start:
            return fits, best
        fails = start - 1  # ``start`` itself may fit
        while fits - fails > 1:
            mid = (fits + fails) // 2
            ids = chat_prompt(self.tok, partial, history[2 * mid :], system)
            if len(ids) <= limit:
                fits, best = mid, ids
            else:
                fails = mid
        return fits, best

    def prompt_ids(self, partial: str) -> list[int]:
        """The chat prompt; the system prompt is there for the final prompt too (and for the
        baselines), so greedy PredGen and the cascade answer the very same prompt. The history
        starts after the turns ``_place_cut`` leaves out; a user message too long for the room
        left makes this prompt leave out more, until it and an answer of ``max_tokens`` fit
        the window (a long conversation goes on instead of overflowing)."""
        history, system = self.history, self.cfg.system
        budget = self._window()
        ids = chat_prompt(self.tok, partial, history[2 * self.left_out :], system)
        if len(ids) <= budget or 2 * self.left_out >= len(history):
            return ids
        return self._fewest_left_out(partial, self.left_out + 1, budget)[1]

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

    # ---- the engine run shared by update and respond -------------------------------------
    def _start(self, partial: str, resume: bool):
        """Set up one decoder run for ``partial``: the draft (the old candidate, verified) for
        PredGen, nothing for the baselines. ``resume`` continues the candidate under the prompt
        it was made for (its cache is still there) instead of re-verifying it.

        Returns (the decoder's event iterator, the resumed prefix, judge forwards).
        """
        prompt = self.prompt_ids(partial)
        prefix = list(self.candidate) if resume else []
        judge_forwards = 0
        # the end-of-turn probe rides along in the run's first pass; a resumed run's prompt had it
        self._probing = None if resume else self._probe_at(partial, prompt)
        if self.drafter is not None and resume:
            self.drafter.set_history([])
        elif self.drafter is not None:
            forced = first = 0
            old_text = self.tok.decode(self.candidate)
            end = self._first_end(old_text)
            if end > 0:
                first = self._tokens_covering(self.candidate, end)
                if self.kind == "reflection":
                    judge_forwards = 1
                    if self._judge(partial, old_text[:end]):
                        forced = first
            one_pass = first if self.one_pass_first else 0
            self.drafter.set_history(self.candidate, forced=forced, first_chunk=one_pass)
        gen = GenerationConfig(max_tokens=max(1, self.cfg.max_tokens - len(prefix)), max_draft_nodes=512)
        return self.decoder.generate(prompt + prefix, gen, **self._probe_kw()), prefix, judge_forwards

    # ---- end of turn ---------------------------------------------------------------------
    def _probe_at(self, partial: str, prompt: list[int]) -> tuple[str, int, int, int] | None:
        """Where the prompt's user text ends (the position of the chat template's
        end-of-user-message token), when its probability is wanted and can be read."""
        k = len(prompt) - self._user_suffix
        if not self.backend.in_process or self._user_suffix < 1 or not 1 < k < len(prompt) - 1:
            return None
        if _norm(partial) in self.end_probs:
            return None
        return _norm(partial), k, prompt[k], prompt[k - 1]

    def _probe_kw(self) -> dict[str, int]:
        """The decoder's ``probe`` argument for the probe being read (none without one: a
        remote engine's decoder takes no such argument, and is never asked to probe)."""
        return {} if self._probing is None else {"probe": self._probing[1]}

    def _take_probe(self) -> None:
        """Store the probability the last run's probe read (once its first pass ran)."""
        row = getattr(self.decoder, "probe_row", None)
        if self._probing is None or row is None:
            return
        text, _, token, last = self._probing
        (p_end,) = _token_probs(row, [token])
        self.end_probs[text] = p_end
        prev = getattr(self.decoder, "probe_prev", None)
        if prev is not None:
            self.end_probs_marked[text] = self._marked(prev, p_end, token, last)
        self._probing = None
        self.decoder.probe_row = self.decoder.probe_prev = None

    def _marked(self, prev: np.ndarray, p_end: float, end: int, last: int) -> float:
        """P(end) with the transcript's final punctuation mark (Whisper's guess, token
        ``last``) weighed by the model's own: P(end right after the words) + P(the model puts
        that mark there) x P(end after it, ``p_end``). A fragment Whisper closed with "?" then
        scores as the fragment it is. A text without a final mark: ``p_end``."""
        if self.tok.decode([last]).strip() not in (".", "?", "!"):
            return p_end
        p_end_before, p_mark = _token_probs(prev, [end, last])
        return p_end_before + p_mark * p_end

    def end_of_turn_prob(self, text: str) -> float | None:
        """P(the user's message ends after ``text``): the answering model's probability of its
        chat template's end-of-user-message token right after the text, with the system prompt
        and history it answers with. Read for free in the passes a speculation runs on the
        text (``end_probs``); otherwise the prompt is prefilled now (the work a later answer
        to it reuses). None where the backend cannot give the row (a remote engine) or the
        template has no such token."""
        text = _norm(text)
        if text in self.end_probs or not text:
            return self.end_probs.get(text)
        prompt = self.prompt_ids(text)
        probing = self._probe_at(text, prompt)
        if probing is None:
            return None
        self._probing = probing
        self.decoder.prefill(prompt, **self._probe_kw())
        self._take_probe()
        return self.end_probs.get(text)

    @staticmethod
    def _forwards(judge_forwards: int, st: GenerationStats) -> int:
        return judge_forwards + st.prefill_forwards + st.target_forwards

    def _run(self, partial: str, deadline: float | None = None, resume: bool = False) -> dict:
        """Speculate on ``partial``: stop after the first sentence (+ lookahead), or at
        ``deadline`` (a ``time.perf_counter()`` value: newer input has arrived, so this
        speculation is stale). Returns what happened."""
        t0 = time.perf_counter()
        events, prefix, judge_forwards = self._start(partial, resume=resume)
        out: list[int] = list(prefix)
        first_end, extra = -1, 0
        stats = GenerationStats()
        try:
            for ev in events:
                self._take_probe()
                stats = ev.stats  # the generation's totals (final once it is over or closed)
                out.extend(ev.tokens)
                if first_end < 0:
                    text = self.tok.decode(out)
                    first_end = self._first_end(text, complete=bool(stats.finish_reason))
                else:
                    extra += len(ev.tokens)
                if first_end >= 0 and extra >= self.cfg.lookahead:
                    break
                if deadline is not None and time.perf_counter() >= deadline:
                    break  # the partial candidate is kept: the next update verifies and extends it
        finally:
            events.close()
        self._take_probe()
        text = self.tok.decode(out)
        # cut off by a deadline before the first sentence ended: no first sentence (yet)
        cut_off = first_end < 0 and not stats.finish_reason
        if first_end < 0 and not cut_off:  # the answer ended (or hit max_tokens) without a sentence end
            first_end = len(text.rstrip()) if text.strip() else -1
        return {
            "t0": t0,
            "ids": out,
            "text": text,
            "first": text[:first_end].strip() if first_end >= 0 else "",
            "forwards": self._forwards(judge_forwards, stats),
            "drafted": sum(stats.drafted_by_source.get(s, 0) for s in ("history", "forced")),
            "accepted": sum(stats.accepted_by_source.get(s, 0) for s in ("history", "forced")),
        }

    def _first_end(self, text: str, complete: bool = False) -> int:
        """Where the answer's first spoken unit ends in ``text`` (-1: not yet)."""
        cfg = self.cfg
        return first_sentence_end(
            text, complete, cfg.line_breaks, clause_words=cfg.first_clause_words, max_words=cfg.first_words
        )

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
    #: ``update`` takes a ``deadline`` (``simulate_user`` passes the next word's arrival;
    #: ``sessions.simulate.StreamingSession``)
    supports_deadline = True

    def update(
        self,
        partial: str,
        deadline: float | None = None,
        synth_deadline: float | None = None,
        settled: bool = False,
    ) -> CandidateUpdate:
        """A new partial prompt: re-verify and extend the candidate, pre-synthesize its first
        sentence if it changed.

        ``deadline`` (a ``time.perf_counter()`` value) is when newer input will be waiting: the
        speculation yields then, as a live session polling its input between target passes
        would, keeping what it generated so far; the first sentence is pre-synthesized only if
        the synthesis is expected to finish by then (or by ``synth_deadline`` when given: a
        live pipeline yields often to listen, but has time for a synthesis until its next
        transcription pass). ``settled``: this text is probably the final prompt (the user
        paused): the candidate is verified against it at once, even one cut off earlier.

        The baselines: ``cascade`` does nothing, ``prefill`` only prefills the partial prompt,
        ``preemptive`` restarts a plain generation whenever the partial prompt changed.
        """
        if self.finished:
            raise SessionClosedError("update() after finish(): this PredGen session is closed")
        partial = _norm(partial)
        t0 = time.perf_counter()
        if self.mode in ("cascade", "prefill") or not partial:
            if self.mode == "prefill" and partial:
                prompt = self.prompt_ids(partial)
                self._probing = self._probe_at(partial, prompt)
                self.decoder.prefill(prompt, **self._probe_kw())
                self._take_probe()
            self.partial = self.latest = partial
            u = CandidateUpdate(partial, "", "", seconds=time.perf_counter() - t0)
            self.updates.append(u)
            return u
        if self.mode == "preemptive":
            if partial == self.partial and not self._cut_off:
                self.latest = partial  # the generation for this prompt is already complete
                u = CandidateUpdate(partial, self.tok.decode(self.candidate), self._last_first)
                self.updates.append(u)
                return u
            # a changed prompt discards the candidate (no verification, no reuse)
            resume = partial == self.partial and bool(self.candidate)
            if not resume:
                self.candidate, self.presynth = [], None
        else:
            # A candidate cut off before its first sentence ended is first completed under the
            # prompt it was made for: re-verifying it against every new word would cost as much
            # as the time between words on a CPU, and it would never grow. New words wait for
            # the next update (and are always checked by the final verification).
            # A settled text is verified at once, unless the cut-off candidate was made for it.
            resume = (
                self._cut_off
                and bool(self.candidate)
                and bool(self.partial)
                and (not settled or partial == self.partial)
            )
        # may raise (e.g. too long): the session stays as it was
        r = self._run(self.partial if resume else partial, deadline=deadline, resume=resume)
        self._cut_off = not r["first"]
        self.latest = partial
        if not resume:
            self.partial = partial
        self.candidate = r["ids"]
        u = CandidateUpdate(partial, r["text"], r["first"], r["drafted"], r["accepted"], r["forwards"], 0.0)
        synth_by = synth_deadline if synth_deadline is not None else deadline
        fits = synth_by is None or time.perf_counter() + self._synth_estimate(r["first"]) <= synth_by
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

    def respond(self, final: str | None = None) -> Iterator[ReplyPart]:
        """The complete prompt: final verification, then the answer as it is generated.

        Yields text deltas and each complete sentence with its audio (the first one's audio is
        the pre-synthesized one when the sentence survived), then ``"done"`` with the
        ``PredGenResponse``. Closing the iterator early (barge-in) stops the generation.
        """
        prompt, resume = self._final_prompt(final)
        t0 = time.perf_counter()
        events, prefix, judge_forwards = self._start(prompt, resume=resume)
        reply = _Reply(t0=t0, judge_forwards=judge_forwards, out=list(prefix))
        try:
            if prefix:  # a resumed candidate may hold whole sentences: they need no decoding
                reply.text = self.tok.decode(reply.out)
                yield from self._reply_parts(reply, complete=False)
            for ev in events:
                self._take_probe()
                reply.n_steps += 1
                reply.stats = ev.stats
                reply.out.extend(ev.tokens)
                reply.text = self.tok.decode(reply.out)
                yield from self._reply_parts(reply, complete=bool(reply.stats.finish_reason))
        finally:
            events.close()
        yield ReplyPart("done", response=self._reply_response(reply))

    def _final_prompt(self, final: str | None) -> tuple[str, bool]:
        """The final prompt (normalised) and whether the candidate is continued rather than
        verified again; closes the session to a second answer."""
        if self.finished:
            raise SessionClosedError("finish() called twice: this PredGen session is closed")
        prompt = _norm(self.latest if final is None else final)
        if not prompt:
            raise ConfigError("empty prompt: nothing to answer")
        self.finished = True
        # A candidate made for this very prompt (an update on the same text, e.g. at a pause)
        # is already what the verifier keeps: continue it instead of verifying it again.
        # Preemptive keeps its generation only then, and discards it otherwise.
        resume = (
            self.mode in ("predgen", "preemptive")
            and prompt == self.partial
            and 0 < len(self.candidate) < self.cfg.max_tokens
        )
        if self.mode == "preemptive" and not resume:
            self.presynth = None
        return prompt, resume

    def _reply_parts(self, reply: _Reply, complete: bool) -> Iterator[ReplyPart]:
        """What the answer so far adds: a text delta, then each newly complete sentence."""
        text = reply.text
        visible = text if complete else text.rstrip("\ufffd")
        if len(visible) > reply.shown:
            yield ReplyPart("text", visible[reply.shown :])
            reply.shown = len(visible)
        while True:
            rest = text[reply.spoken :]
            end = (
                self._first_end(rest, complete)
                if reply.first is None
                else first_sentence_end(rest, complete=complete, line_breaks=self.cfg.line_breaks)
            )
            if end < 0:
                return
            sentence = text[reply.spoken : reply.spoken + end].strip()
            reply.spoken += end
            if not sentence:
                continue
            if reply.first is None:
                part_audio = self._first_sentence(reply, sentence)
            else:
                part_audio = self._synthesize(sentence) if self.cfg.speak_rest else None
            if part_audio is not None:
                reply.audio.append(part_audio)
            yield ReplyPart("sentence", sentence, index=reply.n_sentences, audio=part_audio)
            reply.n_sentences += 1

    def _first_sentence(self, reply: _Reply, sentence: str) -> Audio | None:
        """Record the answer's first sentence (its time and forwards) and return its audio:
        the pre-synthesized one when the sentence survived, else synthesized now."""
        reply.first = sentence
        reply.ttfs = time.perf_counter() - reply.t0
        reply.nfetfs = self._forwards(reply.judge_forwards, reply.stats) if reply.n_steps else 0
        reply.presynth_used = self.presynth is not None and self.presynth[0] == sentence
        if reply.presynth_used:
            reply.first_audio = self.presynth[1]  # type: ignore[index]
            reply.latency = reply.ttfs
        else:  # synthesized after the text was complete: its time adds up
            reply.first_audio = self._synthesize(sentence)
            synth_s = reply.first_audio.synth_s if reply.first_audio is not None else 0.0
            reply.latency = reply.ttfs + synth_s
        return reply.first_audio

    def _reply_response(self, reply: _Reply) -> PredGenResponse:
        """The finished answer's ``PredGenResponse``; the answer becomes the candidate."""
        if reply.first is None:  # an empty answer
            reply.first, reply.ttfs = "", time.perf_counter() - reply.t0
            reply.latency, reply.nfetfs = reply.ttfs, self._forwards(reply.judge_forwards, reply.stats)
        self.candidate = reply.out
        return PredGenResponse(
            response=reply.text.strip(),
            first_sentence=reply.first,
            token_ids=reply.out,
            ttfs_s=reply.ttfs,
            nfetfs=reply.nfetfs,
            audio_latency_s=reply.latency,
            presynth_used=reply.presynth_used,
            first_audio=reply.first_audio,
            audio=reply.audio,
            total_s=time.perf_counter() - reply.t0,
            forwards=self._forwards(reply.judge_forwards, reply.stats),
            stats=reply.stats,
        )

    @property
    def incomplete(self) -> bool:
        """The last speculation stopped (at its deadline) before its first sentence ended."""
        return self._cut_off

    def finish(self, final: str | None = None) -> PredGenResponse:
        """The complete prompt: final verification, first sentence audio, then the rest."""
        response = None
        for part in self.respond(final):
            if part.kind == "done":
                response = part.response
        assert response is not None
        return response

    def close(self) -> None:
        self.decoder.close()
        if self._judge_state is not None:
            self.backend.release(self._judge_state)
