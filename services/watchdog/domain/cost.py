"""WD-6: what an unnoticed loop costs, as the seed's arithmetic (the "budgets and ceilings" model).

A looping run re-sends its whole context every turn, and the context grows by what each turn
adds (its output and the error it provoked), so the input tokens of n turns are an arithmetic
series: n * s0 + delta * n (n - 1) / 2. Cost therefore grows with the square of the loop's
length; a ceiling bounds the worst case, and only a progress signal keeps a typical loop short.
The prices are the seed's illustrative ones (no prefix caching).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SEED_LOOP", "LoopCost", "LoopModel"]


@dataclass(frozen=True)
class LoopCost:
    turns: int
    input_tokens: int
    output_tokens: int
    dollars: float
    seconds: float


@dataclass(frozen=True)
class LoopModel:
    first_turn_tokens: int = 1_000  # s0: what the first looping turn sends
    output_tokens_per_turn: int = 300
    error_tokens_per_turn: int = 800  # the error each turn appends to the context
    seconds_per_turn: float = 10.0  # one model call and one tool run
    input_dollars_per_million: float = 3.0
    output_dollars_per_million: float = 15.0

    @property
    def growth(self) -> int:
        """delta: how much the re-sent context grows per turn (output + error)."""
        return self.output_tokens_per_turn + self.error_tokens_per_turn

    def input_tokens(self, turns: int) -> int:
        return turns * self.first_turn_tokens + self.growth * turns * (turns - 1) // 2

    def cost(self, turns: int) -> LoopCost:
        tokens_in = self.input_tokens(turns)
        tokens_out = turns * self.output_tokens_per_turn
        dollars = (
            tokens_in * self.input_dollars_per_million + tokens_out * self.output_dollars_per_million
        ) / 1_000_000
        return LoopCost(turns, tokens_in, tokens_out, dollars, turns * self.seconds_per_turn)


SEED_LOOP = LoopModel()
