"""``benchmarks/replay_serve_drafters.py``: drafters replayed on served answers, under the oracle."""

from __future__ import annotations

from bench_scripts import load_benchmark_script

rs = load_benchmark_script("replay_serve_drafters")

#: a wide-vector CPU's curve: long passes cost little more than short ones (ms)
ROWS = [{"k": k, "ms": ms} for k, ms in {1: 100, 2: 120, 4: 170, 8: 260, 16: 280, 32: 400, 64: 700}.items()]


class _Tok:
    """``answers`` reads ``chat`` and ``encode``: one id per distinct word."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def _id(self, w: str) -> int:
        return self.ids.setdefault(w, len(self.ids) + 3)

    def chat(self, messages):
        return [self._id(w) for m in messages for w in ["<user>", *m["content"].split(), "<assistant>"]]

    def encode(self, text):
        return [self._id(w) for w in text.split()]


def test_answers_are_the_first_speclive_answer_per_prompt_of_the_set():
    rows = [
        {"server": "speclive", "prompt_set": "s", "prompt": "a b", "text": "x y", "error": ""},
        {"server": "speclive", "prompt_set": "s", "prompt": "a b", "text": "other", "error": ""},
        {"server": "peer", "prompt_set": "s", "prompt": "c", "text": "z", "error": ""},
        {"server": "speclive", "prompt_set": "t", "prompt": "d", "text": "w", "error": ""},
    ]
    tok = _Tok()
    first = (tok.chat([{"role": "user", "content": "a b"}]), tok.encode("x y"))
    assert rs.answers({"single": rows}, "s", tok) == [first]


def test_every_drafter_stays_under_the_copy_oracle_and_copies_pay():
    words = [f"w{i}" for i in range(80)]
    tok = _Tok()
    # an edit: the answer quotes the prompt with one word changed
    edited = [*words[:30], "changed", *words[31:70]]
    pairs = [(tok.chat([{"role": "user", "content": " ".join(words)}]), tok.encode(" ".join(edited)))]
    out = rs.replay_all(pairs, ROWS, tok)
    oracle = out.pop("copy oracle")["speedup"]
    assert set(out) == {f"{d} {m}" for d in rs.DRAFTERS for m in ("warm", "cold")}
    for name, r in out.items():
        assert 1.0 < r["speedup"] <= oracle + 1e-9, name
        assert r["passes"] and r["passes"][0] < len(edited)
