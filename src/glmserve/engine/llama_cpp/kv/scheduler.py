"""Continuous-batching scheduler: who runs, who waits, who is preempted (the data it decides
over: ``engine/llama_cpp/kv/sequence.py``; the bound on requests let in: ``engine/admission.py``).

No llama.cpp or torch imports (nano-vllm's split): the scheduler decides, the engine executes.
Each engine step is ``schedule()`` -> the engine applies the returned KV operations and decodes
the returned chunks in one batch -> ``append_token`` / ``finish`` for what came out.

Two models of llama.cpp's KV cache (``kv_layout``), over ``max_num_seqs`` slots (sequence ids):

- ``"split"`` (llama.cpp's non-unified cache, as ``llama-server -np N``): each slot has its own
  stream of ``n_ctx`` cells, so every request may use the whole context and none ever waits for
  cells or is preempted. Attention of a sequence reads only its own stream, which makes a decode
  step of many sequences cheaper than in one shared pool. Memory: ``max_num_seqs x n_ctx`` cells.
- ``"unified"``: ``n_ctx`` cells shared by all slots. No slot owns a fixed slice: a long
  request may use what short ones leave free, at the cost of preemption when the pool is full.
  Accounting is conservative: cells shared by ``seq_cp`` are counted once per slot, so the real
  cache is never fuller than the count.

A finished slot keeps its tokens' KV as a cache until the cells are needed, so a new request whose
prompt starts with those tokens (the same system prompt, a chat's earlier turns) reuses them; a
prefix held by another slot is copied (``seq_cp``: a unified cache shares the cells; across split
streams llama.cpp copies the whole stream and the cells past the prefix are then dropped, so a copy
is made only when it saves ``SPLIT_COPY_MIN_TOKENS`` of prefill). A request whose prompt shares a
longer prefix with a running sequence that is still prefilling it waits until that prefix is
computed, and then reuses it (N agents sending one long system prompt at once compute it once).

Host prompt cache (``HostPromptCache``, split layout; llama-server's ``--cache-ram``): before a free
slot's cells are reclaimed for another request, the slot's state is saved to host memory
(``KVOp("save")``); a request whose prompt shares a longer prefix with a saved state than with any
slot gets that state loaded into its slot (``KVOp("load")``) instead of recomputing it.

Per step: every running sequence gets its next token (decode) or its next prompt chunk (chunked
prefill), within ``max_num_batched_tokens``; then waiting requests are admitted in arrival order,
round robin across tenants when several wait (``engine/admission.py``'s ``in_turn``), while a slot,
the budget and KV cells for their whole remaining prompt are free. A chunk never ends inside a
prompt's image (``Sequence.whole``): it runs past the budget by the rest of the image, which the
engine decodes apart from the batch.
(Unified layout) When a running sequence needs a cell and none is free, idle caches are evicted
first, then the newest running sequence is preempted: its cells are freed and it waits at the
queue's head, to be recomputed from its tokens (prompt + what it generated) later.

Priority (``Sequence.priority``, lower first; batch lines run at ``BATCH_PRIORITY``): only the
lowest value with work is scheduled; the others keep their slots and cells, paused, and a waiting
sequence of that value that finds every slot taken gets the newest paused one's slot (preempted: it
waits again and is recomputed later). A value keeps the engine for ``priority_hold_s`` after its
last sequence ran (``held_s``: nothing of a higher value runs until then), so that back-to-back
interactive requests (an agent's turns) do not each meet a batch step, or the recomputation of a
preempted batch sequence, on arrival. An interactive request that comes after a longer pause still
waits for the step in progress, which is kept short: a step of background work (a value above 0)
computes at most ``BACKGROUND_PROMPT_TOKENS`` prompt tokens (``benchmarks/batch_priority.py``).
Batch work fills the engine's slots otherwise.

Groups (LoRA adapters): llama.cpp applies adapters to a whole context, so one step decodes sequences
of one group only (``SchedulerOutput.group``; None is the base model). When several groups have
work, steps take turns among them, round robin. A cached prefix is reused only within its group (the
same tokens under another adapter have other KV values) and its cache salt (``Sequence.salt``: the
prompts of one API key are not matched against another's)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from operator import attrgetter
from typing import Literal

from glmserve.engine.admission import in_turn
from glmserve.engine.llama_cpp.kv.prompt_cache import HostPromptCache, common_prefix
from glmserve.engine.llama_cpp.kv.sequence import Chunk, KVOp, SchedulerOutput, SeqStatus, Sequence, Slot

KVLayout = Literal["split", "unified"]

# Split layout: llama.cpp copies a whole stream (n_ctx cells, every layer) to share a prefix; for
# SmolLM2-135M at n_ctx 4096 (90 MiB) about 20 ms here, a few dozen tokens' prefill: a copy is made
# only when it saves at least this many tokens of prefill.
SPLIT_COPY_MIN_TOKENS = 64
# Host prompt cache (split layout): a slot's cells are saved to host memory before they are
# reclaimed when at least this many of them would be lost (a save copies the whole sequence:
# 22.5 KiB a token for SmolLM2-135M, microseconds, against milliseconds of prefill a token)...
HOST_SAVE_MIN_TOKENS = 128
# ...and a saved state is loaded when it gives at least this many more tokens than any slot.
HOST_RESTORE_MIN_TOKENS = 64
PRIORITY_HOLD_S = 1.0  # seconds a priority value keeps the engine after it ran (an agent's pause)
# ...and a step of background work (a priority value above 0) computes at most this many prompt
# tokens (decodes are not limited), so that a request that arrives waits for a short step
BACKGROUND_PROMPT_TOKENS = 64
_tenant, _priority = attrgetter("tenant"), attrgetter("priority")  # in_turn's keys


class Scheduler:
    """See module docstring. Not thread-safe: the engine thread owns it."""

    def __init__(self, max_num_seqs: int, n_ctx: int, max_num_batched_tokens: int,
                 kv_layout: KVLayout = "unified", host_cache: HostPromptCache | None = None,
                 priority_hold_s: float = PRIORITY_HOLD_S, clock: Callable[[], float] = time.monotonic) -> None:
        if max_num_seqs < 1 or n_ctx < 2 or max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs >= 1, n_ctx >= 2 and max_num_batched_tokens >= 1 required")
        if kv_layout not in ("split", "unified"):
            raise ValueError(f"kv_layout must be split or unified, not {kv_layout!r}")
        if host_cache is not None and kv_layout != "split":
            raise ValueError("a host prompt cache needs the split layout")
        self.host_cache = host_cache
        self.max_num_seqs = max_num_seqs
        self.n_ctx = n_ctx  # the most tokens one sequence may hold
        self.kv_layout = kv_layout
        self.split = kv_layout == "split"
        self.kv_capacity = n_ctx * max_num_seqs if self.split else n_ctx  # cells in the whole cache
        self.max_num_batched_tokens = max_num_batched_tokens
        self.slots = [Slot(i) for i in range(max_num_seqs)]
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._step = 0
        self._committed = [0] * max_num_seqs
        self._group: str | None = None
        self.priority_hold_s, self._clock = priority_hold_s, clock
        self._last_ran: dict[int, float] = {}  # priority value -> when a sequence of it last ran

    # ---- state ---------------------------------------------------------------------------

    @property
    def kv_used(self) -> int:
        return sum(slot.n_kv for slot in self.slots)

    @property
    def kv_free(self) -> int:
        """Unified layout: cells no slot holds (split: every slot has ``n_ctx`` of its own)."""
        return self.kv_capacity - self.kv_used

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        if len(seq.tokens) > self.n_ctx:
            raise ValueError(f"sequence of {len(seq.tokens)} tokens cannot fit n_ctx={self.n_ctx}")
        seq.status = SeqStatus.WAITING
        self._enqueue(seq)

    def _enqueue(self, seq: Sequence, front: bool = False) -> None:
        """Into the waiting queue by priority (lower first): behind its equals, or with
        ``front`` (a preempted sequence) ahead of them."""
        index = next((i for i, other in enumerate(self.waiting)
                      if other.priority > seq.priority or (front and other.priority == seq.priority)),
                     len(self.waiting))
        self.waiting.insert(index, seq)

    def _top_priority(self) -> int:
        """The priority whose sequences run this step: the lowest value with work, or a lower
        one that ran less than ``priority_hold_s`` ago (then nothing runs: ``held_s``)."""
        now = self._clock()
        self._last_ran = {p: t for p, t in self._last_ran.items() if now - t < self.priority_hold_s}
        if not self.has_work():
            return 0
        with_work = min(seq.priority for seq in (*self.running, *self.waiting))
        top = min((with_work, *self._last_ran))
        if top == with_work:
            self._last_ran[top] = now
        return top

    def held_s(self) -> float:
        """Seconds until the work there is may run, held for a lower priority value that ran
        less than ``priority_hold_s`` ago (0: it may run now, or there is none)."""
        if not self.has_work():
            return 0.0
        with_work = min(seq.priority for seq in (*self.running, *self.waiting))
        now = self._clock()
        return max([0.0, *(t + self.priority_hold_s - now for p, t in self._last_ran.items() if p < with_work)])

    # ---- one step ------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        self._step += 1
        if len(self.waiting) > 1 and (order := in_turn(self.waiting, self.running, _tenant, _priority)) is not None:
            self.waiting = deque(order)
        self._committed = [slot.n_kv for slot in self.slots]  # decoded by earlier steps: reusable now
        top = self._top_priority()
        out = SchedulerOutput(group=self._pick_group(top))
        self._preempt_for(top, out)
        budget = self.max_num_batched_tokens
        # prompt tokens (chunks of more than one token) this step may compute
        prompt_budget = budget if top <= 0 else BACKGROUND_PROMPT_TOKENS
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SeqStatus.RUNNING or seq.group != out.group or seq.priority > top:
                continue  # preempted earlier in this loop, another group's turn, or paused for a higher priority
            remaining = len(seq.tokens) - seq.num_computed
            n = min(remaining, budget, budget if remaining == 1 else prompt_budget)
            n = seq.whole(seq.num_computed, n)  # an image is decoded whole
            if n == 0 or not self._make_room(n, out, protect=seq):
                continue
            out.chunks.append(self._advance(seq, n, remaining))
            budget = max(0, budget - n)
            prompt_budget = max(0, prompt_budget - (n if remaining > 1 else 0))
        while (self.waiting and len(self.running) < self.max_num_seqs and min(budget, prompt_budget) > 0
               and self.waiting[0].group == out.group and self.waiting[0].priority <= top):
            seq = self.waiting[0]
            if self._prefix_in_prefill(seq) or not self._admit(seq, out):
                break
            self.waiting.popleft()
            remaining = len(seq.tokens) - seq.num_computed
            n = seq.whole(seq.num_computed, min(remaining, budget, prompt_budget))
            out.chunks.append(self._advance(seq, n, remaining))
            budget = max(0, budget - n)
            prompt_budget = max(0, prompt_budget - n)
        return out

    def _prefix_in_prefill(self, seq: Sequence) -> bool:
        """A running sequence of ``seq``'s group is still prefilling a prefix it shares with
        ``seq``, ``SPLIT_COPY_MIN_TOKENS`` or more past what it has computed: ``seq`` waits for it
        and then reuses that prefix, instead of computing it a second time beside it (many agents
        sending one long system prompt at once)."""
        limit = len(seq.tokens) - 1
        for r in self.running:
            done = self._committed[r.slot]  # decoded by earlier steps: what ``seq`` could reuse now
            if (r.group == seq.group and r.salt == seq.salt and done < r.num_prompt
                    and common_prefix(r.tokens[:r.num_prompt], seq.tokens, limit) >= done + SPLIT_COPY_MIN_TOKENS):
                return True
        return False

    def _preempt_for(self, top: int, out: SchedulerOutput) -> None:
        """Priority: waiting sequences of priority ``top`` that find every slot taken get the
        slots of running sequences of a higher value (the newest first), which wait again and
        are recomputed later."""
        waiting = sum(1 for seq in self.waiting if seq.priority == top and seq.group == out.group)
        need = waiting - (self.max_num_seqs - len(self.running))
        for victim in [seq for seq in reversed(self.running) if seq.priority > top][:max(0, need)]:
            self._preempt(victim, out)

    def _pick_group(self, top: int = 0) -> str | None:
        """The group this step serves (among the sequences of priority ``top``): the only one
        with work, or the next in turn."""
        groups = {seq.group for seq in self.running if seq.priority == top}
        if self.waiting and self.waiting[0].priority == top:
            groups.add(self.waiting[0].group)
        if len(groups) > 1:
            order = sorted(groups, key=lambda g: (g is not None, g or ""))
            after = order.index(self._group) + 1 if self._group in groups else 0
            self._group = order[after % len(order)]
        elif groups:
            self._group = groups.pop()
        return self._group

    def _advance(self, seq: Sequence, n: int, remaining: int) -> Chunk:
        chunk = Chunk(seq, seq.num_computed, n, sample=(n == remaining))
        seq.num_computed += n
        self.slots[seq.slot].n_kv = seq.num_computed
        return chunk

    def _make_room(self, n: int, out: SchedulerOutput, protect: Sequence) -> bool:
        """Free ``n`` cells for ``protect``: evict idle caches, then preempt the newest running
        sequences. False if ``protect`` itself had to be preempted. A split stream always has
        room: a sequence never holds more than ``n_ctx`` tokens."""
        while not self.split and self.kv_free < n:
            if self._evict_idle(out):
                continue
            victim = max(reversed(self.running), key=lambda seq: seq.priority)  # a paused one first, else the newest
            self._preempt(victim, out)
            if victim is protect:
                return False
        return True

    def _evict_idle(self, out: SchedulerOutput, keep: tuple[int, ...] = ()) -> bool:
        idle = [s for s in self.slots if s.seq is None and s.n_kv > 0 and s.id not in keep]
        if not idle:
            return False
        slot = min(idle, key=lambda s: s.last_used)
        out.kv_ops.append(KVOp("rm", slot.id, 0))
        slot.tokens, slot.n_kv = [], 0
        self._committed[slot.id] = 0
        return True

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        slot = self.slots[seq.slot]
        out.kv_ops.append(KVOp("rm", slot.id, 0))
        slot.tokens, slot.n_kv, slot.seq = [], 0, None
        self._committed[slot.id] = 0
        self.running.remove(seq)
        seq.slot, seq.num_computed, seq.status = -1, 0, SeqStatus.WAITING
        self._enqueue(seq, front=True)
        out.preempted.append(seq)

    def _admit(self, seq: Sequence, out: SchedulerOutput) -> bool:
        """Pick a free slot for ``seq`` if the whole remaining prompt fits in the KV cache, and
        emit the KV operations that give it the longest cached prefix.

        The free slot with the longest matching cache is reused in place (its cells beyond the
        match are dropped), as llama-server picks slots; only when a running slot holds a
        strictly longer prefix is it copied in. Reuse in place keeps each sequence's cells in
        position order, which keeps results independent of batching (llama.cpp sums attention
        over cells in index order).

        Split layout: ties go to the lowest slot id, so that running sequences keep neighbouring
        ids; llama.cpp decodes consecutive streams in one micro-batch."""
        limit = len(seq.tokens) - 1  # the last known token is always decoded, for its logits
        matches = {
            s.id: common_prefix(s.tokens[: min(s.n_kv, self._committed[s.id])], seq.tokens, limit)
            if s.group == seq.group and s.salt == seq.salt else 0
            for s in self.slots
        }
        free = [s for s in self.slots if s.seq is None]
        # the free slot with the longest own prefix; else an empty one; else the least recently used
        if self.split:
            own = max(free, key=lambda s: (matches[s.id], -s.id))
        else:
            own = max(free, key=lambda s: (matches[s.id], s.n_kv == 0, -s.last_used))
        src = max(self.slots, key=lambda s: (matches[s.id], s.id == own.id))
        if self.split and matches[src.id] - matches[own.id] < SPLIT_COPY_MIN_TOKENS:
            src = own
        n_reuse = matches[src.id]
        # a state in the host prompt cache (split layout) that gives a longer prefix than any slot
        entry, n_host = self.host_cache.best(seq.tokens, seq.group, limit, seq.salt) if self.host_cache else (None, 0)
        restore = entry is not None and n_host >= n_reuse + HOST_RESTORE_MIN_TOKENS
        if restore:
            src, n_reuse = own, n_host
        if not self.split:
            # the slot's old cells give way to the reused prefix plus the rest of the prompt
            need = len(seq.tokens) - own.n_kv
            while self.kv_free < need and self._evict_idle(out, keep=(own.id, src.id)):
                pass
            if self.kv_free < need:
                return False
        # own's cells past the reused prefix are reclaimed (all of them when others come in)
        self._save(own, n_reuse if src.id == own.id and not restore else 0, out)
        at = seq.position(n_reuse)  # the KV position the reused prefix ends at (images take fewer)
        if restore:
            out.kv_ops.append(KVOp("load", own.id, entry=entry))
            out.kv_ops.append(KVOp("rm", own.id, at))
            self.host_cache.touch(entry)
        elif src.id == own.id:
            if own.n_kv > n_reuse:
                out.kv_ops.append(KVOp("rm", own.id, at))
        elif self.split:  # llama.cpp copies whole streams: copy, then drop what is past the prefix
            out.kv_ops.append(KVOp("cp", own.id, 0, -1, src=src.id))
            out.kv_ops.append(KVOp("rm", own.id, at))
        else:
            if own.n_kv:
                out.kv_ops.append(KVOp("rm", own.id, 0))
            out.kv_ops.append(KVOp("cp", own.id, 0, at, src=src.id))
        own.tokens, own.n_kv, own.seq, own.last_used, own.group = seq.tokens, n_reuse, seq, self._step, seq.group
        own.salt = seq.salt
        self._committed[own.id] = n_reuse  # its other cells are gone or not decoded yet
        seq.slot, seq.num_computed, seq.status = own.id, n_reuse, SeqStatus.RUNNING
        if seq.num_cached < 0:
            seq.num_cached = n_reuse
        self.running.append(seq)
        return True

    def _save(self, slot: Slot, keep: int, out: SchedulerOutput) -> None:
        """Before ``slot``'s cells past position ``keep`` are reclaimed: have the engine save the
        slot's state to the host prompt cache, when that loses ``HOST_SAVE_MIN_TOKENS`` or more
        and no entry holds those tokens already."""
        n = min(slot.n_kv, self._committed[slot.id])
        if self.host_cache is None or n - keep < HOST_SAVE_MIN_TOKENS:
            return
        tokens = tuple(slot.tokens[:n])
        if not self.host_cache.covers(tokens, slot.group, slot.salt):
            out.kv_ops.append(KVOp("save", slot.id, p1=n, tokens=tokens, group=slot.group, salt=slot.salt))

    def drop_group(self, group: str) -> list[int]:
        """Forget the idle prefix caches of ``group`` (its LoRA adapter is being unloaded; a later
        adapter of the same name has other KV values); returns their slot ids, for the engine to
        drop their cells. Call when no sequence of ``group`` is unfinished."""
        if self.host_cache is not None:
            self.host_cache.drop_group(group)
        dropped = []
        for slot in self.slots:
            if slot.seq is None and slot.group == group and slot.n_kv:
                slot.tokens, slot.n_kv, slot.group, slot.salt = [], 0, None, None
                self._committed[slot.id] = 0
                dropped.append(slot.id)
        return dropped

    # ---- results -------------------------------------------------------------------------

    def append_token(self, seq: Sequence, token: int) -> None:
        seq.tokens.append(token)

    def accept_draft(self, seq: Sequence, n: int) -> None:
        """``n`` draft tokens decoded after ``seq``'s last token were accepted (speculative
        decoding): their cells stay and count as computed; the engine drops the rest."""
        seq.num_computed += n
        self.slots[seq.slot].n_kv = seq.num_computed

    def finish(self, seq: Sequence, keep_cache: bool = True) -> int | None:
        """End ``seq`` (done, stopped, aborted or failed). A running sequence's slot keeps its KV
        as a reusable prefix cache, unless ``keep_cache`` is False (its cells may be half
        written): then the slot is emptied and its id returned, for the engine to drop its
        cells. A waiting sequence is just dropped."""
        cleared = None
        if seq.status is SeqStatus.RUNNING:
            slot = self.slots[seq.slot]
            slot.seq, slot.last_used = None, self._step
            if not keep_cache:
                slot.tokens, slot.n_kv, cleared = [], 0, slot.id
                self._committed[slot.id] = 0
            self.running.remove(seq)
        elif seq.status is SeqStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SeqStatus.FINISHED
        return cleared
