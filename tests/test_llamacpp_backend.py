"""``LlamaCppBackend`` on the real SmolLM2-135M GGUF: every cache operation against fresh evaluations.

llama.cpp's logits are not reproducible bit for bit across batch shapes: one-token steps and
multi-token batches differ by up to ~0.9 on this quantized model. With flash attention (as the
backend runs) they no longer depend on where the tokens sit in the KV buffer, nor on the cells
other states hold (``test_a_states_logits_do_not_depend_on_the_cells_of_other_states``; without
it, a cell offset that is not a multiple of 8 moved them by up to ~1.5). Comparisons therefore
use a tolerance on the max and the mean absolute difference plus argmax agreement wherever the
top-2 gap is clear. A wrong attention context (a node seeing its sibling) moves logits by ~6 (mean
~0.6) and fails them; ``test_wrong_context_is_detected`` checks that.

The model comes from the speclive registry when it is installed, else from the environment
variables ``SPECLIVE_TEST_GGUF`` (a .gguf file) and ``SPECLIVE_TEST_TOKENIZER`` (its HF tokenizer
folder); without either the module is skipped.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from speclive.backends.llamacpp import LLAMACPP_COST_PRIOR, LlamaCppBackend, LlamaCppState  # noqa: E402
from speclive.decoder import GenerationConfig, make_decoder  # noqa: E402
from speclive.drafting.priors import cost_curve  # noqa: E402
from speclive.errors import ContextOverflowError  # noqa: E402
from speclive.server.prompt_cache import PromptCache  # noqa: E402
from speclive.tokenizer import Tokenizer  # noqa: E402
from speclive_bench.exactness import CallRecorder  # noqa: E402
from speclive_bench.reference import llama_reference_greedy  # noqa: E402

pytestmark = pytest.mark.llamacpp

REGISTRY_NAME = "smollm2-135m-instruct"
N_CTX = 512
THREADS = min(4, os.cpu_count() or 1)

# tolerances for llama.cpp's batch-shape dependent numerics (see the module docstring)
MAX_TOL = 2.5
MEAN_TOL = 0.25
CLEAR_GAP = 1.0


def _model_paths() -> tuple[Path, Path | None, str | None]:
    """(gguf, tokenizer folder or None, registry name or None) or skip."""
    try:
        from speclive.models.resolve import resolve

        ref = resolve(REGISTRY_NAME, install_missing=False)
        if ref.gguf is not None and ref.gguf.is_file():
            tok_env = os.environ.get("SPECLIVE_TEST_TOKENIZER")
            return ref.gguf, Path(tok_env) if tok_env else None, ref.name
    except Exception:  # noqa: BLE001 - registry missing, not installed, or still being written
        pass
    gguf = os.environ.get("SPECLIVE_TEST_GGUF")
    if gguf and Path(gguf).is_file():
        tok_env = os.environ.get("SPECLIVE_TEST_TOKENIZER")
        return Path(gguf), Path(tok_env) if tok_env else None, None
    pytest.skip(f"no test model: install {REGISTRY_NAME!r} or set SPECLIVE_TEST_GGUF/SPECLIVE_TEST_TOKENIZER")


@pytest.fixture(scope="module")
def gguf_and_tok() -> tuple[Path, Tokenizer]:
    gguf, tok_dir, name = _model_paths()
    if tok_dir is None:
        try:
            from speclive.models.convert import tokenizer_dir_for_gguf

            tok_dir = tokenizer_dir_for_gguf(gguf, name)
        except Exception as exc:  # noqa: BLE001
            pytest.skip(f"no tokenizer for {gguf}: {exc}")
    return gguf, Tokenizer.from_pretrained(tok_dir)


@pytest.fixture(scope="module")
def gguf(gguf_and_tok: tuple[Path, Tokenizer]) -> Path:
    return gguf_and_tok[0]


@pytest.fixture(scope="module")
def tok(gguf_and_tok: tuple[Path, Tokenizer]) -> Tokenizer:
    return gguf_and_tok[1]


@pytest.fixture(scope="module")
def backend(gguf: Path, tok: Tokenizer) -> Iterator[LlamaCppBackend]:
    be = LlamaCppBackend(
        gguf, tok, n_ctx=N_CTX, n_threads=THREADS, max_tree_branches=16, cost_prior=cost_curve()
    )
    yield be
    be.close()


@pytest.fixture(scope="module")
def ref(gguf: Path, tok: Tokenizer) -> Iterator[LlamaCppBackend]:
    """A second context whose cache is empty before every evaluation: the "fresh" reference
    (its one state never shares the KV buffer with the states under test)."""
    be = LlamaCppBackend(gguf, tok, n_ctx=N_CTX, n_threads=THREADS, max_states=1, max_tree_branches=1)
    yield be
    be.close()


@pytest.fixture(scope="module")
def prefix(tok: Tokenizer) -> list[int]:
    return tok.chat([{"role": "user", "content": "Write a short poem about the sea."}])


@pytest.fixture(scope="module")
def cont(tok: Tokenizer) -> list[int]:
    """Twelve ordinary continuation tokens."""
    ids = tok.encode(" The waves roll in beneath a silver moon, and gulls cry over the quiet harbor.")
    assert len(ids) >= 12
    return ids[:12]


def fresh(be: LlamaCppBackend, tokens: list[int]) -> np.ndarray:
    """Logits of ``tokens`` evaluated in one batch on an empty state of ``be``."""
    s = be.new_state()
    try:
        return be.extend(s, tokens)
    finally:
        be.release(s)


def assert_close(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    assert got.shape == want.shape, what
    assert got.dtype == np.float32
    diff = np.abs(got.astype(np.float64) - want)
    assert diff.max() <= MAX_TOL, f"{what}: max |diff| {diff.max():.3f} > {MAX_TOL}"
    assert diff.mean() <= MEAN_TOL, f"{what}: mean |diff| {diff.mean():.3f} > {MEAN_TOL}"
    top2 = np.sort(want, axis=-1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > CLEAR_GAP
    same = got.argmax(-1) == want.argmax(-1)
    assert same[clear].all(), f"{what}: argmax differs at rows {np.where(clear & ~same)[0]}"


# ---- basics --------------------------------------------------------------------------------
def test_basic_properties(backend: LlamaCppBackend, tok: Tokenizer) -> None:
    assert backend.kind == "llamacpp"
    assert backend.vocab_size == 49152
    assert tok.vocab_size <= backend.vocab_size  # every tokenizer id is a model id
    assert backend.n_ctx == N_CTX
    # before any measurement the cost model follows the calibrated prior curve t(k)/t(1)
    prior = backend.default_cost_prior()
    assert prior and prior[1] == pytest.approx(1.0) and backend.cost.ratio(4) == pytest.approx(prior[4])
    assert 1.0 < backend.cost.ratio(4) < 4.0  # a 4-token pass costs more than one, less than four
    s = backend.new_state()
    assert isinstance(s, LlamaCppState) and s.tokens == [] and backend.cache_len(s) == 0
    assert backend.extend(s, []).shape == (0, backend.vocab_size)
    backend.release(s)


def test_cost_prior_is_the_callers(gguf: Path, tok: Tokenizer) -> None:
    """The cost model starts from the curve the caller passes, else from ``LLAMACPP_COST_PRIOR``."""
    small = {"n_ctx": 256, "n_threads": THREADS, "max_states": 1, "max_tree_branches": 1}
    with LlamaCppBackend(gguf, tok, **small) as be:
        assert be.default_cost_prior() == LLAMACPP_COST_PRIOR
    with LlamaCppBackend(gguf, tok, cost_prior={1: 1.0, 4: 3.0}, **small) as be:
        assert be.default_cost_prior() == {1: 1.0, 4: 3.0}
        assert be.cost.ratio(4) == pytest.approx(3.0)


def test_load_backend_starts_from_this_machines_own_cost_curve(llama_smol: LlamaCppBackend) -> None:
    """The committed curve is what a backend is built with; ``load_backend`` then replaces it
    with the curve this machine measured (cost_calibration), kept for the next process."""
    from speclive.kept_measurements import read_entries
    from speclive.models.install import speclive_home

    assert cost_curve()
    entries = read_entries(speclive_home() / "cost-curves.json").values()
    name, threads = llama_smol.gguf_path.name, llama_smol.n_threads
    kept = [
        {int(k): v for k, v in e["curve"].items()}
        for e in entries
        if e.get("model") == name and e["settings"].get("threads") == threads
    ]
    mine = llama_smol.default_cost_prior()
    assert mine[1] == 1.0 and any(c == pytest.approx(mine, abs=1e-4) for c in kept)


def test_chain_matches_fresh(
    backend: LlamaCppBackend, ref: LlamaCppBackend, prefix: list[int], cont: list[int]
) -> None:
    s = backend.new_state()
    backend.extend(s, prefix)
    got = backend.extend(s, cont)
    assert got.shape == (12, backend.vocab_size)
    assert s.tokens == prefix + cont and backend.cache_len(s) == len(prefix) + 12
    want = fresh(ref, prefix + cont)[-12:]
    assert_close(got, want, "chain after prefix")
    # a returned array is a copy, not a view of llama.cpp's buffer that the next decode overwrites
    snapshot = got.copy()
    backend.extend(s, cont[:3])
    np.testing.assert_array_equal(got, snapshot)
    backend.release(s)


def test_wrong_context_is_detected(
    backend: LlamaCppBackend, ref: LlamaCppBackend, prefix: list[int], cont: list[int]
) -> None:
    """The tolerance is tight enough to catch a token attending to the wrong context."""
    right = fresh(ref, prefix + cont[:1] + cont[2:5])[-3:]
    wrong = fresh(ref, prefix + cont[:5])[-3:]
    with pytest.raises(AssertionError):
        assert_close(wrong, right)


def test_incremental_matches_batch(
    backend: LlamaCppBackend, ref: LlamaCppBackend, prefix: list[int], cont: list[int]
) -> None:
    s = backend.new_state()
    backend.extend(s, prefix)
    steps = np.concatenate([backend.extend(s, [t]) for t in cont])
    assert s.tokens == prefix + cont and backend.cache_len(s) == len(s.tokens)
    want = fresh(ref, prefix + cont)[-12:]
    assert_close(steps, want, "one token at a time vs one batch")
    backend.release(s)


# ---- trees ---------------------------------------------------------------------------------
# node 0 shared, then three branches: [0, 1, 2], [0, 3, 4, 5], [0, 6]
TREE_PARENTS = [-1, 0, 1, 0, 3, 4, 0]
TREE_PATHS = [[0, 1, 2], [0, 3, 4, 5], [0, 6]]


def _tree_tokens(cont: list[int]) -> list[int]:
    return [cont[0], cont[1], cont[2], cont[5], cont[6], cont[7], cont[9]]


def test_tree_nodes_match_their_branch(
    backend: LlamaCppBackend, ref: LlamaCppBackend, prefix: list[int], cont: list[int]
) -> None:
    toks = _tree_tokens(cont)
    s = backend.new_state()
    backend.extend(s, prefix)
    got = backend.extend(s, toks, TREE_PARENTS)
    assert got.shape == (7, backend.vocab_size)
    assert s.pending == toks and s.tokens == prefix  # a tree is pending until keep()
    assert len(s.branch_seqs) == 3
    for path in TREE_PATHS:
        want = fresh(ref, prefix + [toks[i] for i in path])[-len(path) :]
        assert_close(got[path], want, f"tree branch {path}")
    backend.keep(s, [])
    assert s.tokens == prefix and backend.cache_len(s) == len(prefix)
    backend.release(s)


def test_a_prompt_tail_in_front_of_a_tree_skips_its_rows(
    backend: LlamaCppBackend, ref: LlamaCppBackend, prefix: list[int], cont: list[int]
) -> None:
    """The first verification pass of a request: the prompt's tail as a chain in front of a
    draft tree, with ``skip`` = the tail's length. Only the tree's rows come back (the tail's
    LM head is not computed), they equal the rows of the full pass, and keeping a path keeps
    the tail in the cache."""
    head, tail = prefix[:-6], prefix[-6:]
    toks = _tree_tokens(cont)
    t = len(tail)
    parents = [i - 1 for i in range(t)] + [p + t if p >= 0 else t - 1 for p in TREE_PARENTS]
    s, full = backend.new_state(), backend.new_state()
    for st in (s, full):
        backend.extend(st, head)
    got = backend.extend(s, tail + toks, parents, skip=t)
    want = backend.extend(full, tail + toks, parents)
    assert got.shape == (len(toks), backend.vocab_size) and want.shape[0] == t + len(toks)
    assert_close(got, want[t:], "tree rows after a skipped tail")
    for path in TREE_PATHS:
        branch = fresh(ref, prefix + [toks[i] for i in path])[-len(path) :]
        assert_close(got[path], branch, f"tree branch {path} after a skipped tail")
    backend.keep(s, list(range(t)) + [t + i for i in TREE_PATHS[1]])
    kept = prefix + [toks[i] for i in TREE_PATHS[1]]
    assert s.tokens == kept and backend.cache_len(s) == len(kept)
    assert_close(backend.extend(s, cont[9:11]), fresh(ref, kept + cont[9:11])[-2:], "after keep")
    # a chain with skip: its later rows; skipping every row is refused
    c = backend.new_state()
    assert_close(backend.extend(c, prefix, skip=len(prefix) - 2), fresh(ref, prefix)[-2:], "chain rows")
    with pytest.raises(ValueError, match="skip"):
        backend.extend(c, cont[:2], skip=2)
    assert c.tokens == prefix
    for st in (s, full, c):
        backend.release(st)


def test_tree_too_many_leaves(backend: LlamaCppBackend, prefix: list[int]) -> None:
    s = backend.new_state()
    backend.extend(s, prefix)
    n = backend.max_tree_branches + 1
    with pytest.raises(ValueError, match="max_tree_branches"):
        backend.extend(s, [100 + i for i in range(n)], [-1] * n)
    assert s.pending is None and backend.cache_len(s) == len(prefix)
    ok = backend.extend(s, [100 + i for i in range(n - 1)], [-1] * (n - 1))  # exactly the maximum
    assert ok.shape[0] == n - 1
    backend.keep(s, [3])
    assert s.tokens == prefix + [103] and backend.cache_len(s) == len(prefix) + 1
    backend.release(s)


@pytest.mark.parametrize("path", [[0, 3, 4, 5], [0, 1, 2], [0, 6], [0, 3], [0], []])
def test_keep_then_extend_matches_fresh(
    backend: LlamaCppBackend, ref: LlamaCppBackend, prefix: list[int], cont: list[int], path: list[int]
) -> None:
    toks = _tree_tokens(cont)
    s = backend.new_state()
    backend.extend(s, prefix)
    backend.extend(s, toks, TREE_PARENTS)
    backend.keep(s, path)
    kept = prefix + [toks[i] for i in path]
    assert s.tokens == kept and s.pending is None
    assert backend.cache_len(s) == len(kept)
    more = cont[9:12]
    got = backend.extend(s, more)
    assert_close(got, fresh(ref, kept + more)[-3:], f"keep({path}) then extend")
    # the branch sequences are gone: a second tree on the same state works as well
    backend.extend(s, toks, TREE_PARENTS)
    backend.keep(s, [0, 6])
    assert backend.cache_len(s) == len(kept) + 5
    backend.release(s)


# ---- several states in one pass ----------------------------------------------------------
def assert_same_choices(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Batch-shape numerics only: within ``MAX_TOL`` and the same argmax where it is clear
    (a batch of several sequences moves quantized logits more than ``MEAN_TOL`` on average)."""
    diff = np.abs(got.astype(np.float64) - want)
    assert diff.max() <= MAX_TOL, f"{what}: max |diff| {diff.max():.3f} > {MAX_TOL}"
    top2 = np.sort(want, axis=-1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > CLEAR_GAP
    assert (got.argmax(-1) == want.argmax(-1))[clear].all(), what


def test_extend_many_batches_states_as_if_each_ran_alone(
    backend: LlamaCppBackend, ref: LlamaCppBackend, prefix: list[int], cont: list[int], tok: Tokenizer
) -> None:
    other = tok.chat([{"role": "user", "content": "What is the capital of France?"}])
    toks = _tree_tokens(cont)

    def batch(a_tokens: list[int]):
        a, b, c = backend.new_state(), backend.new_state(), backend.new_state()
        backend.extend(a, prefix)
        backend.extend(b, other)
        calls = backend.forward_calls
        # a chain after one prompt, a tree after another, a chain on an empty state
        got = backend.extend_many([(a, a_tokens, None), (b, toks, TREE_PARENTS), (c, other[:5], None)])
        assert backend.forward_calls == calls + 1  # one llama.cpp decode for all three
        return got, (a, b, c)

    # no token sees another state's cells: other content in one pass changes no row of the others
    probe, states = batch([11, 22, 33, 44])
    for s in states:
        backend.release(s)
    got, (a, b, c) = batch(cont[:4])
    assert [g.shape[0] for g in got] == [4, 7, 5]
    np.testing.assert_array_equal(probe[1], got[1])
    np.testing.assert_array_equal(probe[2], got[2])
    assert_same_choices(got[0], fresh(ref, prefix + cont[:4])[-4:], "chain in a batch")
    for path in TREE_PATHS:
        want = fresh(ref, other + [toks[i] for i in path])[-len(path) :]
        assert_same_choices(got[1][path], want, f"tree branch {path} in a batch")
    assert_same_choices(got[2], fresh(ref, other[:5]), "empty state in a batch")
    # each state's cache is its own: a chain committed, a tree pending until keep()
    assert a.tokens == prefix + cont[:4] and b.pending == toks and c.tokens == other[:5]
    # a shared decode's time is no state's own; a pass alone is timed
    assert a.pass_s is None and b.pass_s is None and c.pass_s is None
    backend.extend(c, other[5:7])
    assert c.pass_s is not None and c.pass_s > 0
    backend.keep(b, [0, 3, 4])
    kept = other + [toks[0], toks[3], toks[4]]
    more = cont[9:11]
    after = backend.extend_many([(a, more, None), (b, more, None)])
    assert_same_choices(after[0], fresh(ref, prefix + cont[:4] + more)[-2:], "a after the batch")
    assert_same_choices(after[1], fresh(ref, kept + more)[-2:], "b after keep")
    assert backend.cache_len(b) == len(kept) + 2
    for s in (a, b, c):
        backend.release(s)


def test_extend_many_computes_only_the_last_row_of_a_prompt_chunk(
    backend: LlamaCppBackend, ref: LlamaCppBackend, prefix: list[int], cont: list[int], tok: Tokenizer
) -> None:
    """A prompt chunk riding in one decode with another state's pass: its last row only (the
    others are neither computed nor copied), its cache as if it ran alone."""
    other = tok.chat([{"role": "user", "content": "What is the capital of France?"}])
    a, b = backend.new_state(), backend.new_state()
    backend.extend(a, prefix)
    calls = backend.forward_calls
    got = backend.extend_many([(a, cont[:3], None), (b, other, None)], skip=[0, len(other) - 1])
    assert backend.forward_calls == calls + 1  # one llama.cpp decode for both
    assert [g.shape[0] for g in got] == [3, 1]
    assert_same_choices(got[0], fresh(ref, prefix + cont[:3])[-3:], "full pass beside a last-only one")
    assert_same_choices(got[1], fresh(ref, other)[-1:], "last-only pass")
    assert b.tokens == other
    after = backend.extend(b, [cont[0]])
    assert_same_choices(after, fresh(ref, other + [cont[0]])[-1:], "after the last-only pass")
    # alone (a state twice cannot share one batch): the same rows
    got = backend.extend_many([(a, [5], None), (a, [6, 7], None)], skip=[0, 1])
    assert [g.shape[0] for g in got] == [1, 1] and a.tokens == prefix + cont[:3] + [5, 6, 7]
    for s in (a, b):
        backend.release(s)


def test_extend_many_gives_a_failing_pass_its_own_error(backend: LlamaCppBackend, prefix: list[int]) -> None:
    a, b, c = backend.new_state(), backend.new_state(), backend.new_state()
    backend.extend(a, prefix)
    calls = backend.forward_calls
    got = backend.extend_many([(a, [5, 6], None), (b, [backend.vocab_size], None), (c, [7, 8, 9], None)])
    assert isinstance(got[1], ValueError) and "out of range" in str(got[1])
    assert backend.forward_calls == calls + 1  # the two good passes still ran together
    assert [g.shape[0] for g in (got[0], got[2])] == [2, 3]
    assert a.tokens == prefix + [5, 6] and b.tokens == [] and c.tokens == [7, 8, 9]
    # passes that cannot share one batch (one state twice) run one after the other
    got = backend.extend_many([(a, [5], None), (a, [6], None)])
    assert [g.shape[0] for g in got] == [1, 1] and a.tokens == prefix + [5, 6, 5, 6]
    for s in (a, b, c):
        backend.release(s)


# ---- truncate, fork, states ----------------------------------------------------------------
def test_truncate_then_extend_matches_fresh(
    backend: LlamaCppBackend, ref: LlamaCppBackend, prefix: list[int], cont: list[int]
) -> None:
    s = backend.new_state()
    backend.extend(s, prefix + cont)
    backend.truncate(s, len(prefix) + 4)
    assert backend.cache_len(s) == len(prefix) + 4
    other = cont[8:12] + cont[:2]
    got = backend.extend(s, other)
    assert_close(got, fresh(ref, prefix + cont[:4] + other)[-6:], "truncate then extend")
    backend.truncate(s, 0)
    assert s.tokens == [] and backend.cache_len(s) == 0
    assert_close(backend.extend(s, cont), fresh(ref, cont), "after truncate(0)")
    backend.release(s)


def test_truncate_drops_pending_tree(
    backend: LlamaCppBackend, ref: LlamaCppBackend, prefix: list[int], cont: list[int]
) -> None:
    s = backend.new_state()
    backend.extend(s, prefix)
    backend.extend(s, _tree_tokens(cont), TREE_PARENTS)
    backend.truncate(s, len(prefix) - 2)
    assert s.pending is None and backend.cache_len(s) == len(prefix) - 2
    assert_close(backend.extend(s, cont[:3]), fresh(ref, prefix[:-2] + cont[:3])[-3:], "truncate+tree")
    backend.release(s)


def test_fork_shares_prefix_and_is_independent(
    backend: LlamaCppBackend, ref: LlamaCppBackend, prefix: list[int], cont: list[int]
) -> None:
    a = backend.new_state()
    backend.extend(a, prefix)
    b = backend.fork(a)
    assert b.tokens == prefix and b.seq != a.seq and backend.cache_len(b) == len(prefix)
    la = backend.extend(a, cont[:4])
    lb = backend.extend(b, cont[6:9])
    backend.extend(b, _tree_tokens(cont), TREE_PARENTS)  # a tree on b leaves a alone
    backend.keep(b, [0, 6])
    backend.truncate(a, len(prefix) + 2)
    assert_close(la, fresh(ref, prefix + cont[:4])[-4:], "fork: source")
    assert_close(lb, fresh(ref, prefix + cont[6:9])[-3:], "fork: copy")
    got_b = backend.extend(b, cont[:2])
    want_b = fresh(ref, prefix + cont[6:9] + [cont[0], cont[9]] + cont[:2])[-2:]
    assert_close(got_b, want_b, "fork: copy after its tree")
    assert_close(backend.extend(a, cont[2:4]), la[2:4], "fork: source after truncate")
    backend.release(a)
    backend.release(b)


def _history(be: LlamaCppBackend, s: LlamaCppState, prefix: list[int], cont: list[int]) -> np.ndarray:
    """A state's life in small steps (prefill, a chain, a tree and its kept path, a rollback);
    the logits of its last step."""
    be.extend(s, prefix[:-1], last_only=True)
    be.extend(s, [prefix[-1], *cont[:3]])
    be.extend(s, _tree_tokens(cont), TREE_PARENTS)
    be.keep(s, [0, 3, 4])
    be.truncate(s, len(prefix) + 2)
    return be.extend(s, cont[4:8])


def test_a_states_logits_do_not_depend_on_the_cells_of_other_states(
    backend: LlamaCppBackend, prefix: list[int], cont: list[int]
) -> None:
    # the same calls on a state, alone in the KV buffer and then beside another state's cells
    # (its home and its cells elsewhere), give the same logits bit for bit
    a = backend.new_state()
    alone = _history(backend, a, prefix, cont)
    backend.release(a)
    other = backend.new_state()
    backend.extend(other, list(range(100, 400)), last_only=True)
    b = backend.new_state()
    beside = _history(backend, b, prefix, cont)
    backend.release(b)
    backend.release(other)
    assert np.array_equal(alone, beside), f"max |diff| {np.abs(alone - beside).max():.3g}"


def test_eviction_and_sequential_states(gguf: Path, tok: Tokenizer, prefix: list[int]) -> None:
    with LlamaCppBackend(gguf, tok, n_ctx=256, n_threads=THREADS, max_states=2, max_tree_branches=4) as be:
        s1 = be.new_state()
        be.extend(s1, prefix)
        s2 = be.new_state()
        be.extend(s2, prefix[:5])
        be.extend(s1, [100])  # s1 is now the most recently used one
        s3 = be.new_state()  # evicts s2
        assert s2.evicted and s2.seq < 0 and not s1.evicted
        with pytest.raises(RuntimeError, match="evicted"):
            be.extend(s2, [1])
        be.extend(s3, prefix)
        assert be.cache_len(s1) == len(prefix) + 1 and be.cache_len(s3) == len(prefix)
        be.truncate(s2, 0)  # a reset state is usable again (evicting the least recent, s1)
        be.extend(s2, prefix[:3])
        assert s1.evicted and be.cache_len(s2) == 3
        # dropped states give their sequence back without release()
        del s2, s3
        gc.collect()
        s4 = be.new_state()
        s5 = be.new_state()
        assert {s4.seq, s5.seq} == {0, 1} and not s4.evicted
        assert be.cache_len(s4) == be.cache_len(s5) == 0
        # a released state can be used again
        be.extend(s4, prefix)
        be.release(s4)
        assert s4.tokens == [] and s4.seq < 0
        be.extend(s4, prefix[:4])
        assert be.cache_len(s4) == 4


def test_a_parked_state_is_evicted_first(gguf: Path, tok: Tokenizer, prefix: list[int]) -> None:
    """``park``: a parked state gives its home up first, even when it was used last; any use
    (or ``unpark``) makes it an ordinary state again."""
    with LlamaCppBackend(gguf, tok, n_ctx=256, n_threads=THREADS, max_states=2, max_tree_branches=2) as be:
        old, parked = be.new_state(), be.new_state()
        be.extend(old, prefix[:4])
        be.extend(parked, prefix)
        be.park(parked)
        be.new_state()  # needs a home: the parked state's, not the least recently used one's
        assert parked.evicted and not old.evicted and be.cache_len(old) == 4
        be.release(parked)
        assert not parked.parked and not parked.evicted
        a, b = be.new_state(), be.new_state()
        be.extend(a, prefix[:3])
        be.extend(b, prefix[:3])
        be.park(b)
        be.extend(b, [5])  # used again: no longer parked, so a (least recent) gives way
        be.new_state()
        assert a.evicted and not b.evicted


def test_an_offloaded_parked_state_frees_its_cells_and_comes_back_with_the_same_logits(
    gguf: Path, tok: Tokenizer, prefix: list[int]
) -> None:
    """``offload_parked``: ``park`` copies the state's cells to host memory and frees them and
    its home; its next use, or a fork of it, writes the copy back: the same keys and values, so
    the same logits as before it was parked, with nothing prefilled again."""
    with LlamaCppBackend(gguf, tok, n_ctx=256, n_threads=THREADS, max_states=2, max_tree_branches=2) as be:
        be.offload_parked = True
        n_free = be.n_cells - len(prefix)
        s = be.new_state()
        be.extend(s, prefix)
        want = be.extend(s, [7])
        be.truncate(s, len(prefix))
        be.park(s)
        assert s.seq < 0 and s.saved is not None and be.offloads == 1 and be.cache_len(s) == 0
        # its cells are free: another state fills all of them, and it had both homes
        other, third = be.new_state(), be.new_state()
        be.extend(other, [5] * (n_free + len(prefix) - 1), last_only=True)
        assert not s.evicted
        with pytest.raises(ContextOverflowError):  # no room to write it back (restore_evicted off)
            be.fork(s)
        with pytest.raises(ContextOverflowError):
            be.extend(s, [7])
        assert s.saved is not None and s.seq < 0  # still offloaded: usable once there is room
        be.release(other)
        be.release(third)
        fork = be.fork(s)  # written into the fork's home; the parked state stays in host memory
        assert s.seq < 0 and s.saved is not None and be.reloads == 1
        assert np.array_equal(be.extend(fork, [7]), want)
        got = be.extend(s, [7])  # its own use writes it back and ends the parking
        assert be.reloads == 2 and s.saved is None and not s.parked and be.cache_len(s) == len(prefix) + 1
        assert np.array_equal(got, want)
        # with restore_evicted, writing it back evicts the least recently used state for cells
        be.restore_evicted = True
        be.release(fork)
        be.truncate(s, len(prefix))
        be.park(s)
        other = be.new_state()
        be.extend(other, [5] * (n_free + len(prefix) - 1), last_only=True)
        assert np.array_equal(be.extend(s, [7]), want)
        assert other.evicted and be.cell_evictions == 1
        be.park(s)
        be.release(s)  # a released offloaded state drops its copy
        assert s.saved is None and not s.tokens


def test_offloaded_copies_stay_within_the_size_of_the_kv_buffer(gguf: Path, tok: Tokenizer) -> None:
    """Host memory for parked states is bounded as the cells are: a state whose copy would take
    the copies past the KV buffer's size stays parked in its cells."""
    with LlamaCppBackend(gguf, tok, n_ctx=256, n_threads=THREADS, max_states=3, max_tree_branches=2) as be:
        be.offload_parked = True
        a, b = be.new_state(), be.new_state()
        be.extend(a, [5] * 200, last_only=True)
        be.park(a)
        be.extend(b, [6] * 60, last_only=True)
        be.park(b)  # 260 tokens' copies > 256 cells
        assert a.saved is not None and a.seq < 0
        assert b.saved is None and b.seq >= 0 and b.parked and be.offloads == 1
        be.release(a)
        be.park(b)  # room again
        assert b.saved is not None and b.seq < 0 and be.offloads == 2


def test_a_chats_next_turn_on_its_parked_state_is_what_a_new_state_gives_on_the_same_calls(
    backend: LlamaCppBackend, tok: Tokenizer
) -> None:
    """The prompt cache's machinery is exact: the next turn of a conversation, started from the
    parked state of its first turn, gets the logits a new state gets from the same calls. (A
    fresh prefill of the whole conversation differs only by the batch shapes of its chunks.)"""
    cache = PromptCache(backend, 2)
    with CallRecorder(backend) as rec:
        chat = [{"role": "user", "content": "Name three prime numbers."}]
        dec = make_decoder(backend)
        first = dec.run(tok.chat(chat), GenerationConfig(max_tokens=12))
        cache.park(dec.state)
        dec.close(release_state=False)
        chat += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And why?"}]
        prompt = tok.chat(chat)
        state = cache.take(prompt)
        assert state is dec.state and len(state.tokens) > len(prompt) // 2
        nxt = make_decoder(backend, state=state)
        nxt.run(prompt, GenerationConfig(max_tokens=3))
        nxt.close()
    row = rec.replay(state)
    assert row is not None and np.array_equal(row, rec.last[id(state)])


def test_an_evicted_state_is_restored_on_use_when_asked(
    gguf: Path, tok: Tokenizer, prefix: list[int]
) -> None:
    with LlamaCppBackend(
        gguf, tok, n_ctx=256, n_threads=THREADS, max_states=1, max_tree_branches=2, restore_evicted=True
    ) as be:
        s1 = be.new_state()
        want = be.extend(s1, prefix)
        s2 = be.new_state()  # evicts s1
        be.extend(s2, prefix[:3])
        assert s1.evicted and be.restores == 0
        got = be.extend(s1, [7])  # restored: the prefix again, then the new token
        assert be.restores == 1 and not s1.evicted and s2.evicted and be.cache_len(s1) == len(prefix) + 1
        ref = be.new_state()  # evicts s1 again: a fresh evaluation of the same tokens
        assert_close(got, be.extend(ref, prefix + [7])[-1:], "restored state")
        assert_close(want[-1:], be.extend(be.new_state(), prefix)[-1:], "fresh state")


def test_single_state_backend(
    gguf: Path, tok: Tokenizer, backend: LlamaCppBackend, prefix: list[int]
) -> None:
    """max_states=1: each new state replaces the previous one; fork has no room."""
    with LlamaCppBackend(gguf, tok, n_ctx=256, n_threads=THREADS, max_states=1, max_tree_branches=2) as be:
        s1 = be.new_state()
        be.extend(s1, prefix[:4])
        with pytest.raises(RuntimeError, match="max_states=1"):
            be.fork(s1)
        assert not s1.evicted and be.cache_len(s1) == 4
        s2 = be.new_state()
        assert s1.evicted and s2.seq == 0 and be.cache_len(s2) == 0
        with pytest.raises(RuntimeError, match="another backend"):
            backend.extend(s2, [1])
        be.extend(s2, prefix[:2])
        be.release(s1)  # releasing an evicted state leaves the current one alone
        assert be.cache_len(s2) == 2


def test_chunks_beyond_n_batch(
    gguf: Path, tok: Tokenizer, ref: LlamaCppBackend, prefix: list[int], cont: list[int]
) -> None:
    """Extensions longer than n_batch are decoded in several calls, chains and trees alike."""
    with LlamaCppBackend(gguf, tok, n_ctx=256, n_threads=THREADS, n_batch=5) as small:
        s = small.new_state()
        got = small.extend(s, prefix + cont)
        assert_close(got, fresh(ref, prefix + cont), "chunked chain")
        small.truncate(s, len(prefix))
        toks = _tree_tokens(cont)
        tree = small.extend(s, toks, TREE_PARENTS)  # 7 nodes: decoded as 5 + 2
        for path in TREE_PATHS:
            want = fresh(ref, prefix + [toks[i] for i in path])[-len(path) :]
            assert_close(tree[path], want, f"chunked tree branch {path}")
        small.keep(s, [0, 3, 4])
        assert small.cache_len(s) == len(prefix) + 3
        want = fresh(ref, s.tokens + cont[:2])[-2:]
        assert_close(small.extend(s, cont[:2]), want, "chunked keep")


# ---- greedy generation vs llama-cpp-python's own --------------------------------------------
PROMPTS = [
    "Write a short poem about the sea.",
    "What is the capital of France?",
    "Explain recursion to a child.",
]


@pytest.mark.parametrize("question", PROMPTS)
def test_greedy_matches_llama_cpp_python(
    backend: LlamaCppBackend, tok: Tokenizer, gguf: Path, question: str
) -> None:
    ids = tok.chat([{"role": "user", "content": question}])
    s = backend.new_state()
    logits = backend.extend(s, ids)[-1]
    ours: list[int] = []
    gaps: list[float] = []
    for _ in range(32):
        top2 = np.sort(logits)[-2:]
        gaps.append(float(top2[1] - top2[0]))
        ours.append(int(np.argmax(logits)))
        logits = backend.extend(s, ours[-1:])[0]
    backend.release(s)
    theirs = llama_reference_greedy(gguf, ids, 32, n_threads=THREADS, n_ctx=N_CTX)
    assert len(theirs) == 32
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if a != b:
            assert gaps[i] < 0.05, f"token {i}: {a} vs {b} with a clear top-2 gap {gaps[i]:.3f}"
            break


# ---- overflow ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small(gguf: Path, tok: Tokenizer) -> Iterator[LlamaCppBackend]:
    """A short context (decoded in chunks of 64) for the overflow tests."""
    be = LlamaCppBackend(gguf, tok, n_ctx=256, n_threads=THREADS, n_batch=64, max_tree_branches=4)
    yield be
    be.close()


def test_passes_beyond_one_batch_are_packed_into_as_few_decodes_as_fit(
    small: LlamaCppBackend, prefix: list[int], cont: list[int]
) -> None:
    """Three passes of 30 tokens on n_batch = 64: two share a decode, the third has its own
    (not three decodes); a pass longer than a batch runs alone, in chunks; every result is
    the one it would have alone."""
    body = (prefix * 4)[:90]
    a, b, c, d = (small.new_state() for _ in range(4))
    calls = small.forward_calls
    got = small.extend_many(
        [(a, body[:30], None), (b, body[30:60], None), (c, body[60:90], None)], skip=[29, 0, 0]
    )
    assert small.forward_calls == calls + 2
    assert [g.shape[0] for g in got] == [1, 30, 30]
    assert_close(got[0], fresh(small, body[:30])[-1:], "first of a packed pair")
    assert_close(got[1], fresh(small, body[30:60]), "second of a packed pair")
    assert_close(got[2], fresh(small, body[60:90]), "the pass in a decode of its own")
    got = small.extend_many([(d, body[:70], None), (a, cont[:3], None), (b, cont[:3], None)])
    assert [g.shape[0] for g in got] == [70, 3, 3] and d.tokens == body[:70]
    assert_close(got[1], fresh(small, body[:30] + cont[:3])[-3:], "after the long pass")
    for st in (a, b, c, d):
        small.release(st)


def test_context_overflow(small: LlamaCppBackend, prefix: list[int]) -> None:
    n_ctx = small.n_ctx
    s = small.new_state()
    fill = (prefix * (n_ctx // len(prefix) + 1))[: n_ctx - 4]
    small.extend(s, fill)
    with pytest.raises(ContextOverflowError):
        small.extend(s, prefix[:5])
    with pytest.raises(ContextOverflowError):
        small.extend(s, [1, 2, 3, 4, 5], [-1, 0, 0, 0, 0])
    assert len(s.tokens) == n_ctx - 4 and small.cache_len(s) == n_ctx - 4 and s.pending is None
    small.extend(s, prefix[:4])  # exactly full is fine
    with pytest.raises(ContextOverflowError):
        small.extend(s, [1])
    small.release(s)


def test_states_share_the_context_cells(small: LlamaCppBackend, prefix: list[int]) -> None:
    """States that fit alone but not together: llama.cpp runs out of cells -> overflow error."""
    n = small.n_cells // 2 + 20
    assert n <= small.n_ctx
    fill = (prefix * (n // len(prefix) + 1))[:n]
    a = small.new_state()
    b = small.new_state()
    small.extend(a, fill)
    with pytest.raises(ContextOverflowError, match="shared by all its states"):
        small.extend(b, fill[::-1])  # fails in its second chunk: the first one is taken out again
    assert b.tokens == [] and small.cache_len(b) == 0
    assert small.cache_len(a) == n and not a.evicted and small.cell_evictions == 0
    with pytest.raises(ContextOverflowError):
        small.extend(b, fill[::-1], last_only=True)  # a prefill that asked for one row only
    small.release(a)
    got = small.extend(b, fill[::-1])  # fits once a is gone; every row's logits again
    small.release(b)
    assert_close(got, fresh(small, fill[::-1]), "after failed decodes")


def _restoring(gguf: Path, tok: Tokenizer) -> LlamaCppBackend:
    """Three states on 256 KV cells, evicted states restored on use (as in the server)."""
    kw = dict(n_ctx=256, n_batch=64, max_states=3, max_tree_branches=2)
    return LlamaCppBackend(gguf, tok, n_threads=THREADS, restore_evicted=True, **kw)


def test_a_cell_shortage_evicts_the_least_recent_state_when_restoring(
    gguf: Path, tok: Tokenizer, prefix: list[int]
) -> None:
    """With ``restore_evicted`` (the server), states that fit alone but not together do not
    fail: the least recently used other state gives its cells up and is prefilled again when
    its owner next uses it, with the logits of a fresh evaluation."""
    with _restoring(gguf, tok) as be:
        assert be.n_cells == 256
        fill = (prefix * 20)[:150]
        a, b, c = be.new_state(), be.new_state(), be.new_state()
        be.extend(a, fill, last_only=True)  # prefills: the logits of their last row only
        be.extend(c, prefix[:8])
        # 150 + 8 + 150 cells do not fit: a, the least recently used, gives way (b's decode
        # fails in a later chunk, its earlier chunks are taken out and it runs again)
        be.extend(b, fill[::-1], last_only=True)
        assert a.evicted and a.seq < 0 and be.cell_evictions == 1
        assert not c.evicted and be.cache_len(c) == 8 and be.cache_len(b) == 150
        got = be.extend(a, [7])  # restored: c, then b (least recent first) give way
        assert not a.evicted and be.restores == 1 and be.cache_len(a) == 151
        assert c.evicted and b.evicted and be.cell_evictions == 3
        want = be.extend(be.new_state(), fill + [7], last_only=True)
        assert_close(got, want, "restored after a cell shortage")


def test_a_batch_under_a_cell_shortage_evicts_none_of_its_own(
    gguf: Path, tok: Tokenizer, prefix: list[int]
) -> None:
    """``extend_many``: the states of one batch are never evicted for each other; a state
    outside the batch gives way, even when it was used more recently than theirs."""
    with _restoring(gguf, tok) as be:
        assert be.n_cells == 256
        body = (prefix * 20)[:200]
        a, b, c = be.new_state(), be.new_state(), be.new_state()
        be.extend(a, body[:60], last_only=True)
        be.extend(b, body[60:120], last_only=True)
        be.extend(c, body[:120], last_only=True)  # the most recent, and only 16 cells are left free
        calls = be.forward_calls
        out = be.extend_many([(a, body[120:140], None), (b, body[140:160], None)])
        assert all(isinstance(x, np.ndarray) for x in out)
        assert be.forward_calls == calls + 1, "the two passes ran as one batch"
        assert c.evicted and not a.evicted and not b.evicted and be.cell_evictions == 1
        assert be.cache_len(a) == 80 and be.cache_len(b) == 80
        be.release(b)
        assert_close(out[0], be.extend(be.new_state(), body[:60] + body[120:140])[60:], "a in the batch")


_FULL_BATCH = """
import sys
from speclive.backends.llamacpp import LlamaCppBackend
from speclive.server.memory import resident_bytes as resident
from speclive.tokenizer import Tokenizer
gguf, tok_dir, reserve, threads = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
be = LlamaCppBackend(gguf, Tokenizer.from_pretrained(tok_dir), n_ctx=512, n_threads=threads, max_states=2)
if reserve:
    be.reserve_memory()
body = [100 + i % 500 for i in range(be.n_batch)]
before = resident()
be.extend(be.new_state(), body)  # every row's logits: the widest outputs there are
print(resident() - before, be.n_batch * be.vocab_size * 4)
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc/self/statm")
def test_reserve_memory_leaves_a_full_batch_no_memory_to_take(gguf: Path) -> None:
    """Without the reservation, the first batch with a logits row for each of its n_batch
    tokens makes llama.cpp's logits and compute buffers resident (96 MiB of logits alone for a
    49k vocabulary); after it, that batch finds them resident already. Each case runs in a
    fresh process, whose resident size no earlier test has touched."""
    import subprocess
    import sys

    _, tok_dir, name = _model_paths()
    if tok_dir is None:
        from speclive.models.convert import tokenizer_dir_for_gguf

        tok_dir = tokenizer_dir_for_gguf(gguf, name)
    grew = {}
    for reserve in (False, True):
        args = [str(gguf), str(tok_dir), "1" if reserve else "0", str(THREADS)]
        out = subprocess.run(
            [sys.executable, "-c", _FULL_BATCH, *args], capture_output=True, text=True, check=True
        ).stdout.split()
        grew[reserve], logits_buffer = int(out[-2]), int(out[-1])
    assert grew[False] > 0.8 * logits_buffer, grew
    assert grew[True] < 0.1 * logits_buffer, grew


def test_reserve_memory_refuses_to_clear_a_cache_in_use(
    gguf: Path, tok: Tokenizer, prefix: list[int]
) -> None:
    be = LlamaCppBackend(gguf, tok, n_ctx=N_CTX, n_threads=THREADS, max_states=2)
    try:
        be.reserve_memory()  # nothing cached yet: the KV buffer is written once
        s = be.new_state()
        be.extend(s, prefix)
        with pytest.raises(RuntimeError, match="clear states"):
            be.reserve_memory()
        assert s.tokens == prefix and be.cache_len(s) == len(prefix)
    finally:
        be.close()
