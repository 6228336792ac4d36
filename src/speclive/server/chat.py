"""The chat model behind ``/v1/chat/completions``: one decoder (``make_decoder``) per request.

With ``--engine vllm`` the model is a ``VLLMEngine``: each request becomes one streamed
``/v1/completions`` request to a vLLM replica (the chat template applied here, with the
served model's tokenizer), and vLLM's own speculative decoding does the drafting.

``ChatEngine.generate`` is the iterator a ``ModelWorker`` advances one decoder step per turn.
It drives the decoder's ``stepwise`` generator: each verification pass it hands out becomes a
``Batched`` request, and the worker runs the passes of all the completions in progress as one
``extend_many`` (llama.cpp: one decode over their sequences); a remote engine hands out none.
A prompt is prefilled the same way, ``PREFILL_CHUNK`` tokens per round (``prefill_rounds``): a
long prompt's chunks carry the other completions' passes in their decode instead of stopping
them for the whole prefill, as a continuous-batching server mixes prompt and decode tokens.
The last chunk (at most ``PREFILL_CHUNK`` tokens) is not a round of its own: it rides in front
of the first draft in the first verification pass, so a prompt of one chunk or less gives its
first token after ONE target pass, as a server that samples from the prefill's last row does.
A request's drafter prices a draft at what it adds to the pass it shares with the others
(``speclive.server.shared_pass_cost``): beside seven one-token passes or a prompt chunk, a
draft costs a fraction of a pass of its own, so it pays at acceptances where alone it would not.
Each request gets its own decoder, hence its own KV state and drafter, over the shared backend;
the state is released in the iterator's ``finally`` when the generation ends, fails or is
cancelled, so sessions never see each other's cache. Speculation is on by default (the
configured drafter); greedy decoding is lossless, so the answer is the target's own greedy one.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from speclive.backends.base import Backend, BackendState, common_prefix_len
from speclive.decoder import GenerationConfig, GenerationStats, VerifyPass, make_decoder
from speclive.drafting.base import Drafter
from speclive.engines.vllm import connect
from speclive.knowledge import KnowledgeStore, disabled_by_env
from speclive.loader import load_backend, make_drafter
from speclive.server.config import ServerConfig
from speclive.server.prompt_cache import PromptCache
from speclive.server.shared_pass_cost import RoundLoad, SharedPassCost
from speclive.server.worker import Batched

#: prompt tokens a request prefills per worker round, in the same llama.cpp decode as the
#: other requests' verification passes (half of ``n_batch``: room is left for theirs)
PREFILL_CHUNK = 256

#: prompt tokens that all prefilling requests together put into one round while other requests
#: are generating (a token budget per step, as vLLM's scheduler keeps one): every generating
#: request waits for the whole round, and on a 2-core CPU a round that carries a 256-token
#: chunk takes several times one of eight one-token passes. The prompts are prefilled over
#: more, shorter rounds instead; a request alone prefills ``PREFILL_CHUNK`` tokens per round
BUSY_PROMPT_BUDGET = 64

#: decoder finish reasons -> OpenAI's
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}


@dataclass
class ChatParams:
    #: None: as many as the cap and the context window allow
    max_tokens: int | None = None
    temperature: float = 0.0
    stop: tuple[str, ...] = ()
    seed: int = 0


@dataclass
class ChatDelta:
    """One decoder step: the new text (may be empty: held back or no token yet) and its cost."""

    text: str
    tokens: int
    drafted: int
    accepted: int


@dataclass
class ChatDone:
    stats: GenerationStats

    @property
    def finish_reason(self) -> str:
        return FINISH_REASONS.get(self.stats.finish_reason, "stop")

    def usage(self) -> dict:
        s = self.stats
        return {
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.new_tokens,
            "total_tokens": s.prompt_tokens + s.new_tokens,
            "speclive": {
                "target_forwards": s.target_forwards,
                "drafted": s.drafted,
                "accepted": s.accepted,
                "mean_accepted": round(s.mean_accepted, 4),
            },
        }


ChatEvent = ChatDelta | ChatDone


class ChatEngine:
    """A loaded LLM plus the drafter recipe of the server configuration."""

    def __init__(self, backend: Backend, config: ServerConfig):
        self.backend = backend
        self.config = config
        self.name = backend.name
        self.n_ctx = backend.n_ctx
        #: generations that can hold a KV state at once (llama.cpp: ``max_states``; more would
        #: evict each other's caches)
        self.max_parallel: int | None = backend.max_states if backend.in_process else None
        #: called with the number of passes of each batched verification (metrics)
        self.on_batch: Callable[[int], None] | None = None
        #: finished requests' caches for requests that continue them (where states evict)
        self.prompt_cache: PromptCache | None = None
        #: the last shared pass's tokens per request: drafts are priced at what they add to it
        self.round_load = RoundLoad()
        #: requests past their prefill and not yet ended (generating)
        self._generating = 0
        #: prompt tokens claimed for the round being put together (``BUSY_PROMPT_BUDGET``)
        self._round_prompt = 0
        if backend.in_process:
            # realtime sessions hold KV states too: a state evicted to make room for another
            # session is prefilled again when its owner next needs it, instead of failing it
            backend.restore_evicted = True
            if config.prompt_cache and backend.max_states:
                self.prompt_cache = PromptCache(backend, backend.max_states)
                # parked states wait in host memory: their cells would slow every pass of
                # the requests in progress (docs/engine.md); put back as it was by close()
                self._offload_was = backend.offload_parked
                backend.offload_parked = True

    def close(self) -> None:
        """Release the parked states (after the worker stopped: the backend is not
        thread-safe), so a backend shared beyond this server is left as it was given."""
        if self.prompt_cache is not None:
            self.prompt_cache.clear()
            self.backend.offload_parked = self._offload_was

    def verify_together(self, passes: list[tuple[Any, list[int], list[int] | None, int]]) -> list[Any]:
        """The verification passes of the completions in progress, ``(state, tokens, parents,
        skip)`` (``skip``: the rows of a prompt tail in front of the first draft), and the
        prompt chunks, ``(state, tokens, None, len(tokens) - 1)`` (only the cache is wanted:
        the last row alone), as one ``extend_many``."""
        if self.on_batch is not None:
            self.on_batch(len(passes))
        self.round_load.record([(p[0], len(p[1])) for p in passes])
        self._round_prompt = 0  # the next round's chunks are claimed as its results come back
        return self.backend.extend_many([p[:3] for p in passes], [p[3] for p in passes])

    @staticmethod
    def _sit_out(payloads: list[None]) -> list[None]:
        """A prefilling request's turn in a round whose prompt budget is spent: nothing runs."""
        return [None] * len(payloads)

    def prompt_room(self) -> int:
        """Prompt tokens a prefilling request may put into the round being put together:
        ``PREFILL_CHUNK`` while no request is generating, else what is left of
        ``BUSY_PROMPT_BUDGET``."""
        if not self._generating:
            return PREFILL_CHUNK
        return max(0, min(PREFILL_CHUNK, BUSY_PROMPT_BUDGET - self._round_prompt))

    def prefill_rounds(self, state: BackendState, ids: list[int], fuse: int) -> Generator[Batched, Any, None]:
        """Bring ``state``'s cache up to ``ids[:-1]`` but its last tokens (at most ``fuse``;
        they ride in the first verification pass), a chunk per worker round, each decoded
        together with the other requests' passes: a long prompt does not hold the other
        completions for its whole prefill, and their tokens ride on its chunks. While others
        are generating, the chunks of a round share ``BUSY_PROMPT_BUDGET`` (``prompt_room``):
        a request whose round has no room left sits it out."""
        pre = ids[:-1]
        self.backend.truncate(state, common_prefix_len(state.tokens, pre))
        while len(pre) - len(state.tokens) > (min(fuse, BUSY_PROMPT_BUDGET) if self._generating else fuse):
            room = self.prompt_room()
            if room <= 0:
                yield Batched(self._sit_out, None)
                continue
            at = len(state.tokens)
            chunk = pre[at : at + room]
            self._round_prompt += len(chunk)
            yield Batched(self.verify_together, (state, chunk, None, len(chunk) - 1))

    @classmethod
    def load(cls, config: ServerConfig) -> ChatEngine:
        if config.engine == "vllm":
            # vLLM speculates on its own (its --speculative-config); requests are forwarded
            return cls(connect(config.vllm_urls, model=config.model, top_k=config.vllm_top_k), config)  # type: ignore[arg-type]
        # llama.cpp: a KV state per session the server may hold, so sessions do not evict each
        # other (an evicted conversation is prefilled again: under load that thrashes); past 15
        # states the trees get fewer branches (llama.cpp has 256 sequence ids in all)
        states = min(64, max(4, config.max_sessions)) if config.backend == "llamacpp" else None
        backend = load_backend(
            config.model,
            config.backend,
            n_ctx=config.n_ctx,
            threads=config.threads,
            device=config.device,
            max_states=states,
        )
        backend.reserve_memory()  # the KV, compute and logits buffers are resident now, not turn by turn
        engine = cls(backend, config)
        # a drafter recipe that cannot be built (a missing --draft-model) fails the load, not
        # every request; this also loads a draft model now rather than on the first request
        drafter = engine.new_drafter()
        if drafter is not None:
            drafter.close()
        return engine

    def new_drafter(self) -> Drafter | None:
        c = self.config
        if c.engine == "vllm":
            return None
        return make_drafter(
            c.drafter,
            self.backend,
            c.draft_model,
            max_len=c.max_draft,
            threshold=c.threshold,
            datastore=c.datastore,
        )

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        return self.backend.tokenizer.chat(messages)

    def generate(
        self, messages: list[dict[str, str]], params: ChatParams
    ) -> Generator[ChatEvent | Batched, Any, None]:
        """Deltas step by step, then one ``ChatDone``; runs on a ``ModelWorker`` (which answers
        its ``Batched`` requests)."""
        ids = self.prompt_ids(messages)
        cap = self.config.max_tokens
        cfg = GenerationConfig(
            max_tokens=min(params.max_tokens or cap, cap),
            stop=params.stop,
            temperature=params.temperature,
            seed=params.seed,
            # the last chunk's worth of prompt rides in the first verification pass (its rows'
            # logits are not computed): the first token comes one target pass after the prompt
            fuse_prefill=PREFILL_CHUNK,
        )
        drafter = self.new_drafter()
        knowledge = None
        if drafter is not None and self.config.knowledge and not disabled_by_env():
            # every request has a fresh drafter: it starts from what earlier ones learned
            knowledge = KnowledgeStore(self.backend, drafter, self.config.drafter)
        cache = self.prompt_cache
        # with a prompt cache the state is this request's to park when it ends
        state = None
        if self.backend.in_process:
            state = (None if cache is None else cache.take(ids)) or self.backend.new_state()
        load = self.round_load

        def shared(curve):  # a draft costs what it adds to the pass it shares with the others
            return SharedPassCost(curve, lambda: load.others(state))

        plan_cost = None if state is None else shared
        dec = make_decoder(self.backend, drafter, knowledge=knowledge, state=state, plan_cost=plan_cost)
        failed = False
        steps = None
        generating = False
        try:
            if state is not None:
                yield from self.prefill_rounds(state, ids, cfg.fuse_prefill)
            generating = True
            self._generating += 1
            steps = dec.stepwise(ids, cfg)
            reply = None
            while True:
                try:
                    item = steps.send(reply)
                except StopIteration as done:  # the generator returns the result
                    result = done.value
                    break
                if isinstance(item, VerifyPass):
                    # the worker runs this pass together with the other requests' (one decode)
                    pass_ = (item.state, item.tokens, item.parents, item.skip)
                    reply = yield Batched(self.verify_together, pass_)
                else:
                    reply = None
                    yield ChatDelta(item.text, len(item.tokens), item.drafted, item.accepted)
            yield ChatDone(result.stats)
        except Exception:
            failed = True  # a failed generation's cache is not kept
            raise
        finally:
            if generating:
                self._generating -= 1
            if steps is not None:
                steps.close()  # the drafter's end() before the state goes
            keep = cache is not None and state is not None and not failed
            dec.close(release_state=not keep)
            if keep:
                cache.park(state)  # finished or cancelled (GeneratorExit): kept for a next turn
