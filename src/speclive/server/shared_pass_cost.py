"""What a draft costs when the verification pass is shared with other requests.

The worker decodes the passes of every completion in progress as one llama.cpp batch, so a
request's draft does not pay the cost curve t(k)/t(1) of a pass of its own: it pays what its
tokens add to the shared pass, and that depends on how many tokens the others bring. On a
2-core CPU a batch of eight one-token passes already costs about six single steps, while eight
more tokens add about a quarter to that (the curve is flat in places, steep in others), and in
a round that prefills a 256-token prompt chunk a 16-token copy adds a few percent.

``SharedPassCost`` is the curve a request's drafter plans with. Say the other requests bring
``B`` tokens in ``S - 1`` passes and this request's own single token makes the round
``t(B + 1)``. Drafting ``k`` tokens makes the round longer by ``t(B + 1 + k) - t(B + 1)``, and
that delay is borne by every one of the ``S`` requests in it. The request gains the tokens it
keeps, each one a round it no longer waits for; with ``S`` requests in flight, the time of a
round divided by ``S`` is its share of one. So, in units of that share, a pass of ``n`` of its
tokens costs

    ratio(n) = 1 + (t(B + n) - t(B + 1)) · S / t(B + 1),

which is t(n)/t(1) when the request is alone (``B = 0``, ``S = 1``), and which the length
controller (``speclive.drafting.base.AdaptiveLength``) compares with the tokens it expects to
keep, as it does for a pass of its own. Summed over requests, the delay of every request is the
quantity a server with a steady number of requests in flight minimises, since then the total
wait and the wall time are proportional (Little's law).

The unit of these ratios, the step time a drafter reads (``step_seconds``), is likewise that
share of a round, t(B + 1) / S: a draft model's own steps run on the worker thread between
rounds and delay all S requests, so its cost per drafted token, divided by that unit, is priced
like the pass's.

``RoundLoad`` records each round's passes (``record``), and the next round is predicted to be
like the last: ``others(state)`` is the load the other requests brought to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from speclive.backends.base import BackendState, CostCurve


class RoundLoad:
    """The composition of the worker's last shared pass: tokens per state."""

    def __init__(self) -> None:
        self._own: dict[int, int] = {}
        # their sum (read on every ratio a drafter computes)
        self._tokens = 0

    def record(self, passes: Sequence[tuple[BackendState, int]]) -> None:
        """One shared pass: ``(state, tokens)`` for each of its passes."""
        self._own = {}
        for state, n in passes:
            self._own[id(state)] = self._own.get(id(state), 0) + n
        self._tokens = sum(self._own.values())

    def others(self, state: BackendState) -> tuple[int, int]:
        """(tokens, passes) the other states brought to the last round."""
        own = self._own.get(id(state))
        if own is None:
            return self._tokens, len(self._own)
        return self._tokens - own, len(self._own) - 1


class SharedPassCost:
    """``base``'s curve as one request in a shared pass pays it (module docstring), a
    ``CostCurve``; ``load`` returns the other requests' (tokens, passes). Its unit, the step
    time, is the request's share of a round, t(B + 1) / S: a drafter that divides its own
    serial work (a draft model's steps, which delay the whole round) by it prices that work
    in the same unit. Passes are timed into ``base``."""

    def __init__(self, base: CostCurve, load: Callable[[], tuple[int, int]]):
        self.base = base
        self.load = load

    def _shared(self, k: int, curve: Callable[[int], float]) -> float:
        others, passes = self.load()
        if others <= 0 or k <= 1:
            return curve(k)
        ar = curve(others + 1)
        extra = max(0.0, curve(others + k) - ar)
        return 1.0 + extra * (passes + 1) / ar

    def ratio(self, k: int) -> float:
        return self._shared(k, self.base.ratio)

    def optimistic_ratio(self, k: int) -> float:
        return self._shared(k, self.base.optimistic_ratio)

    def _share(self, seconds: float | None) -> float | None:
        """``seconds`` of a one-token pass of its own -> this request's share of a round."""
        others, passes = self.load()
        if seconds is None or others <= 0:
            return seconds
        return seconds * self.base.ratio(others + 1) / (passes + 1)

    def step_seconds(self) -> float | None:
        return self._share(self.base.step_seconds())

    def unit_seconds(self) -> float | None:
        return self._share(self.base.unit_seconds())

    @property
    def observed(self) -> dict[int, int]:
        return self.base.observed
