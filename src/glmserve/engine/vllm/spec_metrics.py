"""vLLM's spec-decode counters, read from inside vLLM: a stat logger (vLLM's ``StatLoggerBase``,
passed to ``AsyncLLM.from_engine_args(stat_loggers=...)``) that adds each step's
``SchedulerStats.spec_decoding_stats`` to glmserve's ``SpecDecodeCounters``. With a custom logger
only, vLLM collects step stats without starting its own loggers (``disable_log_stats`` stays on)."""

from __future__ import annotations

from vllm.v1.metrics.loggers import StatLoggerBase

from glmserve.engine.types import SpecDecodeCounters


class SpecDecodeLogger(StatLoggerBase):
    """Adds the drafts vLLM verified in each step to ``counters``."""

    def __init__(self, counters: SpecDecodeCounters) -> None:
        self.counters = counters

    @classmethod
    def factory(cls, counters: SpecDecodeCounters):
        """A ``StatLoggerFactory``: vLLM calls it with ``(vllm_config, engine_index)``."""
        return lambda vllm_config, engine_index=0: cls(counters)

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        stats = getattr(scheduler_stats, "spec_decoding_stats", None)
        if stats is not None:
            c = self.counters
            c.num_drafts += stats.num_drafts
            c.num_draft_tokens += stats.num_draft_tokens
            c.num_accepted_tokens += stats.num_accepted_tokens

    def log_engine_initialized(self) -> None:
        pass
