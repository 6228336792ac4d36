"""vLLM as speclive's engine: the sessions (SSBD, PredGen) run on ``vllm serve`` replicas.

vLLM serves the model (tensor/pipeline parallel, prefix caching, continuous batching, its own
n-gram/suffix/EAGLE drafting); speclive adds the speculation vLLM does not have, drafting from
the *previous output* of a streaming session. Everything goes through vLLM's OpenAI API
(``/v1/completions`` with token ids as the prompt):

- **Verification** of a candidate (SSBD's previous translation, PredGen's old answer) is ONE
  request: prompt = context + candidate, ``max_tokens=1``, ``prompt_logprobs=k``,
  ``temperature=0``. vLLM returns, per candidate position, the top-k log-probs plus the
  candidate token's own log-prob; ``logprob_matrix`` turns them into the logits matrix
  ``speclive.acceptance`` takes, and the session's own rule (greedy, top-k, biased β) decides
  the accepted prefix and the bonus token. No second copy of the rules lives here.
- **Continuation** after the accepted prefix + bonus token is a normal greedy completion
  (streamed) from context + accepted tokens: vLLM's prefix cache holds that prefix.

vLLM's rules this relies on (vLLM 0.32, v1 engine; ``SamplingParams``): a request that asks
for ``prompt_logprobs`` *skips reading* the prefix cache (``skip_reading_prefix_cache``), so
every prompt position is computed and returned -- a verification recomputes its whole prompt
-- while its blocks are still written to the cache for the continuation that follows.
``prompt_logprobs`` are the raw model log-probs (before sampling parameters), position 0 is
``null``, position i is a dict ``{token_id: {logprob, rank, decoded_token}}`` holding the top-k
and the prompt token itself (``rank`` > k when it is not in the top-k). A server started with
a smaller ``--max-logprobs`` than k rejects the request (default 20).

Several replicas: every session is bound to one replica for its lifetime (its prefix cache is
there) and new sessions go to the replica with the fewest bound sessions. A replica that stops
answering fails its own sessions with ``EngineUnavailableError`` and takes no new sessions
until a health check (``/health``) passes again; the other replicas' sessions go on.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from speclive.acceptance import AcceptanceRule, GreedyRule, TopKRule
from speclive.decoder import (
    Commit,
    GenerationConfig,
    GenerationResult,
    GenerationStats,
    StepEvent,
    VerifyPass,
    checked_request,
    drain,
)
from speclive.drafting.base import Drafter
from speclive.drafting.tree import DraftTree
from speclive.errors import ConfigError, ContextOverflowError, EngineUnavailableError
from speclive.loader import tokenizer_for
from speclive.models.resolve import resolve
from speclive.tokenizer import Tokenizer

#: top-k log-probs asked per candidate position (vLLM's default ``--max-logprobs`` is 20)
DEFAULT_TOP_K = 20
#: a replica that failed is health-checked again after this many seconds
RETRY_DEAD_S = 30.0


# ------------------------------------------------------------------------------- the adapter
def logprob_matrix(
    rows: Sequence[Mapping[int, float]], k: int, vocab_size: int
) -> tuple[np.ndarray, list[int]]:
    """vLLM's top-k log-probs per position -> (logits over a compact vocabulary, its token ids).

    ``rows[i]`` maps token id -> log-prob for position i: the top-k tokens plus possibly one
    more (the prompt token when it ranks below k). Column j < len(ids) of the result is token
    ``ids[j]`` (sorted, so ties resolve to the lower id as an argmax over the full vocabulary
    does); the columns after them stand for tokens no row lists.

    Each row holds its listed log-probs exactly; its unlisted mass 1 - Σp is spread evenly over
    the columns it does not list, with enough filler columns that no spread value exceeds the
    row's k-th largest listed probability (every unlisted token is truly below it). So a
    softmax of a row gives the exact probabilities of the listed tokens, the argmax and the
    top-k order are those of the full distribution, and ``speclive.acceptance``'s rules
    (greedy, top-K for K <= k, biased β) decide on this matrix as on full logits.
    """
    ids = sorted({int(t) for r in rows for t in r})
    col = {t: j for j, t in enumerate(ids)}
    m = len(ids)
    need = 0
    floors: list[tuple[float, int]] = []  # (unlisted mass, unlisted listed-elsewhere columns)
    for r in rows:
        vals = sorted((float(v) for v in r.values()), reverse=True)
        mass = max(0.0, 1.0 - sum(math.exp(v) for v in vals))
        unlisted = m - len(r)
        floors.append((mass, unlisted))
        if mass > 0 and vals:
            p_k = math.exp(vals[min(k, len(vals)) - 1])
            need = max(need, math.ceil(mass / p_k) - unlisted)
    filler = max(0, min(need, vocab_size - m))
    out = np.empty((len(rows), m + filler), dtype=np.float64)
    for i, (r, (mass, unlisted)) in enumerate(zip(rows, floors, strict=True)):
        slots = unlisted + filler
        out[i, :] = math.log(mass / slots) if mass > 0 and slots else -1e30
        for t, v in r.items():
            out[i, col[int(t)]] = float(v)
    return out, ids


def parse_prompt_logprobs(entries: Sequence[Mapping[str, Any] | None]) -> list[dict[int, float]]:
    """vLLM's ``prompt_logprobs`` JSON (keys are token ids as strings) -> {id: log-prob} rows."""
    return [{int(t): float(v["logprob"]) for t, v in (e or {}).items()} for e in entries]


