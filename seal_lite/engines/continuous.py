"""What the engines that batch continuously in seal-lite's own loop share (paged and vLLM): the two calls of the
``Generator`` of seal_lite/step/rollout.py, on top of each engine's one ``_play``."""

from __future__ import annotations

from collections.abc import Callable

OnMessage = Callable[[int, list[int], list[float]], tuple[list[int], int] | None]


class ContinuousGenerator:
    """``generate`` and ``generate_continuously`` for an engine whose ``_play(batch, budgets, temperature,
    on_message, max_live)`` plays the rows and returns each row's last message as (ids, log-probs)."""

    sampled_logprobs: list[list[float]]

    def generate(self, batch: list[list[int]], max_new_tokens: int, temperature: float) -> list[list[int]]:
        """One message for each row; ``sampled_logprobs`` gets their log-probs."""
        messages = self._play(batch, [max_new_tokens] * len(batch), temperature, on_message=None)
        self.sampled_logprobs = [logprobs for _, logprobs in messages]
        return [ids for ids, _ in messages]

    def generate_continuously(self, batch: list[list[int]], budgets: list[int], temperature: float,
                              on_message: OnMessage, max_live: int | None = None) -> None:
        """Play each row until ``on_message(row, ids, logprobs)`` returns None; otherwise it returns the row's
        whole sequence (with what the environment appended) and the next message's budget, and that request
        joins the running batch at once. At most ``max_live`` rows (None: all) play at once; the next row starts
        when one's episode is over."""
        self._play(batch, budgets, temperature, on_message, max_live)

    def _play(self, batch: list[list[int]], budgets: list[int], temperature: float, on_message: OnMessage | None,
              max_live: int | None = None) -> list[tuple[list[int], list[float]]]:
        raise NotImplementedError
