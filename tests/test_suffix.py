"""Suffix datastore, retrieval trees and their selection: checked against brute force.

No model needed except for the tokenizer checks (SmolLM2's and Qwen's tokenizers, both in the
offline bundle).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from speclive.drafting.datastore import SEP, DatastoreError, SuffixDatastore, tokenizer_fingerprint
from speclive.drafting.retrieval import Calibrator, Candidates, RequestIndex, count_tree, top_nodes


def _brute_match(corpus: list[list[int]], ctx: list[int], max_len: int) -> tuple[int, list[tuple[int, int]]]:
    """Longest suffix of ctx (<= max_len) occurring in a document, and (doc, end) of every hit."""
    for ell in range(min(max_len, len(ctx)), 0, -1):
        pat = ctx[-ell:]
        hits = [
            (d, i + ell - 1)
            for d, doc in enumerate(corpus)
            for i in range(len(doc) - ell + 1)
            if doc[i : i + ell] == pat
        ]
        if hits:
            return ell, hits
    return 0, []


def _random_corpus(rng, n_docs=12, vocab=6, lo=5, hi=60):
    return [rng.integers(0, vocab, rng.integers(lo, hi)).tolist() for _ in range(n_docs)]


@pytest.mark.parametrize("seed", range(6))
def test_match_and_continuations_equal_brute_force(seed):
    rng = np.random.default_rng(seed)
    corpus = _random_corpus(rng, vocab=3 + seed)
    ds = SuffixDatastore.from_documents(corpus, max_depth=8)
    for _ in range(60):
        ctx = rng.integers(0, 3 + seed, rng.integers(1, 14)).tolist()
        m = ds.match(ctx)
        ell, hits = _brute_match(corpus, ctx, 8)
        assert m.length == ell, (ctx, m, ell)
        assert m.count == len(hits)
        conts = ds.continuations(m, 4, max_samples=10_000)
        got = sorted(tuple(int(x) for x in row) for row in conts)
        want = []
        for d, end in hits:
            seg = corpus[d][end + 1 : end + 5]
            want.append(tuple(seg + [SEP] * (4 - len(seg))))
        assert got == sorted(want)


def test_continuations_stop_at_document_ends_and_sample():
    ds = SuffixDatastore.from_documents([[1, 2, 3], [1, 2], [9, 1, 2, 7, 7, 7]], max_depth=4)
    m = ds.match([5, 1, 2])
    assert m.length == 2 and m.count == 3
    rows = sorted(tuple(r) for r in ds.continuations(m, 3).tolist())
    assert rows == sorted([(3, SEP, SEP), (7, 7, 7), (SEP, SEP, SEP)])
    assert len(ds.continuations(m, 3, max_samples=2)) == 2
    assert ds.match([42]).length == 0


def test_request_index_longest_match_and_all_its_occurrences():
    idx = RequestIndex(min_n=2, max_len=16)
    ctx = [1, 2, 3, 9, 1, 2, 3, 8, 5, 2, 3, 7, 1, 2, 3]
    idx.reset(ctx)
    length, conts = idx.lookup(3)
    assert length == 3  # "1 2 3" occurs twice before the end
    assert sorted(tuple(r) for r in conts.tolist()) == [(8, 5, 2), (9, 1, 2)]
    idx.sync(ctx + [9])  # grows incrementally
    assert idx.lookup(2)[0] == 4
    idx.sync([4, 4])  # rewritten context: rebuilt
    assert idx.ctx == [4, 4]


def test_count_tree_and_frequency_pruning():
    conts = np.array([[1, 2, 3], [1, 2, 4], [1, 2, 3], [5, SEP, SEP], [1, 6, SEP]], dtype=np.int32)
    t = count_tree(conts)
    paths = {}
    for i in range(len(t)):
        p, path = i, []
        while p >= 0:
            path.append(int(t.tokens[p]))
            p = int(t.parents[p])
        paths[tuple(path[::-1])] = t.counts[i]
    assert {k: float(v) for k, v in paths.items()} == {
        (1,): 4,
        (5,): 1,
        (1, 2): 3,
        (1, 6): 1,
        (1, 2, 3): 2,
        (1, 2, 4): 1,
    }
    assert t.total == 5
    keep = top_nodes(t, 3)
    assert len(keep) == 3
    assert all(t.parents[i] < 0 or t.parents[i] in keep for i in keep)
    assert {int(t.tokens[i]) for i in keep if t.parents[i] < 0} == {1}
    probs = t.edge_probs(prior=1.0)
    assert probs[int(np.flatnonzero((t.tokens == 1) & (t.parents < 0))[0])] == pytest.approx(4 / 6)


def test_candidates_fuse_by_prefix_and_select_by_cost():
    c = Candidates()
    c.add([1, 2, 3], [-1, 0, 1], [0.9, 0.8, 0.7], [0.9, 0.9, 0.9], "a", "request")
    c.add([1, 2, 5, 6], [-1, 0, 1, -1], [0.5, 0.5, 0.4, 0.3], [0.5, 1, 0.8, 0.3], "b", "global")
    assert len(c) == 5  # 1-2 shared, 3 and 5 siblings, 6 a second root child
    flat = c.select(10, lambda k: 1.0, min_gain=1.0)[0]
    assert flat == [0, 1, 2, 3, 4]  # free verification: take everything
    steep = c.select(10, lambda k: float(k), min_gain=1.0)[0]
    # linear cost: a node pays only with probability >= ~1, none here does
    assert steep == []
    assert c.select(10, lambda k: float(k), min_gain=1.0, force=2)[0] == [0, 1]
    one_leaf = c.select(10, lambda k: 1.0, max_leaves=1)[0]
    assert one_leaf == [0, 1, 2]
    tree = c.tree([0, 1, 2])
    assert tree.tokens == [1, 2, 3] and tree.parents == [-1, 0, 1]
    assert tree.sources == ["request"] * 3


def test_calibrator_learns_ratio():
    cal = Calibrator(ema=0.5)
    assert cal.scale("x") == 1.0
    for _ in range(20):
        cal.update({"x": 2.0}, {"x": 0.5})
    assert cal.scale("x") == pytest.approx(0.25, abs=0.02)


# ---------------------------------------------------------------------------------- files
@pytest.fixture(scope="module")
def smol_tok():
    from speclive.loader import tokenizer_for
    from speclive.models.resolve import resolve

    return tokenizer_for(resolve("smollm2-135m-instruct"))


def _store(tok) -> SuffixDatastore:
    docs = [tok.encode("def add(a, b):\n    return a + b\n"), tok.encode("Hello world, hello datastore.")]
    return SuffixDatastore.from_documents(
        docs, meta={"model": "smol", "tokenizer": tokenizer_fingerprint(tok)}
    )


def test_save_load_roundtrip(tmp_path, smol_tok):
    ds = _store(smol_tok)
    p = ds.save(tmp_path / "ds.npz")
    back = SuffixDatastore.load(p, smol_tok)
    assert np.array_equal(back.tokens, ds.tokens) and np.array_equal(back.rsa, ds.rsa)
    ctx = smol_tok.encode("x = 1\ndef add(a, b):\n    return")
    assert back.match(ctx).length == ds.match(ctx).length >= 5


def test_corrupt_datastore_is_a_clear_error(tmp_path, smol_tok):
    p = _store(smol_tok).save(tmp_path / "ds.npz")
    raw = bytearray(p.read_bytes())
    bad = tmp_path / "truncated.npz"
    bad.write_bytes(bytes(raw[: len(raw) // 2]))
    with pytest.raises(DatastoreError, match="corrupt"):
        SuffixDatastore.load(bad, smol_tok)
    # same size, one token changed: the checksum catches it
    with np.load(p) as z:
        tokens, rsa, meta = z["tokens"].copy(), z["rsa"], z["meta"]
    tokens[0] += 1
    flipped = tmp_path / "flipped.npz"
    with open(flipped, "wb") as fh:
        np.savez(fh, tokens=tokens, rsa=rsa, meta=meta)
    with pytest.raises(DatastoreError, match="checksum"):
        SuffixDatastore.load(flipped, smol_tok)
    junk = tmp_path / "junk.npz"
    junk.write_text("not a datastore")
    with pytest.raises(DatastoreError, match="corrupt"):
        SuffixDatastore.load(junk)
    with pytest.raises(DatastoreError, match="not found"):
        SuffixDatastore.load(tmp_path / "missing.npz")


def test_other_tokenizer_is_refused(tmp_path, smol_tok):
    from speclive.loader import tokenizer_for
    from speclive.models.resolve import resolve

    qwen = tokenizer_for(resolve("qwen2.5-coder-0.5b-instruct"))
    p = _store(smol_tok).save(tmp_path / "ds.npz")
    with pytest.raises(DatastoreError, match="another tokenizer"):
        SuffixDatastore.load(p, qwen)


def test_memory_budget_and_empty_corpus(tmp_path, smol_tok):
    p = _store(smol_tok).save(tmp_path / "ds.npz")
    with pytest.raises(DatastoreError, match="over the budget"):
        SuffixDatastore.load(p, smol_tok, max_bytes=1000)
    with pytest.raises(DatastoreError, match="empty corpus"):
        SuffixDatastore.from_documents([[], []])


def test_cli_build_info_and_bad_input(tmp_path, capsys):
    from speclive.cli import main

    (tmp_path / "a.py").write_text("def add(a, b):\n    return a + b\n" * 3)
    chats = tmp_path / "chats.jsonl"
    chats.write_text(
        json.dumps(
            {
                "id": "c1",
                "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"}],
            }
        )
        + "\n"
    )
    out = tmp_path / "ds.npz"
    rc = main(
        ["datastore", "build", "--model", "smollm2-135m-instruct", "--corpus", str(tmp_path), "-o", str(out)]
    )
    assert rc == 0 and out.is_file()
    rc = main(["datastore", "info", str(out), "--model", "smollm2-135m-instruct"])
    info = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert rc == 0 and info["n_docs"] == 2 and info["corpus_prompt_ids"] == 1
    assert info["lookup"]["lookups"] > 0
    # wrong tokenizer, over budget, empty corpus: exit code 2 with a message
    assert main(["datastore", "info", str(out), "--model", "qwen2.5-coder-0.5b-instruct"]) == 2
    assert main(["datastore", "info", str(out), "--max-mb", "0.001"]) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "e.txt").write_text("   \n")
    assert (
        main(
            [
                "datastore",
                "build",
                "--model",
                "smollm2-135m-instruct",
                "--corpus",
                str(empty),
                "-o",
                str(tmp_path / "e.npz"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "another tokenizer" in err and "budget" in err and "empty corpus" in err


def _answer_doc(pid: str, question: str) -> str:
    msgs = [{"role": "user", "content": question}, {"role": "assistant", "content": "An answer. " * 20}]
    return json.dumps({"id": pid, "messages": msgs}) + "\n"


def test_bench_refuses_a_datastore_holding_benchmark_answers(tmp_path):
    """A corpus answer to a benchmark question (also one asked inside a chat-slice prompt) is
    dropped by ``--exclude-bench``; a datastore that still holds one is refused before any
    model is loaded (retrieval would copy the answer and inflate the speedup)."""
    from speclive.cli import main
    from speclive.errors import ConfigError
    from speclive_bench.datasets import mtbench_questions
    from speclive_bench.decode import DecodeOptions
    from speclive_bench.prompts import load_prompts
    from speclive_bench.talon import run_talon

    limit = 4
    mt = load_prompts("mtbench", limit)[0]
    chat = load_prompts("chat-heldout", limit)[0]
    qs = {f"mtbench-{q['id']}-{q['category']}": q["prompt"] for q in mtbench_questions(1)}
    chat_q = "mtbench-" + chat["id"].removeprefix("chat-")
    assert chat_q in qs and chat_q != mt["id"]
    free = next(k for k in qs if k not in (mt["id"], chat_q) and k.removeprefix("mtbench-") not in chat["id"])
    corpus = tmp_path / "answers.jsonl"
    corpus.write_text(_answer_doc(mt["id"], mt["text"]) + _answer_doc(chat_q, qs[chat_q]))
    (tmp_path / "free.jsonl").write_text(_answer_doc(free, qs[free]))

    def build(out, *extra):
        args = ["datastore", "build", "--model", "smollm2-135m-instruct", "--corpus", str(tmp_path)]
        assert main([*args, "-o", str(out), *extra]) == 0
        return str(out)

    opts = DecodeOptions(
        sets=["mtbench", "chat-heldout"],
        limit=limit,
        backends=["llamacpp"],
        methods=["ar"],
        target="smollm2-135m-instruct",
    )
    opts.datastore = build(tmp_path / "leaky.npz")
    with pytest.raises(ConfigError, match=f"--exclude-bench {limit}") as err:
        run_talon(opts)
    assert mt["id"] in str(err.value) and chat["id"] in str(err.value)
    clean = build(tmp_path / "clean.npz", "--exclude-bench", str(limit))
    from speclive_bench.talon import datastore_facts

    facts = datastore_facts(clean, [*load_prompts("mtbench", limit), *load_prompts("chat-heldout", limit)])
    assert facts["overlap_with_benchmark"] == [] and facts["corpus_prompts"] == 1
    # a corpus without ids is checked by content: a text file quoting a benchmark question
    (tmp_path / "answers.jsonl").unlink()
    (tmp_path / "dump.txt").write_text(f"Q: {mt['text']}\nA: " + "An answer. " * 20)
    opts.datastore = build(tmp_path / "no-ids.npz")
    with pytest.raises(ConfigError, match=mt["id"]):
        run_talon(opts)
