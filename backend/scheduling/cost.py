"""What a batch is expected to cost: compute seconds learned from the batches already run.

A call over ``tokens`` tokens is modelled as ``overhead + per_token * tokens`` (ONNX Runtime's
fixed cost per call plus the work that grows with the text), fitted by exponentially weighted
least squares over recent calls, so the model follows the machine's current speed. Until a
call has run it knows nothing and answers 0 (optimistic: nothing is refused on a guess).
"""

from __future__ import annotations


class CostModel:
    """Online fit of compute seconds per call against its tokens; see module doc."""

    def __init__(self, *, decay: float = 0.95) -> None:
        self._decay = decay
        self._w = 0.0  # weighted sums of 1, x, y, x*x, x*y
        self._x = 0.0
        self._y = 0.0
        self._xx = 0.0
        self._xy = 0.0
        self.overhead_s = 0.0
        self.per_token_s = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        """Learns from one call over ``tokens`` tokens that took ``seconds``."""
        if tokens <= 0 or seconds < 0:
            return
        d = self._decay
        x, y = float(tokens), seconds
        self._w = d * self._w + 1.0
        self._x = d * self._x + x
        self._y = d * self._y + y
        self._xx = d * self._xx + x * x
        self._xy = d * self._xy + x * y
        mean_x, mean_y = self._x / self._w, self._y / self._w
        var = self._xx / self._w - mean_x * mean_x
        cov = self._xy / self._w - mean_x * mean_y
        # Calls of one size only (a steady load of like texts): no slope to fit. Half the cost
        # goes to the call and half to its tokens (a batch of one short text on a CPU is about
        # 60% overhead): charging it all per token would keep batches at the size they are,
        # as the compute bound would then never let a larger one show what it costs.
        if var <= 1e-9 * max(1.0, mean_x * mean_x) or cov <= 0:
            self.per_token_s, self.overhead_s = mean_y / mean_x / 2, mean_y / 2
            return
        slope = cov / var
        intercept = mean_y - slope * mean_x
        if intercept < 0:  # the fit says "negative overhead": keep the line through zero
            slope, intercept = mean_y / mean_x, 0.0
        self.per_token_s, self.overhead_s = slope, intercept

    def estimate(self, tokens: int, calls: int = 1) -> float:
        """Expected seconds for ``calls`` calls over ``tokens`` tokens in all."""
        if tokens <= 0:
            return 0.0
        return calls * self.overhead_s + tokens * self.per_token_s

    @property
    def learned(self) -> bool:
        """Whether any call has been observed yet."""
        return self._w > 0
