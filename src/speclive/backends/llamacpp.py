"""``LlamaCppBackend``: a GGUF model run by llama.cpp through its low-level C bindings.

The backend drives ``llama_cpp.llama_cpp`` directly (model/context creation, one preallocated
``llama_batch``, ``llama_decode``, ``llama_memory_seq_*``) rather than the high-level ``Llama``
generate API, so it can evaluate token *trees* and edit the KV cache in place.

KV-cache layout (one llama.cpp context, unified KV buffer, flash attention on):

- Every ``LlamaCppState`` owns a *home* sequence id ``h`` in ``[0, max_states)``; its committed
  tokens are the cells tagged with ``h`` at positions ``0..len-1``.
- A tree extension uses *branch* sequence ids private to the state
  (``max_states + h * max_tree_branches + j``), one per leaf. Each branch first receives a copy
  of the prefix (``seq_cp``, which only tags the existing cells, nothing is recomputed); every node
  is tagged with the branches of all leaves below it, so one ``llama_decode`` evaluates all paths
  and each node attends exactly to the prefix plus its ancestors.
- ``keep(path)`` trims the branch holding the path's last node to the path, tags those cells with
  the home id and drops every branch id; ``truncate`` removes home positions ``>= n``.
- ``fork`` gives the new state another home id and tags the source's cells with it: the prefix
  is shared, not copied.

Several states can live at once (``max_states``, default 4). When ``new_state``/``fork`` needs a
home and none is free, the least recently used state (a parked one first: ``park``) is
*evicted*: its cache is cleared and any later use raises ``RuntimeError`` until it is reset
with ``truncate(state, 0)`` or ``release`` (with ``restore_evicted``, its next use instead
prefills its tokens again in a new home).
With ``max_states=1`` every new state thus replaces the previous one (plain sequential use).
With ``offload_parked``, ``park`` instead copies the state's cells to host memory
(``llama_state_seq_get_data``, an anonymous mapping) and frees them and its home at once; its
next use (or a ``fork`` of it) writes them back into free cells (``llama_state_seq_set_data``).
The copy is of the computed keys and values, so nothing is prefilled again. The copies together
stay within the size of the KV buffer itself (a parked state past that waits in its cells, as
without offloading), so host memory is bounded as the cells are. This matters
because every decode's attention scans the whole used range of the unified buffer (llama.cpp's
``n_kv`` is the highest used cell, and its CPU flash-attention kernel reads the mask of every
cell below it for every query row and head), so cells that parked states hold slow down every
other state's passes (docs/engine.md).
States that are garbage collected give their home back automatically. All states share the
KV cells of the context (``n_cells``, at least ``n_ctx``); running out raises
``ContextOverflowError``, except with ``restore_evicted``: then the least recently used other
states (parked ones first) are evicted until the new tokens fit (a server's idle conversations
give way to the active ones). A backend is not thread-safe: use it from one thread at a time.

Numerics: the same calls on a state give the same logits bit for bit, whatever other states
hold (flash attention). But the logits of a k-token batch differ from one-token steps (quantized
kernels depend on the batch shape), so a cache built in other chunks is *close to*, not
bit-identical with, a fresh evaluation (``docs/engine.md``, exactness). The benchmarks' reference generator
(llama-cpp-python's own ``Llama``) lives in ``speclive_bench.reference``.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from speclive.backends.base import Backend, BackendState
from speclive.backends.llamacpp_buffers import extra_buffers_safe
from speclive.errors import BackendUnavailableError, ContextOverflowError
from speclive.tokenizer import Tokenizer

#: t(k)/t(1) of one llama.cpp decode over k tokens: the cost model's prior when the caller passes
#: no calibrated curve (``cost_prior``; docs/engine.md); measurements replace it online
LLAMACPP_COST_PRIOR: dict[int, float] = {1: 1.0, 2: 1.58, 4: 2.25, 8: 5.59, 16: 7.01, 32: 12.66}

_LOG_TAIL: deque[str] = deque(maxlen=40)
_LOG_CALLBACK: Any = None  # the ctypes callback must stay alive as long as llama.cpp may call it
_BACKEND_READY = False


def llama_cpp_lib() -> Any:
    """The low-level binding module, with logging silenced and the backend initialized once."""
    global _LOG_CALLBACK, _BACKEND_READY
    try:
        import llama_cpp.llama_cpp as lib
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise BackendUnavailableError(
            "the llama.cpp backend needs llama-cpp-python: pip install 'speclive[llamacpp]'"
        ) from exc
    if _LOG_CALLBACK is None:

        def _on_log(level: int, text: bytes | None, user_data: Any) -> None:
            # keep warnings/errors (and their continuation lines) for error messages, print nothing
            if text and (level in (2, 3) or (level == 5 and _LOG_TAIL)):
                _LOG_TAIL.append(text.decode("utf-8", "replace"))

        _LOG_CALLBACK = lib.llama_log_callback(_on_log)
        lib.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
    if not _BACKEND_READY:
        lib.llama_backend_init()
        _BACKEND_READY = True
    return lib


def _log_tail() -> str:
    text = "".join(_LOG_TAIL).strip()
    return f" (llama.cpp log: {text[-600:]})" if text else ""


@dataclass(eq=False)
class LlamaCppState(BackendState):
    """A ``BackendState`` whose cache lives in the llama.cpp sequences named here."""

    #: home sequence id, -1 while the state holds none (new, released or evicted)
    seq: int = -1
    #: the cache was cleared to make room for another state; reset it before further use
    evicted: bool = False
    #: branch sequence ids of the pending tree, one per leaf
    branch_seqs: list[int] = field(default_factory=list)
    #: for each pending tree node, one branch sequence id that contains it
    node_seq: list[int] = field(default_factory=list)
    last_use: int = 0
    #: parked (``park``): evicted before every state that is not
    parked: bool = False
    #: the cells of a state parked with ``offload_parked``, copied to host memory (it holds no
    #: home meanwhile); written back on its next use
    saved: mmap.mmap | None = field(default=None, repr=False)
    #: id of the backend whose sequences these are (0: none yet)
    owner: int = field(default=0, repr=False)
    _finalizer: Any = field(default=None, repr=False)


#: a checked pass of ``extend_many``: its index, state, tokens and parents (None: a chain)
_Pass = tuple[int, LlamaCppState, list[int], list[int] | None]


class LlamaCppBackend(Backend):
    """A GGUF causal LM on llama.cpp implementing the ``Backend`` protocol (module docstring)."""

    kind = "llamacpp"
    settable_threads = True

    def __init__(
        self,
        gguf_path: str | os.PathLike[str],
        tokenizer: Tokenizer,
        name: str | None = None,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_batch: int = 512,
        max_tree_branches: int | None = None,
        max_states: int = 4,
        repack: bool | None = None,
        restore_evicted: bool = False,
        n_cells: int | None = None,
        cost_prior: Mapping[int, float] | None = None,
        flash_attn: bool = True,
        offload_parked: bool = False,
    ) -> None:
        #: llama.cpp's flash attention (off only to compare: see ``_create_context``)
        self.flash_attn = bool(flash_attn)
        #: an evicted state is restored on its next use (its tokens prefilled again into a home
        #: taken from the least recently used state) instead of raising; for many sessions on
        #: one backend, as the server has
        self.restore_evicted = restore_evicted
        self.restores = 0
        self.offload_parked = offload_parked
        #: parked states copied out to host memory, and copies written back into the cache
        self.offloads = 0
        self.reloads = 0
        #: the states whose cells wait in host memory now (their copies' bytes: ``_offloaded_bytes``)
        self._offloaded: weakref.WeakValueDictionary[int, LlamaCppState] = weakref.WeakValueDictionary()
        #: states evicted because the KV cells ran out (only with ``restore_evicted``)
        self.cell_evictions = 0
        #: the cost model's cold-start curve t(k)/t(1) (``default_cost_prior``); the caller's
        #: calibrated one, else ``LLAMACPP_COST_PRIOR``
        self._cost_prior = dict(cost_prior or LLAMACPP_COST_PRIOR)
        lib = llama_cpp_lib()
        self._lib = lib
        self._model: Any = None
        self._ctx: Any = None
        self._batch: Any = None
        path = Path(gguf_path)
        if not path.is_file():
            raise FileNotFoundError(f"GGUF model file not found: {path}")
        max_tree_branches, n_seq = self._sequences(max_tree_branches, max_states)
        self.gguf_path = path
        self.tokenizer = tokenizer
        self.name = name or path.stem
        self.n_ctx = int(n_ctx)
        self.n_threads = int(n_threads or os.cpu_count() or 1)
        self.n_batch = max(1, min(int(n_batch), self.n_ctx))
        self.max_tree_branches = int(max_tree_branches)
        self.max_states = int(max_states)
        self.n_seq_max = n_seq
        self._load_model(path, repack)
        self._create_context(path, n_cells)
        self._create_batch()
        self._free_homes: list[int] = list(range(max_states))
        self._owners: dict[int, weakref.ref[LlamaCppState]] = {}
        self._dead_homes: list[int] = []  # homes of garbage-collected states, freed lazily
        self._tick = 0
        super().__init__()

    def _sequences(self, max_tree_branches: int | None, max_states: int) -> tuple[int, int]:
        """Branch sequences per state (default: 16, fewer when many states must share
        llama.cpp's sequence ids) and the sequence ids all states need in all."""
        limit = self._lib.llama_max_parallel_sequences()
        if max_tree_branches is None:
            max_tree_branches = max(1, min(16, limit // max(1, max_states) - 1))
        if max_tree_branches < 1 or max_states < 1:
            raise ValueError("max_tree_branches and max_states must be >= 1")
        n_seq = max_states * (1 + max_tree_branches)
        if n_seq > limit:
            raise ValueError(
                f"max_states * (1 + max_tree_branches) = {n_seq} sequences exceed llama.cpp's limit "
                f"of {limit}"
            )
        return max_tree_branches, n_seq

    def _load_model(self, path: Path, repack: bool | None) -> None:
        """Load the GGUF weights and read the model's vocabulary size. ``repack``: llama.cpp's
        extra weight buffers (repacked layouts, AMX tiles); None: on where they are safe here
        (``llamacpp_buffers``: on some AMX hosts they crash on the first batch)."""
        lib = self._lib
        mparams = lib.llama_model_default_params()
        if repack is None:
            repack = extra_buffers_safe(path)
        #: whether the weights sit in llama.cpp's repacked (interleaved) layouts
        self.repacked = bool(repack)
        mparams.use_extra_bufts = self.repacked
        model = lib.llama_model_load_from_file(str(path).encode("utf-8"), mparams)
        if not model:
            raise RuntimeError(f"llama.cpp could not load {path}{_log_tail()}")
        self._model = model
        vocab = lib.llama_model_get_vocab(model)
        self.vocab_size = int(lib.llama_vocab_n_tokens(vocab))
        #: tokenizer.vocab_size - model n_vocab (0 when they agree); logits are n_vocab wide
        self.vocab_mismatch = int(self.tokenizer.vocab_size) - self.vocab_size
        if self.vocab_mismatch > 0:
            warnings.warn(
                f"tokenizer has {self.tokenizer.vocab_size} tokens but {path.name} has {self.vocab_size}: "
                "ids beyond the model's vocabulary are rejected",
                stacklevel=3,  # the caller of __init__
            )

    def _create_context(self, path: Path, n_cells: int | None) -> None:
        """The llama.cpp context: the KV cells all states share (at least ``n_ctx``), one
        unified KV buffer, logits for every batch token."""
        lib, n_seq = self._lib, self.n_seq_max
        cparams = lib.llama_context_default_params()
        # the KV cells all states share (at least n_ctx; one prompt stays limited to n_ctx)
        cparams.n_ctx = max(self.n_ctx, int(n_cells or 0))
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = self.n_batch
        cparams.n_seq_max = n_seq
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        # flash attention: its CPU kernel skips masked cells and takes its dot products over the
        # head dimension, so a state's logits do not depend on which cells other states hold
        # (the plain kernel's sums over all cells do: docs/engine.md, exactness)
        cparams.flash_attn_type = (
            lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if self.flash_attn else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        cparams.kv_unified = True  # tokens tagged with several sequences need one shared KV buffer
        if hasattr(cparams, "n_outputs_max"):
            # llama.cpp reserves its graph with up to one output per sequence: with fewer batch
            # tokens than sequences the default (n_batch) trips an assertion
            cparams.n_outputs_max = max(self.n_batch, n_seq)
            cparams.n_outputs_max_per_seq = 0  # logits for every token, also within one sequence
        ctx = lib.llama_init_from_model(self._model, cparams)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not create a context for {path}{_log_tail()}")
        self._ctx = ctx
        #: KV cells of the context, shared by all states (llama.cpp pads n_ctx, e.g. to 256)
        self.n_cells = int(lib.llama_n_ctx(ctx))
        if self.n_cells < self.n_ctx:
            raise RuntimeError(f"llama.cpp gave a context of {self.n_cells} < {self.n_ctx} cells")
        self._mem = lib.llama_get_memory(ctx)

    def _create_batch(self) -> None:
        """The one preallocated ``llama_batch`` every decode fills, with numpy views of its arrays."""
        lib, n_seq = self._lib, self.n_seq_max
        self._batch = lib.llama_batch_init(self.n_batch, 0, n_seq)
        b = self._batch
        self._b_token = np.ctypeslib.as_array(b.token, shape=(self.n_batch,))
        self._b_pos = np.ctypeslib.as_array(b.pos, shape=(self.n_batch,))
        self._b_nseq = np.ctypeslib.as_array(b.n_seq_id, shape=(self.n_batch,))
        self._b_out = np.ctypeslib.as_array(b.logits, shape=(self.n_batch,))
        self._b_out[:] = 1  # logits for every batch token, always
        self._b_seq = [np.ctypeslib.as_array(b.seq_id[i], shape=(n_seq,)) for i in range(self.n_batch)]
        self._decode = lib.llama_decode
        self._get_logits = lib.llama_get_logits

    # ---- lifetime -------------------------------------------------------------------
    def close(self) -> None:
        """Free the batch, context and model (idempotent)."""
        lib = getattr(self, "_lib", None)
        if lib is None:
            return
        for ref in list(getattr(self, "_owners", {}).values()):
            st = ref()
            if st is not None:
                if st._finalizer is not None:
                    st._finalizer.detach()
                st.seq, st.evicted = -1, bool(st.tokens)
        if getattr(self, "_batch", None) is not None:
            lib.llama_batch_free(self._batch)
            self._batch = None
            self._b_seq = []
        if getattr(self, "_ctx", None):
            lib.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            lib.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown may have torn down the bindings
            pass

    def __enter__(self) -> LlamaCppBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reserve_memory(self) -> None:
        """Make the context's buffers resident now, so a server's memory use is known at
        start-up: writing the KV buffer and decoding one full batch with logits for every token
        touches the KV cells, the compute buffer and the largest logits buffer llama.cpp will
        ever keep. Otherwise each is reached piece by piece as conversations grow and batches
        widen, which reads as a leak over hours and can run out mid-way. Costs one pass of
        ``n_batch`` tokens; clears every state's cache: call it before any state holds tokens."""
        if any(ref() is not None and ref().tokens for ref in self._owners.values()):  # type: ignore[union-attr]
            raise RuntimeError("reserve_memory() would clear states that hold tokens")
        self._lib.llama_memory_clear(self._mem, True)
        n = self.n_batch
        home = next(iter(self._free_homes), 0)
        self._run([0] * n, np.arange(n, dtype=np.int32), None, home, [home])
        self._lib.llama_memory_clear(self._mem, True)

    def default_cost_prior(self) -> dict[int, float] | None:
        return dict(self._cost_prior)

    def use_cost_prior(self, prior: dict[int, float]) -> None:
        # cost models made later (a decoder's drafting-pass model) start from it too
        self._cost_prior = dict(prior)
        super().use_cost_prior(prior)

    # ---- states ---------------------------------------------------------------------
    def new_state(self) -> LlamaCppState:
        """A fresh empty state; may evict the least recently used one (module docstring)."""
        state = LlamaCppState()
        self._acquire(state)
        return state

    def fork(self, state: BackendState) -> LlamaCppState:
        st = self._as_state(state)
        if st.seq < 0 and st.saved is not None:
            # an offloaded state: its copy is written into the fork's home; the state itself
            # stays in host memory
            new = LlamaCppState(tokens=list(st.tokens))
            self._load(new, st.saved)
            return new
        st = self._check(st)
        if st.pending is not None:
            raise RuntimeError("fork() called while a tree extension is pending: call keep() first")
        self._touch(st)
        new = LlamaCppState(tokens=list(st.tokens))
        self._acquire(new, protect=st)
        if st.seq >= 0 and st.tokens:
            self._lib.llama_memory_seq_cp(self._mem, st.seq, new.seq, -1, -1)
        return new

    def set_threads(self, n_threads: int) -> None:
        """Change the context's CPU threads (e.g. 1 per side when drafting runs concurrently)."""
        n = max(1, int(n_threads))
        self._lib.llama_set_n_threads(self._ctx, n, n)
        self.n_threads = n

    def release(self, state: BackendState) -> None:
        """Free the state's cache and its sequence id; the state may be reused (it is empty)."""
        st = self._as_state(state)
        if st.seq >= 0:
            self._clear_seqs(st.seq)
            self._free_home(st)
        st.tokens.clear()
        st.pending = st.pending_parents = None
        st.branch_seqs, st.node_seq = [], []
        st.evicted = st.parked = False
        st.saved = None

    def park(self, state: BackendState) -> None:
        st = self._as_state(state)
        st.parked = True
        if self.offload_parked and st.seq >= 0 and st.tokens and st.pending is None:
            self._offload(st)

    def _offload(self, st: LlamaCppState) -> None:
        """Copy the state's cells to host memory, then free them and its home (module
        docstring); a copy llama.cpp does not complete leaves the state where it was."""
        lib, ctx = self._lib, self._ctx
        size = int(lib.llama_state_seq_get_size(ctx, st.seq))
        # the copies' budget: what the KV buffer's cells hold, at this copy's bytes per token
        if size <= 0 or self._offloaded_bytes() + size > size * self.n_cells // len(st.tokens):
            return
        # an anonymous mapping: its pages go back to the system when the copy is dropped,
        # whatever the malloc arena would have kept
        buf = mmap.mmap(-1, size)
        view = (ctypes.c_uint8 * size).from_buffer(buf)
        try:
            done = int(lib.llama_state_seq_get_data(ctx, view, size, st.seq))
        finally:
            del view
        if done != size:
            buf.close()
            return
        self._clear_seqs(st.seq)
        self._free_home(st)
        st.saved = buf
        self._offloaded[id(st)] = st
        self.offloads += 1

    def _offloaded_bytes(self) -> int:
        return sum(len(s.saved) for s in list(self._offloaded.values()) if s.saved is not None)

    def _load(self, st: LlamaCppState, buf: mmap.mmap) -> None:
        """Give ``st`` (holding no home) a home and write a copy made by ``_offload`` into it;
        when no free cells take it, the least recently used other states are evicted first
        (``restore_evicted``), else ``ContextOverflowError``; on any failure ``st`` holds no
        home again."""
        self._acquire(st)
        lib, size = self._lib, len(buf)
        view = (ctypes.c_uint8 * size).from_buffer(buf)
        try:
            while not lib.llama_state_seq_set_data(self._ctx, view, size, st.seq):
                if not (self.restore_evicted and self._evict_for_cells({st.seq})):
                    raise ContextOverflowError(
                        f"llama.cpp found no free KV cells for the {len(st.tokens)} saved tokens of "
                        f"a parked state: the {self.n_ctx}-token context of {self.name} is shared "
                        "by all its states"
                    )
        except BaseException:
            self._clear_seqs(st.seq)
            self._free_home(st)
            raise
        finally:
            del view
        self.reloads += 1

    def unpark(self, state: BackendState) -> None:
        self._as_state(state).parked = False

    def _as_state(self, state: BackendState) -> LlamaCppState:
        if not isinstance(state, LlamaCppState):
            raise TypeError(f"expected a LlamaCppState from this backend, got {type(state).__name__}")
        if state.owner and state.owner != id(self):
            raise RuntimeError("this state belongs to another backend")
        return state

    def _check(self, state: BackendState) -> LlamaCppState:
        """The state, with a home sequence id (re-acquired after a release)."""
        st = self._as_state(state)
        if st.seq < 0:
            if st.saved is not None:
                self._load(st, st.saved)  # on failure still offloaded: its copy stays
                st.saved.close()
                st.saved = None
                return st
            if st.evicted and self.restore_evicted and st.pending is None:
                tokens = list(st.tokens)
                self._acquire(st)
                if tokens:
                    try:
                        pos = np.arange(len(tokens), dtype=np.int32)
                        self._run(tokens, pos, None, st.seq, [st.seq], True)
                    except BaseException:
                        self._clear_seqs(st.seq)  # still evicted: its tokens are not in the cache
                        self._free_home(st)
                        st.evicted = True
                        raise
                self.restores += 1
                return st
            if st.evicted:
                raise RuntimeError(
                    "this llama.cpp state was evicted to make room for a newer one (max_states="
                    f"{self.max_states}); reset it with truncate(state, 0) or release(state)"
                )
            self._acquire(st)
        return st

    def _touch(self, st: LlamaCppState) -> None:
        self._tick += 1
        st.last_use = self._tick
        st.parked = False

    def _branch_base(self, home: int) -> int:
        return self.max_states + home * self.max_tree_branches

    def _clear_seqs(self, home: int) -> None:
        rm = self._lib.llama_memory_seq_rm
        rm(self._mem, home, -1, -1)
        base = self._branch_base(home)
        for s in range(base, base + self.max_tree_branches):
            rm(self._mem, s, -1, -1)

    def _acquire(self, st: LlamaCppState, protect: LlamaCppState | None = None) -> None:
        """Give ``st`` a free home sequence, evicting the least recently used other state."""
        if self._ctx is None:
            raise RuntimeError("this backend has been closed")
        while self._dead_homes:
            home = self._dead_homes.pop()
            self._owners.pop(home, None)
            self._clear_seqs(home)
            self._free_homes.append(home)
        if not self._free_homes and not self._evict_least_recent(
            lambda h, v: v is not st and v is not protect
        ):
            raise RuntimeError(f"no free llama.cpp sequence for another state (max_states={self.max_states})")
        home = min(self._free_homes)
        self._free_homes.remove(home)
        self._clear_seqs(home)
        st.seq = home
        st.evicted = False
        st.owner = id(self)
        self._owners[home] = weakref.ref(st)
        st._finalizer = weakref.finalize(st, self._dead_homes.append, home)
        st._finalizer.atexit = False
        self._touch(st)

    def _free_home(self, st: LlamaCppState) -> None:
        if st._finalizer is not None:
            st._finalizer.detach()
            st._finalizer = None
        self._owners.pop(st.seq, None)
        self._free_homes.append(st.seq)
        st.seq = -1
        st.branch_seqs, st.node_seq = [], []

    # ---- the protocol ---------------------------------------------------------------
    def _extend(
        self, state: BackendState, tokens: list[int], parents: list[int] | None, last_only: bool = False
    ) -> np.ndarray:
        return self._evaluate(state, tokens, parents, None, last_only)

    def _extend_skipping(
        self, state: BackendState, tokens: list[int], parents: list[int] | None, skip: int
    ) -> np.ndarray:
        return self._evaluate(state, tokens, parents, np.arange(len(tokens)) >= skip)

    def _evaluate(
        self,
        state: BackendState,
        tokens: list[int],
        parents: list[int] | None,
        rows: np.ndarray | None,
        last_only: bool = False,
    ) -> np.ndarray:
        """One state's chain or tree, the logits of ``rows`` (as in ``_run``) alone."""
        if type(state) is LlamaCppState and state.seq >= 0 and state.owner == id(self):
            st = state
        else:
            st = self._check(state)
        self._touch(st)
        base = len(st.tokens)
        n = len(tokens)
        if parents is None:
            pos = np.arange(base, base + n, dtype=np.int32)
            return self._run(tokens, pos, None, st.seq, [st.seq], last_only, rows=rows)
        pos, tags, branches = self._tree_layout(st, tokens, parents)
        try:
            logits = self._run(tokens, pos, tags, st.seq, branches, rows=rows)
        except BaseException:
            self._drop_branches(branches)
            raise
        st.branch_seqs = branches
        st.node_seq = [t[0] for t in tags]
        return logits

    def _tree_layout(
        self, st: LlamaCppState, tokens: list[int], parents: list[int]
    ) -> tuple[np.ndarray, list[list[int]], list[int]]:
        """Positions and sequence tags of a tree's nodes: one branch sequence per leaf (holding
        a copy of the prefix), every node tagged with the branches of the leaves below it."""
        n = len(tokens)
        has_child = [False] * n
        depth = [0] * n
        for i, p in enumerate(parents):
            if p >= 0:
                has_child[p] = True
                depth[i] = depth[p] + 1
        leaves = [i for i in range(n) if not has_child[i]]
        if len(leaves) > self.max_tree_branches:
            raise ValueError(
                f"the tree has {len(leaves)} leaves but this backend evaluates at most "
                f"max_tree_branches={self.max_tree_branches} branches"
            )
        first = self._branch_base(st.seq)
        tags: list[list[int]] = [[] for _ in range(n)]
        for j, leaf in enumerate(leaves):
            node = leaf
            while node >= 0:
                tags[node].append(first + j)
                node = parents[node]
        branches = list(range(first, first + len(leaves)))
        base = len(st.tokens)
        lib, mem = self._lib, self._mem
        for s in branches:
            lib.llama_memory_seq_rm(mem, s, -1, -1)
            if base:
                lib.llama_memory_seq_cp(mem, st.seq, s, -1, -1)
        return np.asarray(depth, dtype=np.int32) + base, tags, branches

    def _drop_branches(self, branches: list[int]) -> None:
        for s in branches:
            self._lib.llama_memory_seq_rm(self._mem, s, -1, -1)

    def extend_many(
        self,
        passes: Sequence[tuple[BackendState, Sequence[int], Sequence[int] | None]],
        skip: Sequence[int] | None = None,
    ) -> list[np.ndarray | Exception]:
        """Several states' passes in one ``llama_decode``, each on its own sequences (no token
        attends to another state's cells); ``skip`` as in ``extend``, per pass (a chunk of a
        prompt rides along with other states' verification passes, its last row alone). Passes
        that do not all fit one batch are packed, in order, into as few decodes as fit
        (``_batches``). A pass that fails its checks gets its exception and the others still
        run together; when a group's states cannot all be resident at once, or its decode
        fails, each of its passes runs alone."""
        skips = list(skip) if skip is not None else [0] * len(passes)
        results: list[np.ndarray | Exception | None] = [None] * len(passes)
        checked: list[_Pass] = []
        for i, (st, toks, par) in enumerate(passes):
            try:
                t, p = self._checked(st, toks, par, False, skips[i])
                checked.append((i, self._as_state(st), t, p))
            except Exception as e:  # noqa: BLE001 - this pass's own error
                results[i] = e
        for group in self._batches(checked):
            together = len(group) > 1
            if together:
                try:
                    for _, st, _, _ in group:
                        self._check(st)
                    together = all(st.seq >= 0 for _, st, _, _ in group)  # restoring one evicted no other
                    if together:
                        out = self._decode_together(group, [skips[i] for i, _, _, _ in group])
                        for (i, st, _, _), rows in zip(group, out, strict=True):
                            results[i] = rows
                            st.pass_s = None  # the decode was shared: no time of its own
                        self.forward_calls += 1
                except Exception:  # noqa: BLE001 - nothing was kept: each pass runs alone below
                    together = False
            if not together:
                for i, st, t, p in group:
                    results[i] = self._try_extend(st, t, p, skips[i])
        return results  # type: ignore[return-value]

    def _batches(self, checked: list[_Pass]) -> list[list[_Pass]]:
        """The passes, in order, packed into groups of at most ``n_batch`` tokens that can share
        one decode (each state once per group); an empty pass or one longer than ``n_batch``
        is a group of its own (it runs alone, in chunks). Several prompt chunks in one round
        then cost a decode per batch's worth, not one per pass."""
        groups: list[list[_Pass]] = []
        group: list[_Pass] = []
        size, seen = 0, set()
        for entry in checked:
            n, sid = len(entry[2]), id(entry[1])
            alone = n == 0 or n > self.n_batch
            if group and (alone or size + n > self.n_batch or sid in seen):
                groups.append(group)
                group, size, seen = [], 0, set()
            group.append(entry)
            size += n
            seen.add(sid)
            if alone:
                groups.append(group)
                group, size, seen = [], 0, set()
        if group:
            groups.append(group)
        return groups

    def _decode_together(self, checked: list[_Pass], skips: list[int]) -> list[np.ndarray]:
        tokens: list[int] = []
        pos_parts: list[np.ndarray] = []
        tags: list[list[int]] = []
        rows: list[np.ndarray] = []  # per pass: which of its tokens' logits are computed
        made: list[tuple[list[int], list[list[int]]]] = []  # per pass: its branches, its tags
        try:
            for _, st, toks, par in checked:
                self._touch(st)
                if par is None:
                    t = [[st.seq] for _ in toks]
                    base = len(st.tokens)
                    pos_parts.append(np.arange(base, base + len(toks), dtype=np.int32))
                    made.append(([], t))
                else:
                    pos, t, branches = self._tree_layout(st, toks, par)
                    pos_parts.append(pos)
                    made.append((branches, t))
                tags += t
                tokens += toks
                want = np.zeros(len(toks), dtype=bool)
                want[skips[len(rows)] :] = True
                rows.append(want)
            # one chunk (at most n_batch tokens): a failed decode leaves nothing in the cache
            homes = [st.seq for _, st, _, _ in checked]
            out = self._run(
                tokens, np.concatenate(pos_parts), tags, -1, [], protect=homes, rows=np.concatenate(rows)
            )
        except BaseException:
            for branches, _ in made:
                self._drop_branches(branches)
            raise
        results: list[np.ndarray] = []
        at = 0
        for (_, st, toks, par), (branches, t), want in zip(checked, made, rows, strict=True):
            m = int(want.sum())
            results.append(out[at : at + m])
            at += m
            if par is not None:
                st.branch_seqs = branches
                st.node_seq = [x[0] for x in t]
            self._extended(st, toks, par)
        return results

    def _run(
        self,
        tokens: list[int],
        pos: np.ndarray,
        tags: list[list[int]] | None,
        home: int,
        touched: list[int],
        last_only: bool = False,
        protect: Collection[int] = (),
        rows: np.ndarray | None = None,
    ) -> np.ndarray:
        """Decode ``tokens`` (chunks of ``n_batch``) and return a copy of their logits.

        ``rows`` (one bool per token) says which tokens' logits llama.cpp computes and we copy,
        in order; ``last_only`` is the last token's row alone; neither: every row. A failed
        chunk takes the earlier ones out of the cache again. When the KV cells run out and
        ``restore_evicted`` is on, the least recently used other state (not ``home`` nor a home
        in ``protect``) is evicted and the decode starts again, until it fits or no state is
        left to evict: the evicted state's owner prefills it again on its next use.
        """
        n = len(tokens)
        nb = self.n_batch
        batch = self._batch
        if batch is None:
            raise RuntimeError("this backend has been closed")
        if last_only:
            rows = np.zeros(n, dtype=bool)
            rows[-1] = True
        out = np.empty((n if rows is None else int(rows.sum()), self.vocab_size), dtype=np.float32)
        a = o = 0
        while a < n:
            k = min(nb, n - a)
            if rows is not None:
                self._b_out[:k] = rows[a : a + k]
            self._b_token[:k] = tokens[a : a + k]
            self._b_pos[:k] = pos[a : a + k]
            seq_rows = self._b_seq
            if tags is None:
                self._b_nseq[:k] = 1
                for i in range(k):
                    seq_rows[i][0] = home
            else:
                for i in range(k):
                    t = tags[a + i]
                    self._b_nseq[i] = len(t)
                    seq_rows[i][: len(t)] = t
            batch.n_tokens = k
            rc = self._decode(self._ctx, batch)
            if rc != 0:
                self._b_out[:] = 1  # logits for every batch token again, as other calls expect
                o = 0
                if a:  # earlier chunks are in the cache: take them out again
                    p0 = int(pos.min())
                    for s in touched:
                        self._lib.llama_memory_seq_rm(self._mem, s, p0, -1)
                if rc == 1 and self.restore_evicted and self._evict_for_cells({home, *protect}):
                    a = 0
                    continue
                if rc == 1:
                    raise ContextOverflowError(
                        f"llama.cpp found no free KV cells for {n} new tokens: the {self.n_ctx}-token "
                        f"context of {self.name} is shared by all its states; release unused states "
                        "or use a larger n_ctx"
                    )
                raise RuntimeError(f"llama_decode failed with code {rc}{_log_tail()}")
            m = k if rows is None else int(rows[a : a + k].sum())
            if rows is not None:
                self._b_out[:k] = 1
            if m:
                ptr = self._get_logits(self._ctx)
                out[o : o + m] = np.ctypeslib.as_array(ptr, shape=(m, self.vocab_size))
            a += k
            o += m
        return out

    def _evict_for_cells(self, keep: Collection[int]) -> bool:
        """Evict the least recently used state that holds cells, is not mid-tree and whose home
        is not in ``keep``; False when there is none."""
        if not self._evict_least_recent(lambda h, v: h not in keep and bool(v.tokens) and v.pending is None):
            return False
        self.cell_evictions += 1
        return True

    def _evict_least_recent(self, may: Callable[[int, LlamaCppState], bool]) -> bool:
        """Evict the least recently used live state for which ``may(home, state)`` holds,
        parked states first: its sequences are cleared and its home freed; False when there is
        none."""
        owners = ((h, ref()) for h, ref in self._owners.items())
        live = [(not v.parked, v.last_use, h, v) for h, v in owners if v is not None and may(h, v)]
        if not live:
            return False
        *_, home, victim = min(live, key=lambda x: x[:3])
        self._clear_seqs(home)
        self._free_home(victim)
        victim.evicted = bool(victim.tokens) or victim.pending is not None
        return True

    def _compact(self, state: BackendState, keep_idx: list[int]) -> None:
        st = self._as_state(state)
        base = len(st.tokens)
        path_len = len(keep_idx) - base
        if st.seq < 0:  # evicted while a tree was pending: only dropping the tree is possible
            if path_len > 0:
                self._check(st)  # raises the eviction error
            st.branch_seqs, st.node_seq = [], []
            return
        lib, mem = self._lib, self._mem
        if keep_idx[:base] != list(range(base)):
            raise ValueError("_compact keeps the whole committed prefix plus one path")
        if path_len > 0:
            s = st.node_seq[keep_idx[-1] - base]
            lib.llama_memory_seq_rm(mem, s, base + path_len, -1)  # nodes below the path's end
            lib.llama_memory_seq_cp(mem, s, st.seq, base, -1)  # the path joins the home sequence
        for s in st.branch_seqs:
            lib.llama_memory_seq_rm(mem, s, -1, -1)
        st.branch_seqs, st.node_seq = [], []

    def _truncate(self, state: BackendState, n: int) -> None:
        st = self._as_state(state)
        if st.seq < 0:
            if n == 0:  # resetting an evicted/released/offloaded state is always allowed
                st.evicted = False
                st.saved = None
                return
            self._check(st)  # raises for an evicted state
        if not self._lib.llama_memory_seq_rm(self._mem, st.seq, n, -1):
            raise RuntimeError(f"llama.cpp could not truncate the cache to {n} tokens{_log_tail()}")

    def cache_len(self, state: BackendState) -> int:
        """Tokens llama.cpp holds in the state's home sequence (for checks and debugging)."""
        st = self._as_state(state)
        if st.seq < 0:
            return 0
        return int(self._lib.llama_memory_seq_pos_max(self._mem, st.seq)) + 1
