"""When an n-gram draft pays: the cost model behind ``--speculative ngram``'s back-off.

A step that decodes a sequence's last token and a draft of ``k`` tokens costs ``t(k + 1)`` and
gives ``1 + (draft tokens accepted)`` tokens; the same time spent without a draft gives
``t(k + 1) / t(1)`` tokens. So a draft of ``k`` pays when its expected yield ``E(k)`` exceeds
``t(k + 1) / t(1)``, and the drafter sends the ``k`` that maximises ``E(k) / (t(k + 1) / t(1))``
only when that ratio is at least ``1 + MARGIN`` (noise in both estimates must not turn into a
loss).

``StepCosts`` learns ``t`` on the machine it runs on, from the engine's own steps that decode
one sequence alone (the steps in which a draft can be sent): ``t(1)`` as a moving average, and
the extra cost of ``r`` rows, ``t(r) / t(1) - 1``, as ``c * shape(r)``: the shape from
``benchmarks/verify_cost.py`` on a 2-CPU machine (the first extra row 0.65 of a step, each
further row 0.35), the scale ``c`` (1 before anything is measured) fitted by decayed least
squares from the drafting steps. On a GPU, where extra rows cost little, ``c`` falls as drafts
are measured, and longer drafts pay.

``Acceptance`` estimates how often one draft source's next token is right, as a two-state chain:
after a right prediction (the sequence is following the source: copying) and after a wrong one
(a fresh guess). Each token a sequence generates is one observation, whether a draft was sent
or not: the drafter keeps its last proposal and compares it with the tokens that came (a shadow
draft), so a source that has been rejected keeps being evaluated for free and is used again
when it starts being right. The expected yield of a draft of ``k`` in state ``s`` is ``1 + p_s (1
+ q + ... + q^(k-1))``, ``p_s`` the rate of the state, ``q`` the rate after a right prediction.
"""

from __future__ import annotations

MARGIN = 0.1  # a draft is sent only when its expected tokens per unit time are >= 1.1x without it
# extra rows' cost in steps of one row (benchmarks/verify_cost.py, SmolLM2-135M Q4_1, 2 CPUs):
PRIOR_FIRST_ROW = 0.65  # the first draft row
PRIOR_ROW = 0.35  # each further one
PRIOR_WEIGHT = 1.0  # the prior counts as this many measured steps ...
PRIOR_ROWS = 8  # ... of this many rows
COST_DECAY = 0.98  # weight of a drafting step's measurement after each newer one
STEP_EMA = 0.05  # weight of a new one-row step in t(1)
RATE_DECAY = 0.95  # weight of an acceptance observation after each newer one
# prior (rate, weight) of a right next token after a wrong prediction / after a right one
PRIOR_AFTER_MISS = (0.2, 2.0)
PRIOR_AFTER_HIT = (0.6, 2.0)


class StepCosts:
    """Seconds a decode step of one sequence takes by its rows (the last token plus a draft),
    learned from the engine's steps. ``record(rows, seconds)``; ``ratio(rows)``: ``t(rows) /
    t(1)``, 1 for one row. Shared by all sequences of an engine (worker thread only). With
    ``learn`` False (``--spec-ngram-cost prior``) ``record`` keeps nothing: the ratio stays the
    prior's, and whether a draft pays depends on the tokens alone."""

    __slots__ = ("t1", "_sys", "_sss", "learn")

    def __init__(self, learn: bool = True) -> None:
        self.learn = learn
        self.t1: float | None = None
        # decayed sums over drafting steps of y * s and s * s, y = t(rows) / t(1) - 1 measured,
        # s = shape(rows) (the prior's extra cost); scale = sum(y s) / sum(s s)
        self._sys = self._sss = 0.0

    @staticmethod
    def shape(rows: int) -> float:
        """The prior extra cost of ``rows >= 2`` rows, in steps of one row."""
        return PRIOR_FIRST_ROW + PRIOR_ROW * (rows - 2)

    def record(self, rows: int, seconds: float) -> None:
        if not self.learn:
            return
        if rows <= 1:
            self.t1 = seconds if self.t1 is None else self.t1 + STEP_EMA * (seconds - self.t1)
            return
        if self.t1 is None:
            return
        y, s = seconds / self.t1 - 1, self.shape(rows)
        self._sys = COST_DECAY * self._sys + y * s
        self._sss = COST_DECAY * self._sss + s * s

    def scale(self) -> float:
        """How much dearer (> 1) or cheaper than the prior draft rows are here; the prior counts
        as ``PRIOR_WEIGHT`` measured steps of ``PRIOR_ROWS`` rows."""
        prior = PRIOR_WEIGHT * self.shape(PRIOR_ROWS) ** 2
        return max(0.0, (self._sys + prior) / (self._sss + prior))

    def ratio(self, rows: int) -> float:
        return 1.0 if rows <= 1 else 1.0 + self.scale() * self.shape(rows)


class Acceptance:
    """One draft source's rate of right next tokens, after a right prediction and after a wrong
    one (module docstring). ``observe(hit)`` takes the next observation in order; ``hit``, the
    state, is whether the last one was right; ``expected(k)`` is a draft's expected yield."""

    __slots__ = ("hit", "_n", "_h")

    def __init__(self) -> None:
        self.hit = False
        (p0, w0), (p1, w1) = PRIOR_AFTER_MISS, PRIOR_AFTER_HIT
        self._n = [w0, w1]  # decayed observation counts, by state (0: after a miss)
        self._h = [p0 * w0, p1 * w1]  # of them right

    def rate(self, after_hit: bool) -> float:
        return self._h[after_hit] / self._n[after_hit]

    def observe(self, hit: bool) -> None:
        s = int(self.hit)
        self._n[s] = RATE_DECAY * self._n[s] + 1
        self._h[s] = RATE_DECAY * self._h[s] + hit
        self.hit = hit

    def miss(self) -> None:
        """The source had nothing to propose: the next prediction is a fresh one."""
        self.hit = False

    def expected(self, k: int) -> float:
        p, q = self.rate(self.hit), self.rate(True)
        return 1.0 + p * (k if q >= 1.0 else (1.0 - q ** k) / (1.0 - q))


def best_length(acceptance: Acceptance, costs: StepCosts, limit: int) -> tuple[int, float]:
    """``(k, gain)``: the draft length in ``0..limit`` with the most expected tokens per unit
    time, and that gain over no draft (``k`` is 0, gain 1.0, when no length reaches
    ``1 + MARGIN``)."""
    best, gain = 0, 1.0
    scale = costs.scale()  # once per call: ratio(rows) is 1 + scale * shape(rows)
    for k in range(1, limit + 1):
        g = acceptance.expected(k) / (1.0 + scale * costs.shape(k + 1))
        if g > gain:
            best, gain = k, g
    return (best, gain) if gain >= 1.0 + MARGIN else (0, 1.0)
