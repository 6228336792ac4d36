"""Cold start on toy Markov "models" (no weights): the model-drafter cost gate, catch-up in one
batched pass, and saved knowledge (round trip across processes, corrupt files, reset)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# the toy Markov target/draft: every call sleeps whatever its length (a flat cost curve) and
# records the length of every extension in ``calls``
from test_async_fake import MarkovLM, V  # noqa: E402

import speclive
from speclive.backends.base import Backend, CostModel
from speclive.decoder import GenerationConfig, SpeculativeDecoder
from speclive.drafting.model import GATE_STEPS, ModelDrafter

PROMPT = [3, 9, 4, 1, 8] * 20  # 100 tokens: a catch-up would be a real prefill


def _run(target: Backend, drafter=None, n: int = 60) -> list[int]:
    dec = SpeculativeDecoder(target, drafter)
    return dec.run(PROMPT, GenerationConfig(max_tokens=n, ignore_eos=True)).token_ids


def test_a_draft_model_that_cannot_pay_is_never_prefilled():
    target = MarkovLM("target", sleep=0.004)
    ref = _run(target)
    draft = MarkovLM("slow-draft", sleep=0.004)  # as slow as the target: no k can win
    d = ModelDrafter(draft)
    said: list[str] = []
    d.log = said.append
    assert _run(target, d) == ref
    # only the gate's timing steps ran on the draft model: no prefill, no catch-up, no draft
    assert draft.calls == [1] * GATE_STEPS, draft.calls
    assert d.gate_open is False and not d.state.tokens
    assert len(said) == 1 and "not prefilled" in said[0] and "target steps" in said[0]
    # a second generation with the same drafter: decided from the measurements, nothing runs
    assert _run(target, d) == ref
    assert draft.calls == [1] * GATE_STEPS and len(said) == 1


def test_a_cheap_draft_model_passes_the_gate_and_drafts():
    # steps long enough that a loaded machine's wake-up delays (a few ms under parallel test
    # workers) cannot make the draft look as costly as the target
    target = MarkovLM("target", sleep=0.03)
    ref = _run(target)
    # its verification costs the same at every length (each call sleeps once), as on a GPU
    target.cost = CostModel({1: 1.0, 64: 1.0})
    draft = MarkovLM("cheap-draft", sleep=0.001, wrong=7)
    d = ModelDrafter(draft)
    said: list[str] = []
    d.log = said.append
    dec = SpeculativeDecoder(target, d)
    res = dec.run(PROMPT, GenerationConfig(max_tokens=60, ignore_eos=True))
    assert res.token_ids == ref
    assert d.gate_open is True and not said
    assert res.stats.accepted > 0 and res.stats.target_forwards < 60


def test_catch_up_after_a_pause_is_one_batched_pass():
    target = MarkovLM("target", sleep=0.002)
    draft = MarkovLM("cheap-draft", sleep=0.0002)
    d = ModelDrafter(draft, window=None)
    for k in range(1, 17):
        # a flat verification cost, far above the draft's measured step even on a loaded
        # machine (its 0.2 ms sleeps then take longer): drafting and the probe pay
        target.cost.observe(k, 0.05)
    ctx = list(PROMPT)
    d.start(target, ctx)
    assert len(d.propose(ctx, 8)) > 0  # gate open, first sync prefills the prompt in one pass
    assert max(draft.calls) == len(PROMPT)
    # drafting is off for a while (the controller switched it off); 30 tokens are committed
    ctx += [(7 * i) % V for i in range(30)]
    ctl = d.adaptive
    ctl.alpha = 0.0  # nothing pays: off, probing with back-off
    ctl.backoff.off_steps = ctl.backoff.wait - 1
    draft.calls.clear()
    tree = d.propose(ctx, 8)
    assert len(tree) == ctl.cfg.probe_len  # the probe
    # the 30 missed tokens (+ the re-evaluated last one) came in one extend, then the drafting
    assert draft.calls[0] >= 30 and all(c == 1 for c in draft.calls[1:]), draft.calls
    assert d.state.tokens[: len(ctx)] == ctx


# ------------------------------------------------------------------------------ saved knowledge
def _copy_prompt() -> tuple[list[int], MarkovLM]:
    """A prompt whose greedy continuation the toy target copies (its Markov chain cycles)."""
    target = MarkovLM("target", sleep=0.0005)
    prompt = [3, 9]
    for _ in range(60):
        prompt.append(target.next_token(prompt[-2], prompt[-1]))
    return prompt, target


def _learned_ngram(tmp_path) -> tuple[dict, Path]:
    from speclive.drafting.ngram import NgramDrafter
    from speclive.knowledge import KnowledgeStore

    prompt, target = _copy_prompt()
    d = NgramDrafter()
    store = KnowledgeStore(target, d, "ngram", directory=tmp_path)
    dec = SpeculativeDecoder(target, d, knowledge=store)
    res = dec.run(prompt, GenerationConfig(max_tokens=60, ignore_eos=True))
    assert res.stats.accepted > 0
    assert store.path.is_file()
    return json.loads(store.path.read_text()), store.path


CHILD = """
import json, sys
from speclive.backends.base import CostModel
from speclive.drafting.ngram import NgramDrafter
from speclive.knowledge import KnowledgeStore