def parse_top_logprobs(top: Mapping[str, float]) -> dict[int, float]:
    """A generated token's ``top_logprobs`` with ``return_tokens_as_token_ids`` ("token_id:N")."""
    return {int(key.rsplit(":", 1)[1]): float(v) for key, v in top.items()}


# ------------------------------------------------------------------------------- replicas
class Replica:
    """One ``vllm serve`` endpoint: an HTTP client and the load bound to it."""

    def __init__(self, url: str, timeout_s: float = 300.0, api_key: str | None = None):
        self.url = url.rstrip("/")
        if self.url.endswith("/v1"):
            self.url = self.url[:-3]
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )
        self.sessions = 0  # sessions bound to this replica
        self.inflight = 0  # requests running now
        self.alive = True
        self.error = ""
        self.failed_at = 0.0
        self.model: str | None = None  # the served model id
        self.max_model_len: int | None = None

    def __repr__(self) -> str:
        return f"Replica({self.url}, sessions={self.sessions}, alive={self.alive})"

    def fail(self, err: Exception | str) -> EngineUnavailableError:
        """Mark the replica dead; the error its sessions raise."""
        self.alive, self.error, self.failed_at = False, str(err), time.monotonic()
        return EngineUnavailableError(
            f"vLLM replica {self.url} failed ({err}); the sessions on it are closed, new sessions "
            "go to the other replicas"
        )

    def describe(self) -> None:
        """Read the served model and its context length (``/v1/models``)."""
        r = self.client.get("/v1/models", timeout=10.0)
        r.raise_for_status()
        data = r.json()["data"]
        if not data:
            raise EngineUnavailableError(f"vLLM replica {self.url} serves no model")
        self.model = str(data[0]["id"])
        self.max_model_len = int(data[0].get("max_model_len") or 0) or None

    def healthy(self) -> bool:
        try:
            return self.client.get("/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def close(self) -> None:
        self.client.close()


def _check(resp: httpx.Response, replica: Replica) -> None:
    if resp.status_code >= 400:
        resp.read()
        try:
            msg = resp.json().get("error", {}).get("message") or resp.text
        except (ValueError, AttributeError):
            msg = resp.text
        if resp.status_code in (502, 503, 504):  # the server (or its proxy) is gone or overloaded
            raise replica.fail(f"HTTP {resp.status_code}: {msg}")
        raise EngineUnavailableError(f"vLLM replica {replica.url} answered HTTP {resp.status_code}: {msg}")


# ------------------------------------------------------------------------------- the engine
class VLLMEngine:
    """``vllm serve`` replicas behind speclive's sessions (module docstring).

    Sessions take it where they take a ``Backend``: they build their decode loop with
    ``speclive.decoder.make_decoder``, which asks the engine for a ``VLLMDecoder``.
    """

    kind = "vllm"
    #: not a ``Backend``: sessions run on it through its own ``make_decoder`` loop
    in_process = False

    def __init__(
        self,
        urls: Sequence[str],
        tokenizer: Tokenizer,
        name: str | None = None,
        top_k: int = DEFAULT_TOP_K,
        timeout_s: float = 300.0,
        api_key: str | None = None,
        check: bool = True,
    ):
        urls = [u.strip() for u in urls if u.strip()]
        if not urls:
            raise ConfigError("--engine vllm needs at least one --vllm-url (e.g. http://127.0.0.1:8000)")
        if top_k < 2:
            raise ConfigError(f"the vLLM engine needs top_k >= 2 log-probs per position, got {top_k}")
        self.replicas = [Replica(u, timeout_s, api_key) for u in urls]
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.top_k = top_k
        self._lock = threading.Lock()
        if check:
            for rep in self.replicas:
                try:
                    rep.describe()
                except (httpx.HTTPError, KeyError, ValueError) as e:
                    raise EngineUnavailableError(f"cannot reach vLLM at {rep.url}: {e}") from None
            models = {rep.model for rep in self.replicas}
            if len(models) > 1:
                raise ConfigError(f"the vLLM replicas serve different models: {sorted(models)}")
        self.name = name or self.replicas[0].model or "vllm"
        self.n_ctx = min((r.max_model_len for r in self.replicas if r.max_model_len), default=4096)

    # ---- routing ---------------------------------------------------------------------
    def acquire(self) -> Replica:
        """Bind a new session to the least loaded live replica."""
        with self._lock:
            now = time.monotonic()
            for rep in self.replicas:  # a failed replica gets a health check now and then
                if not rep.alive and now - rep.failed_at >= RETRY_DEAD_S:
                    rep.failed_at = now
                    if rep.healthy():
                        rep.alive, rep.error = True, ""
            live = [r for r in self.replicas if r.alive]
            if not live:
                errs = "; ".join(f"{r.url}: {r.error}" for r in self.replicas)
                raise EngineUnavailableError(f"no vLLM replica is available ({errs})")
            rep = min(live, key=lambda r: (r.sessions, r.inflight))
            rep.sessions += 1
            return rep

    def release(self, replica: Replica) -> None:
        with self._lock:
            replica.sessions = max(0, replica.sessions - 1)

    def make_decoder(
        self, drafter: Drafter | None = None, rule: AcceptanceRule | None = None, knowledge: Any = None
    ) -> VLLMDecoder:
        return VLLMDecoder(self, drafter, rule)

    def close(self) -> None:
        for rep in self.replicas:
            rep.close()

    # ---- requests --------------------------------------------------------------------
    def _body(self, replica: Replica, prompt: Sequence[int], **kw: Any) -> dict[str, Any]:
        return {"model": replica.model or self.name, "prompt": [int(t) for t in prompt], **kw}

    def score(
        self, replica: Replica, context: Sequence[int], candidate: Sequence[int], eos: Sequence[int] = ()
    ) -> tuple[list[dict[int, float]], int]:
        """ONE request: the log-prob rows for verifying ``candidate`` after ``context``.

        Returns (rows, generated): ``rows[i]`` is the distribution after the i-th token of the
        verification tree (row 0 after ``context``, row i after ``candidate[i-1]``; the last
        row is the generated token's ``top_logprobs``), ``generated`` the greedy token vLLM
        produced after the whole candidate.
        """
        body = self._body(
            replica,
            [*context, *candidate],
            max_tokens=1,
            temperature=0.0,
            prompt_logprobs=self.top_k,
            logprobs=self.top_k,
            return_tokens_as_token_ids=True,
            return_token_ids=True,
            ignore_eos=True,
            skip_special_tokens=False,
        )
        data = self._post(replica, body)
        choice = data["choices"][0]
        rows = parse_prompt_logprobs(choice["prompt_logprobs"][len(context) :])
        generated = int(choice["token_ids"][0])
        last = parse_top_logprobs(choice["logprobs"]["top_logprobs"][0])
        last.setdefault(generated, float(choice["logprobs"]["token_logprobs"][0]))
        return [*rows, last], generated

    def _post(self, replica: Replica, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            replica.inflight += 1
        try:
            resp = replica.client.post("/v1/completions", json=body)
            _check(resp, replica)
            return resp.json()
        except httpx.HTTPError as e:
            raise replica.fail(e) from None
        finally:
            with self._lock:
                replica.inflight -= 1

    def stream(
        self,
        replica: Replica,
        prompt: Sequence[int],
        max_tokens: int,
        eos: Sequence[int],
        temperature: float = 0.0,
        seed: int | None = None,
        ignore_eos: bool = False,
    ) -> Iterator[list[int]]:
        """A normal completion, streamed: yields the new token ids chunk by chunk. Closing the
        iterator closes the connection, and vLLM aborts the request."""
        body = self._body(
            replica,
            prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            stream=True,
            return_token_ids=True,
            skip_special_tokens=False,
            ignore_eos=ignore_eos,
            stop_token_ids=[] if ignore_eos else sorted(eos),
        )
        if seed is not None and temperature > 0:
            body["seed"] = seed
        with self._lock:
            replica.inflight += 1
        try:
            with replica.client.stream("POST", "/v1/completions", json=body) as resp:
                _check(resp, replica)
                for line in resp.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        return
                    chunk = json.loads(payload)
                    if "error" in chunk:
                        raise EngineUnavailableError(f"vLLM replica {replica.url}: {chunk['error']}")
                    for choice in chunk.get("choices", []):
                        ids = [int(t) for t in choice.get("token_ids") or []]
                        if ids:
                            yield ids
        except httpx.HTTPError as e:
            raise replica.fail(e) from None
        finally:
            with self._lock:
                replica.inflight -= 1


# ------------------------------------------------------------------------------- the decoder


class VLLMDecoder:
    """The sessions' decode loop on vLLM; the ``speclive.decoder.Decoder`` interface.

    With a drafter that prepares its whole draft (``Drafter.prepared_draft``: the previous
    output of SSBD and PredGen, ``HistoryDrafter``) one ``generate`` is one verification
    request for that draft, the session's acceptance rule on the returned log-probs, then one
    streamed greedy completion from the accepted prefix and the bonus token. Without a drafter
    it is one streamed completion (plain vLLM decoding, the baselines). Its steps are accounted
    as the in-process loop's (``Commit.step``). The session is bound to one replica from
    construction to ``close``.
    """

    def __init__(
        self, engine: VLLMEngine, drafter: Drafter | None = None, rule: AcceptanceRule | None = None
    ):
        if drafter is not None and drafter.prepared_draft(0) is None:
            raise ConfigError(
                f"the vLLM engine drafts from a session's previous output only, not with "
                f"{type(drafter).__name__}; use vLLM's own speculative_config for n-gram, suffix "
                "or draft-model speculation"
            )
        for r in [rule, *getattr(rule, "rules", {}).values()]:
            if isinstance(r, TopKRule) and r.k > engine.top_k:
                raise ConfigError(
                    f"top-k acceptance with k={r.k} needs at least {r.k} log-probs per position; the "
                    f"vLLM engine asks for {engine.top_k} (raise --vllm-top-k and vllm's --max-logprobs)"
                )
        self.engine = engine
        self.target = engine  # what SpeculativeDecoder calls its target
        self.drafter = drafter
        self.rule = rule
        self.replica = engine.acquire()
        self._closed = False

    def close(self, release_state: bool = True) -> None:
        """Give the replica back (the remote engine keeps its own cache: no state here)."""
        if not self._closed:
            self._closed = True
            self.engine.release(self.replica)

    def _usable(self) -> Replica:
        if self._closed:
            raise EngineUnavailableError("this session's vLLM decoder is closed")
        if not self.replica.alive:
            raise EngineUnavailableError(
                f"vLLM replica {self.replica.url} failed ({self.replica.error}); this session is closed"
            )
        return self.replica

    def _check_len(self, prompt: list[int]) -> None:
        if len(prompt) >= self.engine.n_ctx:
            raise ContextOverflowError(
                f"prompt has {len(prompt)} tokens but the context window of {self.engine.name} "
                f"holds {self.engine.n_ctx} (and at least one must be generated)"
            )

    def prefill(self, prompt_ids: Sequence[int]) -> None:
        """Put ``prompt_ids`` into the replica's prefix cache now (one 1-token completion), so
        a later ``generate`` on this prompt, or one extending it, computes only the new tail."""
        prompt = [int(t) for t in prompt_ids]
        self._check_len(prompt)
        if len(prompt) > 1:
            rep = self._usable()
            self.engine._post(rep, self.engine._body(rep, prompt, max_tokens=1, temperature=0.0))

    def generate(
        self, prompt_ids: Sequence[int], config: GenerationConfig | None = None
    ) -> Generator[StepEvent, None, GenerationResult]:
        """Yield one ``StepEvent`` for the verification and one per streamed chunk after it
        (each carries the running ``stats``); the generator returns the ``GenerationResult``."""
        cfg, prompt = checked_request(prompt_ids, config)
        self._check_len(prompt)
        rep = self._usable()
        stats = GenerationStats(prompt_tokens=len(prompt))
        commit = Commit(self.engine.tokenizer, cfg, stats)
        t0 = time.perf_counter()
        tree = self._draft(prompt, cfg)
        if len(tree):
            yield self._verify(rep, prompt, tree, commit, time.perf_counter() - t0)
        if not stats.finish_reason:
            yield from self._complete(rep, prompt, cfg, commit)
        stats.new_tokens = len(commit.out)
        stats.total_s = time.perf_counter() - commit.t_start
        return GenerationResult(list(commit.out), commit.full, stats)

    def stepwise(
        self, prompt_ids: Sequence[int], config: GenerationConfig | None = None
    ) -> Generator[StepEvent | VerifyPass, np.ndarray | None, GenerationResult]:
        """``generate``: vLLM runs every pass itself, so no ``VerifyPass`` is handed out."""
        return (yield from self.generate(prompt_ids, config))

    def _verify(
        self, rep: Replica, prompt: list[int], tree: DraftTree, commit: Commit, draft_s: float
    ) -> StepEvent:
        """ONE request scores the draft chain ``tree``; the rule accepts; the step is committed."""
        eng = self.engine
        draft = tree.tokens
        t0 = time.perf_counter()
        rows, _ = eng.score(rep, prompt, draft)
        matrix, ids = logprob_matrix(rows, eng.top_k, eng.vocab_size)
        col = {t: j for j, t in enumerate(ids)}
        tokens = [0, *(col[t] for t in draft)]
        parents = list(range(-1, len(draft)))
        rule = self.rule or GreedyRule()
        sources = None if tree.sources is None else [None, *tree.sources]
        verdict = rule.accept(tokens, parents, matrix, sources=sources)
        if verdict.bonus >= len(ids):
            raise RuntimeError("acceptance picked an unlisted token: the log-prob rows are inconsistent")
        accepted = [i - 1 for i in verdict.path[1:]]
        new = [draft[i] for i in accepted] + [ids[verdict.bonus]]
        return commit.step(new, tree, accepted, draft_s, time.perf_counter() - t0)

    def _complete(
        self, rep: Replica, prompt: list[int], cfg: GenerationConfig, commit: Commit
    ) -> Generator[StepEvent, None, None]:
        """The rest as one streamed completion after the committed tokens, a step per chunk."""
        stats, out, tok = commit.stats, commit.out, self.engine.tokenizer
        chunks = self.engine.stream(
            rep,
            prompt + out,
            cfg.max_tokens - len(out),
            tok.eos_ids,
            temperature=cfg.temperature,
            seed=cfg.seed,
            ignore_eos=cfg.ignore_eos,
        )
        try:
            t0 = time.perf_counter()
            for new in chunks:
                yield commit.step(new, DraftTree(), [], 0.0, time.perf_counter() - t0, forwards=len(new))
                if stats.finish_reason:
                    break
                t0 = time.perf_counter()
        finally:
            chunks.close()
        if not stats.finish_reason:  # the stream ended without our stop: vLLM's limits
            stats.finish_reason = "length" if len(out) >= cfg.max_tokens else "eos"

    def _draft(self, prompt: list[int], cfg: GenerationConfig) -> DraftTree:
        """The drafter's prepared draft (the previous output), what fits before ``max_tokens``."""
        if self.drafter is None:
            return DraftTree()
        budget = max(0, min(cfg.max_draft_nodes, cfg.max_tokens - 1, self.engine.n_ctx - len(prompt) - 1))
        return self.drafter.prepared_draft(budget) or DraftTree()

    def run(self, prompt_ids: Sequence[int], config: GenerationConfig | None = None) -> GenerationResult:
        return drain(self.generate(prompt_ids, config))


def connect(
    urls: str | Sequence[str],
    model: str | None = None,
    top_k: int = DEFAULT_TOP_K,
    api_key: str | None = None,
) -> VLLMEngine:
    """A ``VLLMEngine`` on ``urls`` (a list, or one string, comma-separated).

    The tokenizer is the served model's own when its id is a folder on this machine, else
    ``model``'s (a speclive model name, HF folder or hub id). Token ids must agree with the
    server's: checked on a probe text with vLLM's ``/tokenize``.
    """
    if isinstance(urls, str):
        urls = urls.split(",")
    flat = [u.strip() for part in urls for u in str(part).split(",") if u.strip()]
    probe = VLLMEngine(flat, _NullTokenizer(), top_k=top_k, api_key=api_key)
    served = probe.replicas[0].model or ""
    if Path(served).is_dir():
        tok = Tokenizer.from_pretrained(served)
    elif model:
        tok = tokenizer_for(resolve(model))
    else:
        raise ConfigError(f"cannot load a tokenizer for the served model {served!r}: name it with --model")
    engine = VLLMEngine(flat, tok, top_k=top_k, api_key=api_key, check=False)
    for a, b in zip(engine.replicas, probe.replicas, strict=True):
        a.model, a.max_model_len = b.model, b.max_model_len
    engine.name = served
    engine.n_ctx = probe.n_ctx
    probe.close()
    _check_tokenizer(engine)
    return engine


def _check_tokenizer(engine: VLLMEngine) -> None:
    text = "Speculative decoding: 12 Übersetzungen, 翻訳."
    rep = engine.replicas[0]
    try:
        body = {"model": rep.model, "prompt": text, "add_special_tokens": False}
        r = rep.client.post("/tokenize", json=body)
    except httpx.HTTPError as e:
        raise EngineUnavailableError(f"cannot reach vLLM at {rep.url}: {e}") from None
    if r.status_code == 404:  # a server without /tokenize: nothing to compare against
        return
    r.raise_for_status()
    theirs = [int(t) for t in r.json().get("tokens", [])]
    ours = engine.tokenizer.encode(text)
    if theirs != ours:
        raise ConfigError(
            f"the tokenizer does not match the served model {rep.model!r} (token ids differ): "
            "name the served model with --model"
        )


class _NullTokenizer(Tokenizer):
    """Stands in while the served model is looked up (no tokenizer is needed for that)."""

    def __init__(self) -> None:
        self.hf = None
        self.vocab_size = 0
        self.eos_ids = set()
