"""A draft in a shared pass is priced at what it adds to that pass (``speclive.server.shared_pass_cost``)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from context_lm import ContextLM, reference_greedy

from speclive.backends.base import BackendState, CostModel
from speclive.decoder import GenerationConfig, drain, make_decoder
from speclive.drafting.base import AdaptiveConfig, AdaptiveLength, Drafter
from speclive.drafting.tree import DraftTree
from speclive.server.shared_pass_cost import RoundLoad, SharedPassCost

# t(k) in seconds: eight tokens cost six single steps, sixteen barely more (the shape measured
# on a 2-core CPU, docs/serving-peers.md)
SECONDS = {1: 0.06, 2: 0.09, 4: 0.16, 8: 0.36, 16: 0.45, 32: 0.75, 64: 1.5}


def _curve() -> CostModel:
    c = CostModel({1: 1.0, 64: 25.0})
    for k, s in SECONDS.items():
        c.set_seconds(k, s)
    return c


def test_alone_the_curve_is_the_pass_of_its_own():
    base = _curve()
    alone = SharedPassCost(base, lambda: (0, 0))
    for k in (1, 2, 4, 8, 16, 32, 64):
        assert alone.ratio(k) == base.ratio(k)
        assert alone.optimistic_ratio(k) == base.optimistic_ratio(k)
    assert alone.step_seconds() == base.step_seconds() == 0.06
    assert alone.observed is base.observed


def test_beside_other_requests_a_draft_costs_what_it_adds_times_the_requests_it_delays():
    base = _curve()
    # seven other requests with one token each: with this request's own token the pass is t(8)
    shared = SharedPassCost(base, lambda: (7, 7))
    r = base.ratio
    # eight tokens more make the pass t(16): the added time, borne by all eight requests, in
    # units of one request's share of t(8)
    assert shared.ratio(9) == pytest.approx(1 + (r(16) - r(8)) * 8 / r(8))
    assert shared.ratio(1) == 1.0
    # far cheaper than a pass of its own: 1 + 0.09 * 8 / 0.36 = 3 against 0.45 / 0.06 = 7.5
    assert shared.ratio(9) == pytest.approx(3.0)
    assert shared.ratio(9) < base.ratio(9)
    # its unit is this request's share of the round, t(8) / 8: a draft model's own steps,
    # which delay all eight requests, are priced in it
    assert shared.step_seconds() == pytest.approx(0.36 / 8)
    assert shared.unit_seconds() == pytest.approx(0.36 / 8)
    # a curve that falls (measurement noise) never makes a draft free of cost or negative
    noisy = CostModel({1: 1.0})
    noisy.set_seconds(1, 0.06)
    noisy.set_seconds(8, 0.40)
    noisy.set_seconds(9, 0.30)
    assert SharedPassCost(noisy, lambda: (7, 7)).ratio(2) == 1.0


def test_a_copy_drafted_beside_a_prompt_chunk_costs_little():
    """In a pass that prefills 256 prompt tokens for another request, a 16-token draft adds a
    few percent to the pass: the controller drafts it where alone it would not pay."""
    base = _curve()
    shared = SharedPassCost(base, lambda: (256, 1))
    assert shared.ratio(17) < 1.5 < base.ratio(17)
    ctl = AdaptiveLength(AdaptiveConfig(max_len=16, prior_alpha=0.3))
    ctl.target_cost = base
    assert ctl.best_length() == 0  # alone, at acceptance 0.3, drafting does not pay
    ctl.target_cost = shared
    assert ctl.best_length() > 0


def test_round_load_counts_the_other_requests():
    a, b, c = BackendState(), BackendState(), BackendState()
    load = RoundLoad()
    assert load.others(a) == (0, 0)
    load.record([(a, 3), (b, 1), (c, 256)])
    assert load.others(a) == (257, 2)
    assert load.others(c) == (4, 2)
    new = BackendState()  # not in the last round: every pass in it is another's
    assert load.others(new) == (260, 3)
    load.record([(a, 1)])  # alone again
    assert load.others(a) == (0, 0)


class _RecordingDrafter(Drafter):
    """Drafts the true next token and keeps the curve it was started with."""

    name = "recording"

    def __init__(self) -> None:
        super().__init__(AdaptiveLength(AdaptiveConfig(fixed=True, max_len=1)))
        self.curves: list[object] = []

    def start(self, target, context: Sequence[int]) -> None:
        super().start(target, context)
        self.curves.append(target.cost)

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        return DraftTree.chain(reference_greedy(list(context), 1, eos=False)[:budget], source=self.name)


def test_the_decoder_hands_its_drafter_the_curve_to_plan_with():
    lm = ContextLM()
    d = _RecordingDrafter()
    made: list[object] = []

    def plan(curve):
        made.append(curve)
        return SharedPassCost(curve, lambda: (5, 2))

    prompt = [5, 9, 11, 4]
    dec = make_decoder(lm, d, plan_cost=plan)
    out = drain(dec.generate(prompt, GenerationConfig(max_tokens=6, ignore_eos=True)))
    assert out.token_ids == reference_greedy(prompt, 6, eos=False)  # planning changes no token
    assert made == [lm.cost]  # made from the curve its passes are timed into
    assert isinstance(d.curves[0], SharedPassCost) and d.curves[0].base is lm.cost
    # without one the drafter reads the target's own curve
    d2 = _RecordingDrafter()
    drain(make_decoder(lm, d2).generate(prompt, GenerationConfig(max_tokens=2, ignore_eos=True)))
    assert d2.curves == [lm.cost]