class T:  # the parent's target as the store sees it (name, kind, threads, device)
    name, kind, n_threads, device = "target", "fake", 2, "cpu"
    def __init__(self):
        self.cost = CostModel()

t, d = T(), NgramDrafter()
d.start(t, [])
store = KnowledgeStore(t, d, "ngram", directory=sys.argv[1])
print(json.dumps({"loaded": store.load(), "drafter": d.knowledge(), "cost": t.cost.state()}))
"""


def test_knowledge_round_trip_in_a_new_process(tmp_path):
    saved, _ = _learned_ngram(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(Path(speclive.__file__).parents[1]))
    env.pop("SPECLIVE_NO_KNOWLEDGE", None)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, env=env, check=True
    )
    child = json.loads(out.stdout)
    assert child["loaded"] is True
    assert child["drafter"] == saved["drafter"]  # the new process starts where the first stopped
    assert child["cost"] == saved["target_cost"] and child["cost"]
    # and it is not the prior state: something was learned
    from speclive.drafting.ngram import NgramDrafter

    assert NgramDrafter().knowledge() != saved["drafter"]


def test_corrupt_or_foreign_knowledge_is_ignored_with_a_warning(tmp_path):
    from speclive.drafting.ngram import NgramDrafter
    from speclive.knowledge import KnowledgeStore

    saved, path = _learned_ngram(tmp_path)
    _, target = _copy_prompt()
    fresh = NgramDrafter().knowledge()
    for bad in (
        "{ not json",
        json.dumps({**saved, "version": 999}),
        json.dumps({**saved, "key": {**saved["key"], "machine": "another"}}),
        # fits the format but not the drafter: the first bucket loads, the second is broken
        json.dumps({**saved, "drafter": {**saved["drafter"], "output_buckets": {"2": {"alpha": 7}}}}),
    ):
        path.write_text(bad)
        said: list[str] = []
        d = NgramDrafter()
        store = KnowledgeStore(target, d, "ngram", directory=tmp_path, log=said.append)
        assert store.load() is False
        assert len(said) == 1 and "ignoring saved knowledge" in said[0], said
        assert d.knowledge() == fresh  # nothing half-applied: the priors stand


def test_knowledge_is_kept_per_host_generation(tmp_path, monkeypatch):
    """A virtual CPU named alike on hosts of another generation (another family/model/ISA)
    measured other costs: its knowledge is another file, not loaded here."""
    from speclive import sysinfo
    from speclive.drafting.ngram import NgramDrafter
    from speclive.knowledge import KnowledgeStore

    _learned_ngram(tmp_path)
    _, target = _copy_prompt()
    assert KnowledgeStore(target, NgramDrafter(), "ngram", directory=tmp_path).load() is True
    monkeypatch.setattr(sysinfo, "cpu_detail", lambda: "family 0 model 0, another-isa")
    other = KnowledgeStore(target, NgramDrafter(), "ngram", directory=tmp_path)
    assert other.load() is False and "another-isa" in other.key["machine"]


def test_knowledge_reset_and_cli(tmp_path, monkeypatch, capsys):
    from speclive.cli import main
    from speclive.knowledge import entries

    monkeypatch.setenv("SPECLIVE_HOME", str(tmp_path))
    _learned_ngram(tmp_path / "knowledge")
    assert len(entries()) == 1
    assert main(["knowledge", "show"]) == 0
    assert "drafter=ngram" in capsys.readouterr().out
    assert main(["knowledge", "reset"]) == 0
    assert entries() == []
    capsys.readouterr()
    # SPECLIVE_KNOWLEDGE_DIR names another directory (a benchmark run's own)
    monkeypatch.setenv("SPECLIVE_KNOWLEDGE_DIR", str(tmp_path / "run"))
    _learned_ngram(tmp_path / "run")
    assert len(entries()) == 1
    assert main(["knowledge", "path"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "run")


def test_model_drafter_gate_in_a_second_process(tmp_path):
    from speclive.knowledge import KnowledgeStore

    target = MarkovLM("target", sleep=0.004)
    ref = _run(target)
    for run in range(2):  # two "processes": fresh drafter, draft backend and cost models
        draft = MarkovLM("slow-draft", sleep=0.004)
        if run:
            target = MarkovLM("target", sleep=0.004)
        d = ModelDrafter(draft)
        d.log = lambda _m: None
        dec = SpeculativeDecoder(target, d, knowledge=KnowledgeStore(target, d, "model", directory=tmp_path))
        assert dec.run(PROMPT, GenerationConfig(max_tokens=60, ignore_eos=True)).token_ids == ref
        assert d.gate_open is False
        # each process times the draft model (a few one-token steps) and never prefills it
        assert draft.calls == [1] * GATE_STEPS, draft.calls
        if run:  # the second process started from what the first learned
            assert d.adaptive.state()["draft_ratio"] > 0.5


# ------------------------------------------------------------------------------ peers
def test_llama_cpp_prompt_lookup_peer_is_greedy_and_drafts(llama_smol):
    from speclive.models.resolve import resolve
    from speclive_bench.peers import LlamaCppPythonPeer, LlamaPromptLookupPeer

    gguf = resolve("smollm2-135m-instruct").gguf
    tok = llama_smol.tokenizer
    code = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
    ids = tok.chat([{"role": "user", "content": f"Repeat this code exactly:\n{code}"}])
    plain = LlamaCppPythonPeer(gguf, tok.eos_ids, n_ctx=1024)
    pld = LlamaPromptLookupPeer(gguf, tok.eos_ids, n_ctx=1024, num_pred_tokens=4)
    try:
        ref = plain.generate(ids, 40)
        out = pld.generate(ids, 40)
    finally:
        plain.close()
        pld.close()
    # greedy: the same tokens until a near tie of the quantized kernels flips one (llama.cpp's
    # logits depend on the batch shape; the decode benchmark analyses such divergences)
    assert out.token_ids[:8] == ref.token_ids[:8]
    assert out.extra["num_draft_tokens"] > 0
    assert out.target_forwards is not None and out.target_forwards < len(out.token_ids)


def test_cold_methods_and_cold_vs_warm_table():
    from speclive_bench.decode import _cold_methods, cold_vs_warm
    from speclive_bench.methods import Method

    local = [
        Method("ar", "llamacpp", "ours"),
        Method("ngram", "llamacpp", "ours"),
        Method("llama-cpp-pld", "llamacpp", "peer"),
    ]
    cold = _cold_methods(local)
    assert [m.key for m in cold] == [
        "ar@llamacpp/cold",
        "ngram@llamacpp/cold",
        "ngram+knowledge@llamacpp/cold",
        "llama-cpp-pld@llamacpp/cold",
    ]
    assert [m.info["knowledge"] for m in cold] == [False, False, True, False]
    summary = [
        {"set": "s", "method": "ngram", "backend": "llamacpp", "decode_speedup": 1.6, "speedup": 1.3},
        {"set": "s", "method": "ngram", "backend": "llamacpp/cold", "decode_speedup": 1.2, "speedup": 1.1},
        {"set": "s", "method": "ngram+knowledge", "backend": "llamacpp/cold", "decode_speedup": 1.5},
        {"set": "s", "method": "llama-cpp-pld", "backend": "llamacpp", "speedup": 0.9},
        {"set": "s", "method": "llama-cpp-pld", "backend": "llamacpp/cold", "speedup": 0.8},
    ]
    rows = {(r["method"], r["knowledge"]): r for r in cold_vs_warm(summary)}
    assert abs(rows[("ngram", False)]["cold_of_warm"] - 0.75) < 1e-9
    assert abs(rows[("ngram", True)]["cold_gain_of_warm_gain"] - 5 / 6) < 1e-9
    assert rows[("llama-cpp-pld", False)]["measure"] == "speedup"


def test_the_gate_charges_the_draft_caches_catch_up_to_the_generation():
    """A draft model whose per-step gain is small stays off when bringing its cache up to the
    new prompt would cost more than that gain wins back; with a cheap catch-up it drafts."""
    from speclive.drafting.model import GATE_HORIZON, catch_up_cost

    context = list(range(1, 200))
    verdicts = {}
    for prefill in ("cheap", "costly"):
        target, draft = MarkovLM("target", 0.0), MarkovLM("draft", 0.0)
        # a CPU-like verification curve: each extra token costs 0.45 of a step
        target.cost = CostModel({1: 1.0, 64: 1 + 0.45 * 63})
        target.cost.set_seconds(1, 0.030)
        # the draft's cost of a k-token prefill: flat, or 5 steps per token
        draft.cost = CostModel({1: 1.0, 64: 1.0 if prefill == "cheap" else 5.0 * 64})
        draft.cost.set_seconds(1, 0.001)
        d = ModelDrafter(draft)
        said: list[str] = []
        d.log = said.append
        d.start(target, context)
        verdicts[prefill] = d._gate(context)
        _, best = d.adaptive._best()
        assert best >= d.adaptive.cfg.min_gain  # per step, drafting would pay in both cases
        catch_up = catch_up_cost(draft, d.state, context[-96:], d.adaptive.draft_ratio)
        if prefill == "costly":
            assert GATE_HORIZON / (GATE_HORIZON / best + catch_up) < d.adaptive.cfg.min_gain
            assert len(said) == 1 and "catch-up" in said[0] and not d.state.tokens
    assert verdicts == {"cheap": True, "costly": False}
