"""The previous-pass drafter (streaming ASR): what it proposes, and that any hypotheses give the
greedy reference, on the fake LM that reads its whole cache."""

from __future__ import annotations

from collections.abc import Sequence

from context_lm import EOS, ContextLM, V, reference_greedy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speclive.decoder import GenerationConfig, SpeculativeDecoder, drain
from speclive.drafting.base import Drafter, StepFeedback
from speclive.drafting.hypothesis import HypothesisDrafter
from speclive.drafting.tree import DraftTree

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class _Tail(Drafter):
    """Proposes the true next two tokens and records what it was asked and told."""

    name = "tail"

    def __init__(self):
        super().__init__(None)
        self.asked = 0
        self.feedbacks = 0

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        self.asked += 1
        return DraftTree.chain(reference_greedy(list(context), 2, eos=False)[:budget], source="tail")

    def feedback(self, step: StepFeedback) -> None:
        self.feedbacks += 1


def _drafter(hyps, tail=None) -> HypothesisDrafter:
    d = HypothesisDrafter(tail=tail)
    d.set_hypotheses(hyps, eos=EOS)
    d.start(ContextLM(), [9, 9])
    return d


def test_one_hypothesis_is_proposed_whole_with_its_end():
    d = _drafter([[5, 6, 7]])
    tree = d.propose([9, 9], 64)
    assert tree.tokens == [5, 6, 7, EOS] and tree.parents == [-1, 0, 1, 2]
    assert set(tree.sources or []) == {"previous"}
    assert d.propose([9, 9, 5, 6], 64).tokens == [7, EOS]
    assert d.propose([9, 9, 5, 6], 1).tokens == [7]  # the budget caps it


def test_two_hypotheses_that_disagree_make_a_tree():
    d = _drafter([[5, 6, 7, 8], [5, 6, 11]])
    tree = d.propose([9, 9], 64)
    # the common prefix once, then one branch each
    assert tree.tokens == [5, 6, 7, 8, EOS, 11, EOS]
    assert tree.parents == [-1, 0, 1, 2, 3, 1, 5]


def test_after_a_divergence_the_hypothesis_is_realigned():
    d = _drafter([[5, 6, 7, 8, 10, 12]])
    # a substituted token: the output goes on after '5 6 30'; '30' is unknown, nothing matches
    assert d.propose([9, 9, 5, 6, 30], 64).tokens == []
    # an inserted token before '7 8': the end of the output '... 31 7' matches at its position
    tree = d.propose([9, 9, 5, 6, 31, 7], 64)
    assert tree.tokens == [8, 10, 12, EOS] and set(tree.sources or []) == {"realigned"}
    # a one-token match far from its aligned position does not count
    assert d.propose([9, 9, 40, 41, 42, 43, 44, 45, 46, 5], 64).tokens == []


def test_the_tail_drafter_takes_over_where_no_hypothesis_helps():
    tail = _Tail()
    d = _drafter([[5, 6]], tail=tail)
    tree = d.propose([9, 9, 33], 64)
    assert tail.asked == 1 and set(tree.sources or []) == {"tail"}
    d.feedback(StepFeedback(tree, [0], 1))
    assert tail.feedbacks == 1
    d.propose([9, 9, 5], 64)  # a hypothesis again: the tail is not told about it
    d.feedback(StepFeedback(DraftTree.chain([6]), [0], 1))
    assert tail.feedbacks == 1


hyp = st.lists(st.integers(1, V - 1), max_size=30)


@SETTINGS
@given(
    prompt=st.lists(st.integers(1, V - 1), min_size=1, max_size=12),
    hyps=st.lists(hyp, max_size=3),
    keep_true=st.integers(0, 30),
    mutate=st.integers(0, 40),
    tail=st.booleans(),
    max_nodes=st.integers(1, 64),
)
def test_any_hypotheses_give_the_greedy_reference(prompt, hyps, keep_true, mutate, tail, max_nodes):
    """Hypotheses that are the true output, a prefix of it, a mutated copy or random tokens:
    the decoder's output is the cache-free greedy reference, and a true hypothesis needs one
    target pass."""
    ref = reference_greedy(prompt, 40)
    true = [t for t in ref if t != EOS]
    cands = [true[:keep_true]] + [list(h) for h in hyps]
    if mutate < len(true):
        m = list(true)
        m[mutate] = (m[mutate] + 1) % V or 1
        cands.append(m)
    d = HypothesisDrafter(tail=_Tail() if tail else None)
    d.set_hypotheses(cands, eos=EOS)
    dec = SpeculativeDecoder(ContextLM(), d)
    res = drain(dec.generate(prompt, GenerationConfig(max_tokens=40, max_draft_nodes=max_nodes)))
    assert res.token_ids == ref
    if keep_true >= len(true) and ref and ref[-1] == EOS and len(ref) <= max_nodes:
        assert res.stats.target_forwards == 1
