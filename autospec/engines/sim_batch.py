"""The simulator's batch path: the requests a `SimEngine` serves held as numpy arrays and stepped together.

The per-request path (`SimEngine.add` / `draft_rounds` / `verify`) keeps a `_SimRequest` per request
and walks them in Python every step; a 20,000-request replay spends most of its time there. When the
step's draft lengths are decided at its start and every draft is verified (static K, no-SD, a
per-batch-size K schedule, SmartSpec, the oracles, GP-LCB, DSDE under verify-all), the step is a few array operations
instead: `SimBatch` holds one column per per-request field, `step(b, k)` advances the first b rows by
one SD step of k drafts each and `step_rows(b, ks)` by one of ks[i] drafts for row i.

It is the same simulator, not an approximation of it:

* acceptance: at T = 0 a = min(k, m) for the trace's match length m at the request's position, at
  T > 0 the run of chain positions whose fixed draw (splitmix64 of the request's stream and (g, j),
  module docstring of engines/sim.py) falls below the proposal rule's probability — the same hash
  computed on uint64 arrays, which wrap as the Python code masks;
* clock: every pass is priced by the engine's own pricing methods (`_padded_rounds_s`, `_rounds_s`,
  `_packed_rounds_s` — weighted passes and admitted requests' proposals on a vLLM profile —,
  `_target_pass_s`, `costs.prefill_time`, `_fused_prefill_time`, `_admitted`) from the same aggregates — sums of
  whole numbers, exact in float64 whatever the order — so the clock is bit-for-bit the per-request
  path's, and so are the engine's totals.

What it does not do: SM splits and frontier steps (FASER's execution), lengths decided token by token
(AdaSpec, AdaEDL, the thresholds), keeping output token ids;
`serving.batch.batch_path_problem` sends those replays down the per-request path.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from autospec.engines.sim import _DRAW_STRIDE, SimEngine, _mix, _TraceSlices, passes_of
from autospec.errors import InputError

__all__ = ["SimBatch"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_UNIT = 1.0 / (1 << 53)
_SUM, _MAX, _MIN = np.add.reduce, np.maximum.reduce, np.minimum.reduce


class SimBatch:
    """The engine's running requests as columns, rows 0..n-1 in the serving loop's batch order.

    It is built for one replay's requests (`prompt_lens`, `max_tokens`, `trace_ids`, `domains`,
    `prompt_keys`, in the loop's arrival order; each bound to its acceptance trace here, once);
    `add(start, stop)` prefills requests start..stop-1 of them, `step(b, k)` steps rows 0..b-1, `drop`
    removes finished rows. It owns the engine's clock while it serves (the engine's per-request table
    stays empty), and its columns hold at most `capacity` rows (the loop's max_batch)."""

    def __init__(self, engine: SimEngine, capacity: int, prompt_lens: Sequence[int], max_tokens: Sequence[int],
                 trace_ids: Sequence[int], domains: Sequence[str], prompt_keys: Sequence[str | None]):
        if engine.active_ids():
            raise ValueError("the batch path needs an engine that serves no request yet")
        if min(prompt_lens, default=1) < 1:
            raise InputError("a request has an empty prompt", field="prompt")
        self.engine = engine
        tr = engine.traces
        self.greedy = engine.temperature == 0
        self.padded = engine.padded_batches
        # per request of the replay: its trace (SimEngine._trace_for) and draw stream, bound up front
        traces = np.asarray([engine._trace_for(d, t, k) for d, t, k in zip(domains, trace_ids, prompt_keys)],
                            np.int64)
        starts, lengths = np.asarray(tr.starts, np.int64), np.asarray(tr.lengths, np.int64)
        self.req_prompt = np.asarray(prompt_lens, np.int64)
        self.req_room = np.asarray(max_tokens, np.int64) - 1  # after the prefill's token
        self.req_base = starts[traces]
        self.req_size = lengths[traces]
        self.req_key = np.asarray([_mix(engine.seed, t) for t in trace_ids], np.uint64)
        # per flat trace position (T = 0): its trace's first position and length, for `_tables`
        position_trace = np.repeat(np.arange(len(starts)), lengths)
        self.position_base, self.position_size = starts[position_trace], lengths[position_trace]
        self.match = tr.match_array
        self.accept = tr.target_matrix if engine.draft_sampling == "greedy" else tr.accept_matrix
        self._tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.n = 0
        self.total_context = 0  # Σ context of the rows: whole numbers, kept exact as rows come, go and step
        # the columns are rows of one array, so dropping finished rows moves them all in one operation
        self._columns = np.zeros((6, capacity), np.int64)
        self.owner = self._columns[0]  # the request's index in the replay's order
        self.position = self._columns[1]  # flat trace index of its next token to commit
        self.g = self._columns[2]  # output position of that token (T > 0 draws)
        self.context = self._columns[3]  # tokens in its KV
        self.room = self._columns[4]  # tokens it may still commit
        # committed tokens the draft has not fed (sim.draft_lag), less the one every request has: 0 or 1
        # after a drafting step, one more per step without drafts
        self.lag_extra = self._columns[5]

    # ------------------------------------------------------------------ rows
    def add(self, start: int, stop: int) -> tuple[float, np.ndarray]:
        """Prefill requests start..stop-1 (appended as rows, in order), as `SimEngine.add` does: each
        commits its trace's token at position 0 and the clock is charged the batch's prefill.
        (seconds, finished at the prefill per new row)."""
        e = self.engine
        n, m = self.n, stop - start
        rows = slice(n, n + m)
        alone = n == 0
        prompt = self.req_prompt[start:stop]
        room = self.req_room[start:stop]
        size = self.req_size[start:stop]
        self.owner[rows] = np.arange(start, stop)
        self.position[rows] = self.req_base[start:stop] + 1 % size
        self.g[rows] = 1
        self.context[rows] = prompt + 1
        self.room[rows] = room
        self.lag_extra[rows] = 0
        self.n = n + m
        tokens = int(prompt.sum())
        self.total_context += tokens + m
        e._next_id += m  # the engine's ids stay those the per-request path would have given
        if e.padded_batches:
            longest = int(prompt.max())
            dt = e.costs.prefill_time(m * longest, m * longest * longest)
        elif not e.fused_prefill:
            dt = e.costs.prefill_time(tokens, int((prompt * prompt).sum()))
        else:
            dt = e._fused_prefill_time(tokens, int((prompt * prompt).sum()), alone=alone)
        e._clock += dt
        e.totals["prefill_s"] += dt
        if e._admission_rounds and e._speculative:
            e._admitted((m, tokens + m), alone)
        return dt, room <= 0

    def drop(self, rows: np.ndarray) -> np.ndarray:
        """Remove the rows where the boolean mask `rows` (over rows 0..n-1) is true, keeping the others'
        order; returns the removed rows' owners."""
        n = self.n
        gone = self.owner[:n][rows]
        self.total_context -= int(self.context[:n][rows].sum())
        kept = self._columns[:, :n][:, ~rows]
        self.n = kept.shape[1]
        self._columns[:, :self.n] = kept
        return gone

    # ------------------------------------------------------------------ one step
    def step(self, b: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int, float, float]:
        """Rows 0..b-1 draft k tokens each (0 <= k <= K_max) and verify them all: `draft_rounds` then
        `verify` of the per-request path. (accepted + 1, tokens committed, the finished rows' mask or
        None when none finished, Σ committed, draft s, verify s). The ufuncs' own reductions are called:
        an ndarray method adds a Python frame, and this runs once per step."""
        e = self.engine
        context = self.context[:b]
        total = self.total_context if b == self.n else int(_SUM(context))
        longest = shortest = 0
        if self.padded:
            longest, shortest = int(_MAX(context)), int(_MIN(context))
        if k > 0:
            self._draft(b, k, total, longest, shortest)
        accepted1 = self._accept(b, k)
        fed = b * (k + 1)
        if self.padded:
            dt = e._target_pass_s(b * longest, fed, k == 0, shortest == longest)
            if k > 0:  # sim.draft_lag: 2 after a round that accepted every draft, else 1
                self.lag_extra[:b] = accepted1 > k
            else:
                self.lag_extra[:b] += 1
        else:  # packed rows: the lag prices nothing
            dt = e._target_pass_s(total, fed, k == 0)
        return self._settle(b, accepted1, dt)

    def _settle(self, b: int, accepted1: np.ndarray, dt: float
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int, float, float]:
        """The verify pass's `dt` on the clock, and rows 0..b-1 commit accepted1 tokens each (what room
        they have): `step`'s return value."""
        e = self.engine
        context = self.context[:b]
        e._clock += dt
        e.totals["verify_s"] += dt
        draft_s, e._draft_since_verify = e._draft_since_verify, 0.0
        e._end_step()
        room = self.room[:b]
        room -= accepted1
        committed = accepted1
        finished = None
        if _MIN(room) <= 0:  # the last step of some: they commit only what they had room for
            finished = room <= 0
            committed = accepted1 + np.minimum(room, 0)
        context += committed
        tokens = int(_SUM(committed))
        self.total_context += tokens
        return accepted1, committed, finished, tokens, draft_s, dt

    def step_rows(self, b: int, ks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int, float, float]:
        """`step` with a draft length per row (`ks[i]` for row i, 0 <= ks[i] <= K_max): the per-request
        path's `draft_rounds` and `verify` of those lengths, priced from the same aggregates (sums of
        whole numbers, per-length counts and context extremes), so to the bit as well."""
        e = self.engine
        context = self.context[:b]
        total = self.total_context if b == self.n else int(_SUM(context))
        drafting = ks > 0
        rounds = int(_MAX(ks)) if b else 0
        if rounds > 0:
            self._draft_rows(b, ks, drafting, rounds)
        accepted1 = self._accept_rows(b, ks, rounds)
        if self.padded:
            longest, shortest = int(_MAX(context)), int(_MIN(context))
            dt = e._target_pass_s(b * longest, b * (rounds + 1), rounds == 0, shortest == longest)
            lag = self.lag_extra[:b]  # sim.draft_lag per row: 1 more without drafts, else 1 if all accepted
            lag[:] = np.where(drafting, accepted1 > ks, lag + 1)
        else:
            fed = int(_SUM(ks)) + b
            dt = e._target_pass_s(total, fed, fed <= b)
        return self._settle(b, accepted1, dt)

    def _draft_rows(self, b: int, ks: np.ndarray, drafting: np.ndarray, rounds: int) -> None:
        """Draft rounds of per-row lengths over rows 0..b-1, priced as `SimEngine.draft_rounds` prices them."""
        e = self.engine
        context = self.context[:b]
        ending = np.bincount(ks[drafting], minlength=e.k_max + 1).tolist()
        if self.padded:
            longest, shortest = [0] * (e.k_max + 1), [1 << 62] * (e.k_max + 1)
            for k in np.flatnonzero(ending).tolist():
                rows = context[ks == k]
                longest[k], shortest[k] = int(_MAX(rows)), int(_MIN(rows))
            dt = e._padded_rounds_s(ending, longest, shortest, rounds, 1 + int(_MAX(self.lag_extra[:b][drafting])))
            if e._round is not None:
                dt += e._round.forward(int(_SUM(context[drafting])), int(_SUM(drafting)))
        elif e.packs_passes:  # pass i: the rows drafting more than i tokens, at their context + i
            dt = e._packed_rounds_s(passes_of(context, ks, rounds), rounds, int(_SUM(drafting)),
                                    int(_SUM(context[drafting])))
        else:  # Σ over drafted tokens of their context: Σ k·context + k(k−1)/2, whole numbers
            weighted = int(_SUM(ks * context)) + int(_SUM(ks * (ks - 1) // 2))
            dt = e._rounds_s(float(weighted), int(_SUM(ks)), rounds, ending)
            if e._round is not None:
                dt += e._round.forward(int(_SUM(context[drafting])), int(_SUM(drafting)))
        e._step_passes += rounds
        e._clock += dt
        e._draft_since_verify += dt
        e.totals["draft_s"] += dt

    def _accept_rows(self, b: int, ks: np.ndarray, rounds: int) -> np.ndarray:
        """`_accept` with a length per row: accepted drafts + 1 of each row verifying its ks drafts."""
        position = self.position[:b]
        if self.greedy:
            out = np.minimum(self.match[position], ks) + 1
            base = self.position_base[position]
            position[:] = base + (position - base + out) % self.position_size[position]
            return out
        out = np.minimum(self._realised(b, rounds), ks) + 1 if rounds else np.ones(b, np.int64)
        g = self.g[:b]
        g += out
        owner = self.owner[:b]
        position[:] = self.req_base[owner] + g % self.req_size[owner]
        return out

    def _realised(self, b: int, n: int) -> np.ndarray:
        """T > 0, rows 0..b-1: the run of the first n chain positions whose fixed draws pass
        (`SimEngine._realised_run`)."""
        g, owner, position = self.g[:b], self.owner[:b], self.position[:b]
        index = g[:, None].astype(np.uint64) * np.uint64(_DRAW_STRIDE) + np.arange(n, dtype=np.uint64)
        z = index * _GOLDEN + self.req_key[owner][:, None] * _MIX1 + _MIX2
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        z ^= z >> np.uint64(31)
        passed = (z >> np.uint64(11)).astype(np.float64) * _UNIT < self.accept[position, :n]
        return np.where(passed.all(axis=1), n, passed.argmin(axis=1)).astype(np.int64)

    def klds(self, positions: list[int], counts: list[int]) -> _TraceSlices:
        """Per row, the trace's KLDs of its first counts[i] drafts at positions[i] (the rows' positions
        before a step): a verify's `StepOutcome.klds`, sliced when read."""
        return _TraceSlices(self.engine.traces.klds, positions, counts)

    def true_match(self, b: int) -> np.ndarray:
        """Rows 0..b-1: `SimEngine.true_match_len` — at T = 0 the trace's match length at the row's position,
        at T > 0 the realised run of K_max positions (the oracles' signal)."""
        if self.greedy:
            return self.match[self.position[:b]]
        return self._realised(b, self.engine.k_max)

    def _draft(self, b: int, k: int, total: int, longest: int, shortest: int) -> None:
        """k draft rounds over rows 0..b-1, priced as `SimEngine.draft_rounds` prices them."""
        e = self.engine
        if e.packs_passes and not self.padded:  # pass i: every row, at its context + i
            per_pass = [(b, total + b * i) for i in range(k)] + [(0, 0)] * (e.k_max - k)
            dt = e._packed_rounds_s(per_pass, k, b, total)
        else:
            if self.padded:
                dt = e._uniform_padded_rounds_s(b, k, longest, shortest, 1 + int(_MAX(self.lag_extra[:b])))
            else:  # Σ over drafted tokens of their context: k·Σ context + b·k(k−1)/2, whole numbers
                ending = [0] * (e.k_max + 1)
                ending[k] = b
                dt = e._rounds_s(float(k * total + b * (k * (k - 1) // 2)), k * b, k, ending)
            if e._round is not None:
                dt += e._round.forward(total, b)
        e._step_passes += k
        e._clock += dt
        e._draft_since_verify += dt
        e.totals["draft_s"] += dt

    def _accept(self, b: int, k: int) -> np.ndarray:
        """Accepted drafts + 1 of rows 0..b-1 verifying k drafts at their positions, which it advances
        past them (a finishing row's position is never read again)."""
        position = self.position[:b]
        if self.greedy:
            accepted1, after = self._table(k)
            out = accepted1[position]
            position[:] = after[position]
            return out
        # SimEngine._realised_run for every row: draw j at output position g is u(key, g·stride + j)
        out = self._realised(b, k) + 1 if k else np.ones(b, np.int64)
        g = self.g[:b]
        g += out
        owner = self.owner[:b]
        position[:] = self.req_base[owner] + g % self.req_size[owner]
        return out

    def _table(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """T = 0, per flat trace position p: min(k, m_p) + 1 — what a request there commits verifying k
        drafts — and the position it moves on to (wrapping around its trace's end)."""
        table = self._tables.get(k)
        if table is None:
            accepted1 = np.minimum(self.match, k) + 1
            offset = np.arange(len(accepted1)) - self.position_base
            after = self.position_base + (offset + accepted1) % self.position_size
            table = self._tables[k] = (accepted1, after)
        return table
