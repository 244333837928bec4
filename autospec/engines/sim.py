"""The simulator: an Engine whose clock comes from the fitted latency model and whose acceptance comes
from recorded acceptance traces (docs/architecture.md, "sim").

Binding. A request whose prompt the profile traced (`GenRequest.prompt_key` names a trace:
`autospec profile --workload` records the ids the real replay sends) replays that trace — at T=0
exactly what the torch engine accepts on it. Any other request replays one acceptance trace of its
domain (`GenRequest.domain`; an empty or unprofiled domain draws from every trace), chosen by a seeded
hash of its stable `GenRequest.trace_id` (the serving loop's id). Either way a preempted request that
is re-added keeps its trace and resumes at `GenRequest.resumed_tokens`. Output position g (0 = the
prefill's token) reads trace position g mod N: outputs longer than the trace wrap around it.

Acceptance. At position g the trace holds the draft's greedy chain (K_max tokens with confidence,
entropy, KL(target‖draft) and the target's probability of each), and the match length m. At T=0,
drafting k tokens and verifying n ≤ k accepts exactly min(n, m) — the same count the torch engine
would produce on the trace's prompt. At T>0 chain position j is accepted with a recorded probability
until the first rejection, which one depends on the strategy's proposal rule (`set_draft_sampling`,
the `DraftSampling` capability): sampled proposals ("sample", the default) use min(1, p_t(x)/p_d(x))
of the chain's token x (`accept_probs`), greedy proposals ("greedy": adaspec, dspark, dspark-async)
use p_t(x) (`target_probs`) — the proposal is then the draft's argmax, a point mass (q(x) = 1), and
the torch engine accepts it with min(1, p_t(x)/1) (`TorchSDEngine._accept`). Since p_d(x) ≤ 1,
p_t(x) ≤ min(1, p_t(x)/p_d(x)): greedy proposals never accept more. Both are the traces' T=1
probabilities whatever the temperature (the profile records T=1 only). Tokens then are the chain's
for accepted drafts and the trace's target token for the correction/bonus, so T>0 token ids are a
stand-in (the simulator models counts and time, not T>0 text).

Random draws (T>0): common random numbers per (request, position). The uniform that decides chain
position j at output position g of a request is a fixed hash of (seed, the request's stable
`trace_id`, g, j) — splitmix64, 53 bits — not the next value of a shared stream. Every strategy
replayed with one seed therefore meets the same draws: a draft at a given (request, position, depth)
is accepted under one strategy iff it is under any other with the same proposal rule, whatever was
drafted, verified or scheduled before; a preempted request re-added at `resumed_tokens` meets the draws
it would have met. Both proposal rules test the same uniforms (accept iff u < the position's
probability), so a greedy-proposal replay and a sampled one are coupled too. Because the draws are
fixed in advance, the realised acceptance is known at any position: `true_match_len` at T>0 is the
realised run of accepted chain positions under the strategy's proposal rule — the oracles' signal
(docs/policies.md §8).

Clock. `add` charges the fitted prefill lines of target and draft for the batch's prompt tokens;
with `fused_prefill` (a simulator calibrated from a vLLM profile) only their per-token costs while
requests are running — vLLM runs a step's prefills inside that step's target and draft passes, whose
fixed costs the step already pays (docs/architecture.md, "sim"; the serving loop then starts the new requests'
decoding in the next step, as vLLM does) — and no draft prefill for an engine serving without SD;
each `draft` call one draft pass T = α·N_c + γ·N_b + δ + λ·log2(N_b) + μ·[N_b ≥ 2] (the fit's clock
model; N_c = the batch's context incl. drafts so far, N_b = its size); each `verify` one target pass (N_c =
context, N_b = Σ verified + 1). With `padded_batches` (a simulator calibrated from a torch profile)
passes are priced as the torch engine runs them: every row of a pass attends to a block padded to the
batch's longest context and feeds as many tokens as the widest row, so N_c = b·max context and N_b =
b·max tokens (prompts too: `add` prices b·longest prompt) — at batch 8, one long row among short ones
made a verify 2.4x the cost of the same total context spread evenly — and a round's first draft pass
feeds the committed tokens the draft has not seen (`draft_lag`: 2 after a verify that accepted every
draft, which the profile times as its own shape). vLLM packs a batch's rows (paged attention), so a
vLLM profile's simulator sums contexts and tokens, and charges each drafting round the fit's round
cost (`SimCosts.draft_round`) over the requests that start it: vLLM's proposer re-feeds every
verified token in its first pass and works outside the passes, which the profile measures as the
intercept of draft time per step over K (docs/architecture.md, "sim"), weighs each draft pass by its
place in the round (`SimCosts.draft_pass_weights`: vLLM's draft step is not linear in K); and it prices a target pass
that verifies drafts by the target's clock on the draft_model engine (`SimCosts.drafting_target`),
the engine a replay serves SD with, whose steps cost more than the fixed-K engine's that the clock's
other passes are fitted to. vLLM's drafter also proposes for a request in the step that prefills it
(the next step verifies those drafts; the simulator draws the tokens in that next step as before —
what is accepted does not depend on when it was proposed — and prices the proposal's work where vLLM
does it, one round per request more than its verifying steps): a request admitted into a running
step rides that step's draft passes after the first — whose pass over the prompt is the draft's
prefill `add` priced — and its round (`_packed_rounds_s`), and a prefill-only step runs the proposal
alone, priced at the latest drafting step's passes (`_admitted`; docs/vllm.md, "The simulator against
vLLM"). Under an SM split r > 0
(`configure_execution`, or per step `set_step_sm_split`: GP-LCB's choice) with FASER models that
know r (`FaserModels.has_r_axis`), every pass is priced by those models instead — a draft pass
T_q(N_b, 1, r), a target pass T_p(b, n̄ + 1, 1 − r) for n̄ the mean drafts verified — because the
draft then runs on r of the SMs and the target on the rest (the piecewise models carry no context
term); without an r axis the split is recorded but prices nothing.
`idle_until` jumps the clock. Preemption is by recompute, as in the torch engine and vLLM: the
serving loop removes a preempted request (its KV is freed, at no cost) and later re-adds it with its
prompt + the tokens it had generated, and `add` charges that whole context's prefill — the one price
of a preemption, which also yields its next token. The simulator does not offer `SwapCost`: a switch
cost charged at preemption on top of that re-prefill would price the same KV rebuild twice.

Speed. A 20,000-request replay makes millions of draft/verify entries, so per-position data is
converted once to Python objects (DraftToken tuples, float lists) that are shared, never rebuilt:
`draft` is a list lookup per request, `verify` a few slices.
"""

from __future__ import annotations

import math
from collections import abc
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from autospec.contract import DraftToken, StepOutcome
from autospec.engines.base import GenRequest, PrefillResult
from autospec.errors import InputError
from autospec.latency import FaserModels, LinearCoeffs, LinearLatencyModel

_MASK64 = (1 << 64) - 1


def _mix(seed: int, key: int) -> int:
    """splitmix64 of (seed, key): a stable, well-spread hash for binding requests to traces."""
    z = (key * 0x9E3779B97F4A7C15 + seed * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


# Draw index of chain position j at output position g: g·_DRAW_STRIDE + j (chains are far shorter).
_DRAW_STRIDE = 64


def _uniform(key: int, index: int) -> float:
    """The fixed uniform in [0, 1) of draw `index` of a request's stream (53 bits of splitmix64)."""
    return (_mix(key, index) >> 11) * (1.0 / (1 << 53))


class AcceptanceTraces:
    """Acceptance traces flattened to shared per-position Python objects (see the module docstring)."""

    def __init__(self, frame: pd.DataFrame, k_max: int):
        frame = frame.sort_values(["prompt_id", "position"], kind="stable").reset_index(drop=True)
        if not 1 <= k_max <= _DRAW_STRIDE:
            raise InputError(f"K_max must be in 1..{_DRAW_STRIDE}, got {k_max}", field="k_max")
        self.k_max = k_max

        def mat(col: str, dtype) -> np.ndarray:
            m = np.stack([np.asarray(v, dtype=dtype) for v in frame[col].to_numpy()])
            if m.shape[1] < k_max:
                raise InputError(f"acceptance traces hold chains of {m.shape[1]} tokens, fewer than K_max "
                                 f"{k_max}", field=col)
            return m[:, :k_max]

        chain, conf, ent = mat("chain_tokens", np.int64), mat("confidences", float), mat("entropies", float)
        self.match_array = np.minimum(frame["match_len"].to_numpy(np.int64), k_max)
        self.match: list[int] = self.match_array.tolist()
        self.target_token: list[int] = frame["target_token"].to_numpy(np.int64).tolist()
        self.chain: list[tuple[DraftToken, ...]] = [
            tuple(DraftToken(t, c, h) for t, c, h in zip(tr, cr, hr))
            for tr, cr, hr in zip(chain.tolist(), conf.tolist(), ent.tolist())]
        self.chain_tokens: list[list[int]] = chain.tolist()
        self.klds: list[list[float]] = mat("klds", float).tolist()
        # the batch path (engines/sim_batch.py) reads the arrays, the per-request path the lists
        self.target_matrix, self.accept_matrix = mat("target_probs", float), mat("accept_probs", float)
        self.target_probs: list[list[float]] = self.target_matrix.tolist()
        self.accept_probs: list[list[float]] = self.accept_matrix.tolist()
        # traces: contiguous runs of one prompt_id
        ids = frame["prompt_id"].to_numpy()
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        lengths = np.diff(np.r_[starts, len(ids)])
        self.starts: list[int] = starts.tolist()
        self.lengths: list[int] = lengths.tolist()
        domains = frame["domain"].to_numpy()[starts]
        self.by_domain: dict[str, list[int]] = {}
        for i, d in enumerate(domains):
            self.by_domain.setdefault(str(d), []).append(i)
        self.all_traces = list(range(len(starts)))
        self.by_prompt: dict[str, int] = {str(p): i for i, p in enumerate(ids[starts])}

    def __len__(self) -> int:
        return len(self.starts)


@dataclass(frozen=True)
class SimCosts:
    """The clock's inputs: per-pass models and prefill lines per model. `latency` is AdaSpec's linear
    model, the one policies consult; `clock` (default: `latency`) times the passes — the fit's clock
    model adds λ·log2(N_b) + μ·[N_b ≥ 2] to it (latency.LinearCoeffs)."""

    latency: LinearLatencyModel
    prefill_target: tuple[float, float]  # (per_token_s, fixed_s)
    prefill_draft: tuple[float, float]
    # (target, draft) seconds per prompt token squared, per prompt (fit's per_square_token_s: attention
    # over a long prompt); 0: the prefill lines alone
    prefill_square: tuple[float, float] = (0.0, 0.0)
    clock: LinearLatencyModel | None = None
    # the target's clock in an engine serving without SD (fit's clock_plain; vLLM's plain engine)
    plain_target: LinearCoeffs | None = None
    # the target's clock in the engine that drafts (fit's clock_drafting; vLLM's draft_model engine): it
    # prices the target passes that feed more than one token a row (that verify drafts); None: `clock`
    drafting_target: LinearCoeffs | None = None
    # what a round's i-th draft pass costs as a multiple of the clock's draft pass (fit's draft_pass_weights,
    # i = 1..; the last repeats beyond): vLLM's draft step is not linear in K; None: every pass costs the same
    draft_pass_weights: tuple[float, ...] | None = None
    # what a drafting round costs on top of its passes (fit's clock_draft_round; vLLM's proposer), as
    # α·N_c + γ·N_b + δ over the requests that start a round; None: a round is its passes
    draft_round: LinearCoeffs | None = None

    def prefill_time(self, tokens: int, square_tokens: int = 0) -> float:
        """Both models' prefill of prompts of `tokens` tokens in all, Σ L² = `square_tokens`."""
        if tokens <= 0:
            return 0.0
        (at, bt), (ad, bd), (st, sd) = self.prefill_target, self.prefill_draft, self.prefill_square
        return max(0.0, at * tokens + st * square_tokens + bt) + max(0.0, ad * tokens + sd * square_tokens + bd)


class _TraceSlices(abc.Sequence):
    """Per request of a verify, the first n values of one trace row (target probabilities or KLDs of
    the verified drafts), sliced only when read: most strategies never read them, and two slices per
    request per step were a measurable share of a long replay."""

    __slots__ = ("_rows", "_positions", "_counts")

    def __init__(self, rows: list[list[float]], positions: list[int], counts: list[int]):
        self._rows, self._positions, self._counts = rows, positions, counts

    def __len__(self) -> int:
        return len(self._positions)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self._rows[self._positions[i]][: self._counts[i]]

    def __iter__(self):
        rows = self._rows
        return (rows[p][:n] for p, n in zip(self._positions, self._counts))

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, abc.Sequence) else NotImplemented


def _alphas(coeffs) -> tuple[float, float, float]:
    """(α of a pass feeding several tokens a row, of a decode pass, of a masked decode pass) of a clock's
    `LinearCoeffs`; see `_pass_alpha`."""
    return coeffs.alpha, coeffs.pass_alpha(ragged=False), coeffs.pass_alpha(ragged=True)


def _pass_alpha(alphas: tuple[float, float, float], decode: bool, one_length: bool) -> float:
    """The α a pass pays per context token: a decode pass (one token per row) has its own kernel, and on
    the padded torch engine rows of unequal length add the attention mask (engines/llama.py `needs_mask`;
    latency.LinearCoeffs)."""
    if not decode:
        return alphas[0]
    return alphas[1] if one_length else alphas[2]


def draft_lag(lag: int, drafted: int, accepted: int) -> int:
    """Committed tokens the draft model has not fed after a verify (TorchSDEngine._settle's `pending`),
    from the `lag` before it and the round's drafts and accepted drafts: the verify's new token, on top
    of the earlier lag when the round drafted nothing; the last draft as well when every draft was
    accepted (it was proposed, never fed). The next round's first draft pass feeds them all."""
    if drafted == 0:
        return lag + 1
    return 2 if accepted == drafted else 1


class _SimRequest:
    """Per-request replay state, flat scalars only (the hot paths read a handful of slots)."""

    __slots__ = ("base", "n", "off", "p", "g", "key", "context", "room", "drafted", "lag", "out", "finished")

    def __init__(self, base: int, n: int, g: int, prompt_len: int, max_tokens: int, key: int = 0):
        self.base = base  # flat index of the trace's position 0
        self.n = n  # trace length (positions)
        self.g = g  # output position of the next token to commit (0 = the prefill's token)
        self.key = key  # the request's draw stream: _mix(seed, trace_id) (module docstring, "Random draws")
        self.off = g % n  # trace offset of the next token to commit
        self.p = base + self.off  # its flat index
        self.context = prompt_len  # tokens in the KV: prompt + committed since add
        self.room = max_tokens  # tokens it may still commit
        self.drafted = 0  # drafts this round
        self.lag = 1  # committed tokens the draft model has not fed: its next round's first pass feeds them
        self.out: list[int] = []
        self.finished = False

    def advance(self, committed: int) -> None:
        self.g += committed
        self.off = (self.off + committed) % self.n
        self.p = self.base + self.off
        self.context += committed
        self.room -= committed



def passes_of(contexts: np.ndarray, lengths: np.ndarray, rounds: int) -> list[tuple[int, int]]:
    """Per draft pass i < `rounds` of a step whose rows at `contexts` draft `lengths` tokens: (the rows still
    drafting, Σ their context + i) — what `SimEngine._weighted_rounds_s` prices pass by pass."""
    out = []
    for i in range(rounds):
        active = lengths > i
        n = int(active.sum())
        out.append((n, int(contexts[active].sum()) + n * i))
    return out


class SimEngine:
    """Discrete-event SD engine over recorded traces; implements `autospec.engines.base.Engine`.

    Capabilities: BatchedDraftRounds, FrontierStep, ExecutionConfig, DraftSampling, SpeculativeSwitch,
    FusedPrefill, TrueMatchLength, StepClock, StepSmSplit (autospec.engines.base; DraftSampling picks
    which recorded probability accepts a draft at T>0, module docstring).

    It takes fitted data — the traces and the clock's costs — and reads no run directory:
    `autospec.fit.FittedSimEngine.from_dirs` builds one from profile/ and fit/ (fitting in memory when
    fit/ is absent), because engines never import a stage (tests/test_layers.py)."""

    def __init__(self, traces: AcceptanceTraces, costs: SimCosts, *, k_max: int | None = None,
                 temperature: float = 0.0, seed: int = 0, fused_prefill: bool = False,
                 padded_batches: bool = False):
        if temperature < 0:
            raise InputError(f"temperature must be >= 0, got {temperature}", field="temperature")
        if len(traces) == 0:
            raise InputError("the simulator needs at least one acceptance trace", field="acceptance")
        self.traces = traces
        self.costs = costs
        self.latency_model = costs.latency
        self.k_max = traces.k_max if k_max is None else k_max
        if not 1 <= self.k_max <= traces.k_max:
            raise InputError(f"k_max must be in 1..{traces.k_max} (the recorded chain length), got {self.k_max}",
                             field="k_max")
        self.temperature = float(temperature)
        self.seed = seed
        self._reqs: dict[int, _SimRequest] = {}
        self._next_id = 0
        self._clock = 0.0
        self._draft_since_verify = 0.0
        clock = costs.clock or costs.latency
        d, t = clock.draft, clock.target
        self._draft_coef = (d.alpha, d.gamma, d.delta)
        self._target_coef = (t.alpha, t.gamma, t.delta)
        self._draft_lam, self._target_lam = d.lam, t.lam  # λ·log2(tokens in the pass), 0 = AdaSpec's line
        self._draft_multi, self._target_multi = d.multi, t.multi  # μ: a pass over >= 2 tokens (LinearCoeffs)
        # α of a pass over several tokens a row, of a decode pass (one token a row), and of a decode pass
        # whose rows differ in length on the padded engine (the mask): LinearCoeffs, `_pass_alpha`
        self._draft_alphas, self._target_alphas = _alphas(d), _alphas(t)
        self._sd_target = (self._target_coef, self._target_lam, self._target_multi, self._target_alphas)
        self._round = costs.draft_round
        self._drafting_target = costs.drafting_target
        self._pass_weights = tuple(costs.draft_pass_weights) if costs.draft_pass_weights else None
        # vLLM's drafter proposes for a request in the step that prefills it (module docstring, "Clock";
        # a vLLM profile's simulator, the one with a round clock): the rows admitted into a running step
        # that its draft passes carry besides its own (rows, Σ context), and the passes of the latest
        # drafting step, which a prefill-only step's proposal is priced at
        self._admission_rounds = bool(fused_prefill) and costs.draft_round is not None
        self._joining: tuple[int, int] | None = None
        self._step_passes = self._last_step_passes = 0
        self.totals = {"prefill_s": 0.0, "draft_s": 0.0, "verify_s": 0.0}
        # vLLM's step structure (module docstring, "Clock"): the serving loop reads this attribute
        self.fused_prefill = bool(fused_prefill)
        # the torch engine's batch layout (module docstring, "Clock"): passes padded to their longest row
        self.padded_batches = bool(padded_batches)
        self._speculative = True
        self.draft_sampling = "sample"  # set_draft_sampling; the rows `_accept_sampled` reads follow it
        self._accept_rows = traces.accept_probs

    # ------------------------------------------------------------------ clock
    def now(self) -> float:
        return self._clock

    def idle_until(self, t: float) -> None:
        """Jump the simulated clock to `t` (never backwards)."""
        if t > self._clock:
            self._clock = t

    def set_speculative(self, enabled: bool) -> None:
        """Whether the replayed engine serves with speculative decoding configured (the serving loop
        says: no for a strategy that never drafts). Without it the target's passes are priced by the
        fit's plain-engine clock when the profile measured one (vLLM's plain engine does less per step
        than a speculative one with no drafts); otherwise nothing changes."""
        self._speculative = bool(enabled)
        p = self.costs.plain_target
        if enabled or p is None:
            self._target_coef, self._target_lam, self._target_multi, self._target_alphas = self._sd_target
        else:
            self._target_coef, self._target_lam, self._target_multi = (p.alpha, p.gamma, p.delta), p.lam, p.multi
            self._target_alphas = _alphas(p)

    def set_draft_sampling(self, mode: str) -> None:
        """The strategy's proposal rule at T>0 (module docstring, "Acceptance"): "sample" accepts chain
        token x with min(1, p_t(x)/p_d(x)), "greedy" (the draft's argmax proposed as a point mass) with
        p_t(x). No effect at T=0, where both accept the match length."""
        if mode not in ("sample", "greedy"):
            raise InputError(f"draft_sampling must be 'sample' or 'greedy', got {mode!r}", field="draft_sampling")
        self.draft_sampling = mode
        self._accept_rows = self.traces.target_probs if mode == "greedy" else self.traces.accept_probs

    # ------------------------------------------------------------------ requests
    def _request(self, req_id: int) -> _SimRequest:
        try:
            return self._reqs[req_id]
        except KeyError:
            raise KeyError(f"unknown request id {req_id}") from None

    def _trace_for(self, domain: str, key: int, prompt_key: str | None = None) -> int:
        """The request's own prompt's trace when the profile recorded it (`GenRequest.prompt_key`),
        else a seeded pick among its domain's traces."""
        own = self.traces.by_prompt.get(prompt_key) if prompt_key is not None else None
        if own is not None:
            return own
        pool = self.traces.by_domain.get(domain) or self.traces.all_traces
        return pool[_mix(self.seed, key) % len(pool)]

    def add(self, requests: Sequence[GenRequest]) -> PrefillResult:
        if not requests:
            return PrefillResult([], [], [], 0.0)
        tr = self.traces
        ids, first, finished = [], [], []
        prompt_tokens = square_tokens = longest = 0
        for r in requests:
            n_prompt = len(r.prompt)
            if n_prompt == 0:
                raise InputError("a request has an empty prompt", field="prompt")
            if r.max_tokens < 1:
                raise InputError(f"max_tokens must be >= 1, got {r.max_tokens}", field="max_tokens")
            rid = self._next_id
            self._next_id += 1
            key = rid if r.trace_id is None else r.trace_id
            t = self._trace_for(r.domain, key, r.prompt_key)
            req = _SimRequest(tr.starts[t], tr.lengths[t], int(r.resumed_tokens), n_prompt, r.max_tokens,
                              _mix(self.seed, key))
            tok = tr.target_token[req.p]
            req.out.append(tok)
            req.advance(1)
            req.finished = req.room <= 0
            self._reqs[rid] = req
            # a resumed request's prompt ends with the tokens it generated before its preemption: its
            # whole context is prefilled again (recompute, the one price of a preemption; module docstring)
            prompt_tokens += n_prompt
            square_tokens += n_prompt * n_prompt
            longest = max(longest, n_prompt)
            ids.append(rid)
            first.append(tok)
            finished.append(req.finished)
        if self.padded_batches:  # one forward over the prompts padded to the longest
            dt = self.costs.prefill_time(len(ids) * longest, len(ids) * longest * longest)
        elif not self.fused_prefill:
            dt = self.costs.prefill_time(prompt_tokens, square_tokens)
        else:
            dt = self._fused_prefill_time(prompt_tokens, square_tokens, alone=len(self._reqs) == len(ids))
        self._clock += dt
        self.totals["prefill_s"] += dt
        if self._admission_rounds and self._speculative and not self._split_r:
            self._admitted((len(ids), sum(self._reqs[rid].context for rid in ids)), len(self._reqs) == len(ids))
        return PrefillResult(ids, first, finished, dt)

    def _admitted(self, joining: tuple[int, int], alone: bool) -> None:
        """vLLM's drafter proposes for the requests a step prefilled (`joining`: rows, Σ context) in that
        step (module docstring, "Clock"). In a running step they ride its draft passes (`_packed_rounds_s`);
        a prefill-only step (`alone`) runs the proposal itself, priced at the latest drafting step's passes:
        the round's cost and the passes after the first, whole passes of those rows (the first feeds the
        prompts: the draft's prefill, already priced). Before any step drafted there is no K to price it at
        (the replay's first request): nothing is charged."""
        if not alone:
            self._joining = joining
            return
        passes = self._last_step_passes
        if passes <= 0:
            return
        self._joining = joining  # the only rows of the round's passes (`_packed_rounds_s` clears it)
        dt = self._packed_rounds_s([(0, 0)] * passes, passes, 0, 0)
        self._clock += dt
        self.totals["draft_s"] += dt

    def _fused_prefill_time(self, tokens: int, square_tokens: int, alone: bool) -> float:
        """A vLLM step's prefill cost: the prefill lines' per-token (and per squared token) costs, their
        fixed costs too when no request is running (`alone`: the step is a prefill-only step), the
        draft's only for an engine that drafts (vLLM's plain engine has no draft model)."""
        (at, bt), (ad, bd), (st, sd) = self.costs.prefill_target, self.costs.prefill_draft, self.costs.prefill_square
        dt = max(0.0, at) * tokens + st * square_tokens + (max(0.0, bt) if alone else 0.0)
        if self._speculative:
            dt += max(0.0, ad) * tokens + sd * square_tokens + (max(0.0, bd) if alone else 0.0)
        return dt

    def remove(self, req_ids: Sequence[int]) -> None:
        for rid in req_ids:
            del self._reqs[rid]

    def output(self, req_id: int) -> list[int]:
        return list(self._request(req_id).out)

    def is_finished(self, req_id: int) -> bool:
        return self._request(req_id).finished

    def active_ids(self) -> list[int]:
        return list(self._reqs)

    def true_match_len(self, req_id: int) -> int | None:
        """The oracles' signal: how many of the next chain tokens verification would accept — at T=0 the
        trace's match length m, at T>0 the realised run under the strategy's proposal rule and the
        request's fixed draws (module docstring, "Random draws"), capped at K_max. None for an unknown id."""
        r = self._reqs.get(req_id)
        if r is None:
            return None
        if self.temperature == 0:
            return self.traces.match[r.p]
        return self._realised_run(r, self.k_max)

    def _realised_run(self, r: _SimRequest, n: int) -> int:
        """Accepted chain positions of the first n at the request's position: the run of j with
        u(request, g, j) < the proposal rule's probability at j."""
        probs = self._accept_rows[r.p]
        base = r.g * _DRAW_STRIDE
        a = 0
        while a < n and _uniform(r.key, base + a) < probs[a]:
            a += 1
        return a

    def drafts_of(self, req_id: int) -> list[DraftToken]:
        r = self._request(req_id)
        return list(self.traces.chain[r.p][: r.drafted])

    # ------------------------------------------------------------------ draft / verify
    def draft(self, req_ids: Sequence[int]) -> list[DraftToken]:
        """One more draft token per request: the next token of the recorded chain; one draft pass of time."""
        if not req_ids:
            return []
        reqs, chain, k_max = self._reqs, self.traces.chain, self.k_max
        out = []
        context = longest = 0
        shortest = 1 << 62
        starting = starting_context = 0  # requests whose round this pass starts (the round's cost)
        width = 1  # tokens fed per request, padded: a round's first pass feeds the draft's lag
        weights = self._pass_weights
        weight = 0.0  # Σ over rows of their pass's weight (SimCosts.draft_pass_weights; rows of one round share it)
        for rid in req_ids:
            r = reqs[rid]
            j = r.drafted
            if r.finished:
                raise ValueError(f"request {rid} is finished")
            if j >= k_max:
                raise ValueError(f"request {rid} already drafted K_max={k_max} tokens this round")
            out.append(chain[r.p][j])
            c = r.context + j
            context += c
            if c > longest:
                longest = c
            if c < shortest:
                shortest = c
            if j == 0:
                starting += 1
                starting_context += c
                if r.lag > width:
                    width = r.lag
            r.lag = 1
            r.drafted = j + 1
            if weights is not None:
                weight += weights[j] if j < len(weights) else weights[-1]
        b = len(req_ids)
        rows_weight = b
        joining, step_pass = self._joining, self._step_passes
        self._step_passes += 1
        if joining is not None:  # rows prefilled in this step: in its round, and in its passes after the first
            n, c = joining
            if step_pass == 0:
                starting, starting_context = starting + n, starting_context + c
            else:
                b, context, rows_weight = b + n, context + c + n * step_pass, rows_weight + n
                if weights is not None:
                    weight += n * (weights[step_pass] if step_pass < len(weights) else weights[-1])
        if self._split_r:  # under an SM split: FASER's draft model (module docstring, "Clock")
            dt = self.faser.draft_time(b, 1, self._split_r)  # type: ignore[union-attr]
        else:
            alpha = self._draft_alphas[1]  # packed rows feed one token each, unmasked
            if self.padded_batches:
                alpha = _pass_alpha(self._draft_alphas, width == 1, shortest == longest)
                context, b = b * longest, b * width
            _, g, d = self._draft_coef
            dt = alpha * context + g * b + d
            if self._draft_lam:
                dt += self._draft_lam * math.log2(b)
            if b >= 2:
                dt += self._draft_multi
            if weights is not None:
                dt *= weight / rows_weight
            if self._round is not None and starting:
                dt += self._round.forward(starting_context, starting)
        self._clock += dt
        self._draft_since_verify += dt
        self.totals["draft_s"] += dt
        return out

    def draft_rounds(self, req_ids: Sequence[int], lengths: Sequence[int]) -> list[list[DraftToken]]:
        """`lengths[i]` draft tokens per request in one call; the same tokens and clock as one `draft`
        call per round (round j drafts every request with lengths > j; its time is
        α·Σ(context + j) + γ·n_j + δ), summed in closed form."""
        reqs, chain, k_max = self._reqs, self.traces.chain, self.k_max
        out: list[list[DraftToken]] = []
        weighted = 0.0  # Σ over drafted tokens of their context
        drafted = 0
        rounds = 0
        ending = [0] * (k_max + 1)  # requests whose last draft is in round k − 1 (for λ·log2 n_j)
        padded = self.padded_batches
        longest = [0] * (k_max + 1)  # padded: the longest context among requests drafting k tokens
        shortest = [1 << 62] * (k_max + 1)  # padded: and the shortest (equal rows need no mask)
        width = 1  # padded: tokens fed per request in round 0 (the draft's lag, `draft`)
        starting = starting_context = 0  # requests whose round this call starts (the round's cost)
        weighted_passes = self.packs_passes and not padded and not self._split_r
        if weighted_passes:  # per pass of the round (its index from the round's start): rows, Σ base context
            counts, bases = [0] * (k_max + 1), [0] * (k_max + 1)
        for rid, k in zip(req_ids, lengths):
            r = reqs[rid]
            if k <= 0:
                out.append([])
                continue
            j0 = r.drafted
            if r.finished:
                raise ValueError(f"request {rid} is finished")
            if j0 + k > k_max:
                raise ValueError(f"request {rid} would draft more than K_max={k_max} tokens this round")
            out.append(chain[r.p][j0: j0 + k])
            weighted += k * (r.context + j0) + k * (k - 1) / 2
            drafted += k
            r.drafted = j0 + k
            ending[k] += 1
            if k > rounds:
                rounds = k
            if j0 == 0:
                starting += 1
                starting_context += r.context
            if padded:
                longest[k] = max(longest[k], r.context + j0)
                shortest[k] = min(shortest[k], r.context + j0)
                if j0 == 0 and r.lag > width:
                    width = r.lag
            if weighted_passes:  # difference arrays: the row is in passes j0 .. j0 + k − 1
                counts[j0] += 1
                counts[j0 + k] -= 1
                bases[j0] += r.context
                bases[j0 + k] -= r.context
            r.lag = 1
        if padded and not self._split_r:
            dt = self._padded_rounds_s(ending, longest, shortest, rounds, width)
        elif weighted_passes:
            n = base = 0
            per_pass = []
            for i in range(k_max):
                n += counts[i]
                base += bases[i]
                per_pass.append((n, base + n * i))  # pass i attends each row's context + i drafts
            dt = self._packed_rounds_s(per_pass, rounds, starting, starting_context)
            starting = 0  # the round is priced
        else:
            dt = self._rounds_s(weighted, drafted, rounds, ending)
        if self._round is not None and starting and not self._split_r:
            dt += self._round.forward(starting_context, starting)
        self._step_passes += rounds
        self._clock += dt
        self._draft_since_verify += dt
        self.totals["draft_s"] += dt
        return out

    def verify(self, plan: Mapping[int, int]) -> StepOutcome:
        """Accept per the trace (module docstring), commit accepted + 1 tokens, charge one target pass."""
        tr = self.traces
        match, tt = tr.match, tr.target_token
        greedy = self.temperature == 0
        req_ids = list(plan)
        drafted_l, verified_l, accepted_l, committed_l, finished_l, pos_l = [], [], [], [], [], []
        context = tokens = longest = widest = 0
        shortest = 1 << 62
        reqs = self._reqs
        for rid, n in plan.items():
            r = reqs[rid]
            if r.finished:
                raise ValueError(f"request {rid} is finished")
            k = r.drafted
            n = 0 if n < 0 else (k if n > k else n)
            p, off, rn = r.p, r.off, r.n
            if greedy:  # `_accept_greedy`, inlined: this loop runs per request per step
                m = match[p]
                a = n if n < m else m
                if off + a < rn:  # no wrap: the accepted drafts and the bonus are the trace's next tokens
                    new = tt[p: p + a + 1]
                else:
                    new = [tt[r.base + (off + i) % rn] for i in range(a + 1)]
            else:
                a, new = self._accept_sampled(r, n)
            c = len(new)
            room = r.room
            finished = c >= room
            if finished:
                c = room
                new = new[:c]
                r.finished = True
            ctx = r.context
            context += ctx
            tokens += n + 1
            if ctx > longest:
                longest = ctx
            if ctx < shortest:
                shortest = ctx
            if n + 1 > widest:
                widest = n + 1
            r.lag = draft_lag(r.lag, k, a)
            r.out.extend(new)
            off += c  # advance (inlined: this loop runs per request per step)
            if off >= rn:
                off %= rn
            r.off = off
            r.p = r.base + off
            r.g += c
            r.context = ctx + c
            r.room = room - c
            r.drafted = 0
            drafted_l.append(k)
            verified_l.append(n)
            accepted_l.append(a)
            committed_l.append(new)
            finished_l.append(finished)
            pos_l.append(p)
        if not req_ids:
            dt = 0.0
        elif self._split_r:  # under an SM split: FASER's target model (module docstring, "Clock")
            dt = self.faser.verify_time(len(req_ids), tokens / len(req_ids) - 1, self._split_r)  # type: ignore[union-attr]
        elif self.padded_batches:  # every row padded to the longest context and the widest feed
            dt = self._target_pass_s(len(req_ids) * longest, len(req_ids) * widest, widest == 1, shortest == longest)
        else:
            dt = self._target_pass_s(context, tokens, tokens <= len(req_ids))
        self._clock += dt
        self.totals["verify_s"] += dt
        draft_s, self._draft_since_verify = self._draft_since_verify, 0.0
        self._end_step()
        return StepOutcome(req_ids=req_ids, drafted=drafted_l, verified=verified_l, accepted=accepted_l,
                           committed=committed_l, finished=finished_l,
                           target_probs=_TraceSlices(tr.target_probs, pos_l, verified_l),
                           klds=_TraceSlices(tr.klds, pos_l, verified_l),
                           draft_time_s=draft_s, verify_time_s=dt)

    def _end_step(self) -> None:
        """A step's drafting is over: its passes price the next prefill-only step's proposal (`add`), and
        rows admitted into it no longer ride its passes."""
        if self._step_passes:
            self._last_step_passes = self._step_passes
        self._joining, self._step_passes = None, 0

    def _accept_greedy(self, r: _SimRequest, n: int) -> tuple[int, list[int]]:
        """T=0: of n verified drafts the first min(n, m) are accepted; the committed tokens (accepted
        drafts and the bonus) are the trace's next a + 1 tokens, wrapping around its end."""
        tt, p = self.traces.target_token, r.p
        a = min(n, self.traces.match[p])
        if r.off + a < r.n:
            return a, tt[p: p + a + 1]
        return a, [tt[r.base + (r.off + i) % r.n] for i in range(a + 1)]

    def _accept_sampled(self, r: _SimRequest, n: int) -> tuple[int, list[int]]:
        """T>0: chain position j is accepted with its recorded probability (the proposal rule's row,
        `set_draft_sampling`) until the first rejection, each against its fixed draw; the committed
        tokens are the chain's accepted drafts and the trace's target token after them."""
        tr, p = self.traces, r.p
        a = self._realised_run(r, n)
        new = tr.chain_tokens[p][:a]
        new.append(tr.target_token[r.base + (r.off + a) % r.n])
        return a, new

    @property
    def packs_passes(self) -> bool:
        """Whether draft rounds are priced pass by pass (`_packed_rounds_s`): the passes have weights, or
        rows admitted into the step ride them (a vLLM profile's simulator). Else `_rounds_s`'s closed form."""
        return self._pass_weights is not None or self._joining is not None

    def _packed_rounds_s(self, per_pass: list[tuple[int, int]], rounds: int, starting: int,
                         starting_context: int) -> float:
        """One step's draft rounds on packed rows, `per_pass[i]` = (rows, Σ their context) of its pass i
        (`rounds` passes drafting), and the round's cost over the `starting` requests (Σ
        `starting_context`) whose round it starts. Rows admitted into the step (`_joining`: vLLM drafts
        for a request in the step that prefills it) ride passes 1..rounds − 1 and the round, once — their
        pass 0 feeds the prompt, the draft's prefill `add` priced."""
        joining = self._joining
        if joining is not None and rounds:
            jn, jc = joining
            per_pass = ([per_pass[0]] + [(n + jn, c + jc + jn * i) for i, (n, c) in enumerate(per_pass[1:rounds], 1)]
                        + list(per_pass[rounds:]))
            starting, starting_context = starting + jn, starting_context + jc
            self._joining = None  # charged once: a frontier step drafts its chunks in several calls
        dt = self._weighted_rounds_s(per_pass)
        if self._round is not None and starting:
            dt += self._round.forward(starting_context, starting)
        return dt

    def _weighted_rounds_s(self, per_pass: Sequence[tuple[int, int]]) -> float:
        """Draft passes priced one by one, `per_pass[i]` = (rows, Σ their context) of a round's pass i:
        w_{i+1}·(α·N_c + γ·n + δ + λ·log2 n + μ·[n ≥ 2]) — the weights (`SimCosts.draft_pass_weights`) price
        a pass by its place in the round."""
        _, g, d = self._draft_coef
        alpha, lam, multi, weights = self._draft_alphas[1], self._draft_lam, self._draft_multi, self._pass_weights
        dt = 0.0
        for i, (n, context) in enumerate(per_pass):
            if n <= 0:
                continue
            t = alpha * context + g * n + d
            if lam:
                t += lam * math.log2(n)
            if n >= 2:
                t += multi
            dt += t * (1.0 if weights is None else weights[i] if i < len(weights) else weights[-1])
        return dt

    def _rounds_s(self, weighted: float, drafted: int, rounds: int, ending: list[int]) -> float:
        """Draft passes of `rounds` rounds (`draft_rounds`): α·weighted + γ·drafted + δ·rounds (+ Σ_j
        λ·log2 n_j + μ·[n_j ≥ 2]), or FASER's T_q(n_j, 1, r) per round under an SM split; `ending[k]`
        requests draft k."""
        # packed rows: every round feeds one token per request, a decode pass
        _, g, d = self._draft_coef
        dt = self._draft_alphas[1] * weighted + g * drafted + d * rounds
        if (self._draft_lam or self._draft_multi or self._split_r) and rounds:
            n_j, log_sum, split_s, multi_rounds = 0, 0.0, 0.0, 0  # round j drafts n_j: requests with > j drafts
            for j in range(rounds, 0, -1):
                n_j += ending[j]
                if self._split_r:
                    split_s += self.faser.draft_time(n_j, 1, self._split_r)  # type: ignore[union-attr]
                else:
                    log_sum += math.log2(n_j)
                    multi_rounds += n_j >= 2
            dt = split_s if self._split_r else dt + self._draft_lam * log_sum + self._draft_multi * multi_rounds
        return dt

    def _padded_rounds_s(self, ending: list[int], longest: list[int], shortest: list[int], rounds: int,
                         width: int) -> float:
        """Draft passes of `rounds` rounds on a padded engine: round j feeds its n_j requests (those
        drafting more than j) `width` tokens each in round 0, 1 after, attending to the longest context
        among them (+ j drafts); `ending[k]` / `longest[k]` / `shortest[k]`: how many requests draft k
        tokens, and the longest and shortest context of those (rows of one length, one token each, are
        a decode pass)."""
        _, g, d = self._draft_coef
        lam = self._draft_lam
        dt, n_j, top, bottom = 0.0, 0, 0, 1 << 62
        for j in range(rounds - 1, -1, -1):
            n_j += ending[j + 1]
            top = max(top, longest[j + 1])
            bottom = min(bottom, shortest[j + 1])
            tokens = n_j * (width if j == 0 else 1)
            alpha = _pass_alpha(self._draft_alphas, tokens == n_j, bottom == top)
            dt += alpha * n_j * (top + j) + g * tokens + d
            if lam:
                dt += lam * math.log2(tokens)
            if tokens >= 2:
                dt += self._draft_multi
        return dt

    def _uniform_padded_rounds_s(self, n: int, rounds: int, longest: int, shortest: int, width: int) -> float:
        """`_padded_rounds_s` when all n requests draft `rounds` tokens (the batch path's steps,
        engines/sim_batch.py): the same terms added in the same order, so the same float to the bit,
        without the per-length lists and the running max and min (every round feeds the same rows)."""
        _, g, d = self._draft_coef
        lam, multi = self._draft_lam, self._draft_multi
        one_length = shortest == longest
        alpha = _pass_alpha(self._draft_alphas, True, one_length)
        fed_s = g * n  # rounds after the first feed one token per row
        log_s = lam * math.log2(n) if lam else 0.0
        dt = 0.0
        for j in range(rounds - 1, 0, -1):
            dt += alpha * n * (longest + j) + fed_s + d
            if lam:
                dt += log_s
            if n >= 2:
                dt += multi
        tokens = n * width  # round 0 feeds the draft's lag
        dt += _pass_alpha(self._draft_alphas, tokens == n, one_length) * n * longest + g * tokens + d
        if lam:
            dt += lam * math.log2(tokens)
        if tokens >= 2:
            dt += multi
        return dt

    def step_time_s(self, contexts: Sequence[int], lengths: Sequence[int]) -> float:
        """`StepClock`: the seconds a plain step would take now — draft rounds of `lengths` (as
        `draft_rounds` charges them) and one verify of every draft (as `verify` charges it) — for
        requests with `contexts` tokens of KV. Nothing is drafted and the clock does not move. On a
        padded engine the draft's lag is not known for hypothetical requests: every pass feeds 1 token.
        (`step_time_rows` on arrays: the simulator's batch path asks it that way.)"""
        return self.step_time_rows(np.asarray(contexts, np.int64), np.asarray(lengths, np.int64))

    def step_time_rows(self, contexts: np.ndarray, lengths: np.ndarray) -> float:
        """`step_time_s` of int64 arrays, from the aggregates `draft_rounds` and `verify` price (sums of
        whole numbers, per-length counts and context extremes: exact in any order)."""
        n = len(contexts)
        if not n:
            return 0.0
        drafting = lengths > 0
        drafted = int(lengths.sum())
        rounds = int(lengths.max())
        ending = np.bincount(lengths[drafting], minlength=self.k_max + 1).tolist()
        if self._split_r:
            weighted = float(int((lengths * contexts).sum()) + int((lengths * (lengths - 1) // 2).sum()))
            verify_s = self.faser.verify_time(n, drafted / n, self._split_r)  # type: ignore[union-attr]
            return self._rounds_s(weighted, drafted, rounds, ending) + verify_s
        if self.padded_batches:
            longest, shortest = [0] * (self.k_max + 1), [1 << 62] * (self.k_max + 1)
            for k in np.flatnonzero(ending).tolist():
                rows = contexts[lengths == k]
                longest[k], shortest[k] = int(rows.max()), int(rows.min())
            top, bottom = int(contexts.max()), int(contexts.min())
            verify_s = self._target_pass_s(n * top, n * (rounds + 1), rounds == 0, top == bottom)
            return self._padded_rounds_s(ending, longest, shortest, rounds, 1) + verify_s
        verify_s = self._target_pass_s(int(contexts.sum()), drafted + n, drafted == 0)
        starting = int(drafting.sum())
        round_s = (self._round.forward(int(contexts[drafting].sum()), starting)
                   if self._round is not None and starting else 0.0)
        if self._pass_weights is not None:
            return self._weighted_rounds_s(passes_of(contexts, lengths, rounds)) + round_s + verify_s
        weighted = float(int((lengths * contexts).sum()) + int((lengths * (lengths - 1) // 2).sum()))
        return self._rounds_s(weighted, drafted, rounds, ending) + round_s + verify_s

    def step_parts_s(self, contexts: Sequence[int], lengths: Sequence[int],
                     prompts: Sequence[int] = ()) -> tuple[float, float]:
        """(draft seconds, target seconds) the simulator charges a step on packed rows (vLLM's layout)
        whose rows at `contexts[i]` draft `lengths[i]` tokens and are verified, with requests of
        `prompts[j]` prompt tokens prefilled inside it (fused prefill): the draft side is the rounds —
        the admitted requests' proposal riding them (`_admitted`) — and the draft's prefill per token,
        the target side the verify pass and the target's prefill per token. Pure: the clock does not
        move. benchmarks/vllm_admission_steps.py prices a vLLM replay's steps with it, each side against
        what vLLM's records measured. ValueError on padded rows or under an SM split."""
        if self.padded_batches or self._split_r:
            raise ValueError("step_parts_s prices packed rows without an SM split (a vLLM profile's simulator)")
        c, k = np.asarray(contexts, np.int64), np.asarray(lengths, np.int64)
        drafted, rounds = int(k.sum()), int(k.max()) if len(k) else 0
        per_pass = passes_of(c, k, rounds)
        tokens, square_tokens = int(sum(prompts)), int(sum(p * p for p in prompts))
        saved = self._joining
        proposing = bool(prompts) and self._admission_rounds and self._speculative
        self._joining = (len(prompts), tokens + len(prompts)) if proposing else None
        try:
            draft = (self._packed_rounds_s(per_pass, rounds, int((k > 0).sum()), int(c[k > 0].sum()))
                     if rounds else 0.0)
        finally:
            self._joining = saved
        (at, _), (ad, _), (st, sd) = self.costs.prefill_target, self.costs.prefill_draft, self.costs.prefill_square
        if self._speculative:
            draft += max(0.0, ad) * tokens + sd * square_tokens
        target = (self._target_pass_s(int(c.sum()), drafted + len(c), drafted == 0)
                  + max(0.0, at) * tokens + st * square_tokens)
        return draft, target

    def _target_pass_s(self, context: int, tokens: int, decode: bool, one_length: bool = True) -> float:
        """One target pass on the clock model: α·N_c + γ·N_b + δ (+ λ·log2 N_b + μ·[N_b ≥ 2]), N_b = tokens
        fed; α of a decode pass when `decode` (one token per row), masked unless `one_length` (rows of
        one length, or packed rows: only the padded torch engine masks ragged rows; `_pass_alpha`). A
        pass that verifies drafts is priced by the drafting engine's clock when the fit has one."""
        if not decode and self._drafting_target is not None:
            return self._drafting_target.forward(context, tokens)
        _, g, d = self._target_coef
        dt = _pass_alpha(self._target_alphas, decode, one_length) * context + g * tokens + d
        if self._target_lam:
            dt += self._target_lam * math.log2(tokens)
        if tokens >= 2:
            dt += self._target_multi
        return dt

    # ------------------------------------------------------------------ FASER frontier overlap
    # Kept apart from the hot draft/verify paths above: only strategies with execution.chunk_size use it.
    frontier_chunk: "int | str | None" = None  # configure_execution sets it; the serving step reads it
    sm_split: float = 0.0
    faser: FaserModels | None = None
    _split_r: float = 0.0  # sm_split when `faser` prices it (an r axis), else 0: the plain passes' switch

    def configure_execution(self, execution, faser: FaserModels | None = None) -> None:
        """The execution knobs the simulator models (an `ExecutionSpec`, duck-typed: engines do not import
        strategies): the frontier chunk (an int, "auto" — resolved per step by the serving step — or
        None) and the SM split r, which prices frontier steps by FASER's overlapped timing and plain
        steps by FASER's per-split pass models when `faser` (the fit's piecewise models) has an r axis
        (`frontier_step`, module docstring "Clock"). Token-wise early exit is not
        modelled: the traces hold no per-layer ranks."""
        chunk = execution.chunk_size
        self.frontier_chunk = chunk if isinstance(chunk, str) else (int(chunk) or None)
        self.faser = faser
        self._apply_split(execution.sm_split)

    def set_step_sm_split(self, r: float | None) -> float | None:
        """The SM split r of the next steps' passes (`StepSmSplit`; GP-LCB's per-step choice): frontier
        steps (`frontier_step`) and plain ones (module docstring, "Clock") are priced at r when the FASER
        models know r. Returns r (None for no split): the simulator applies any r in [0, 1)."""
        return self._apply_split(r)

    def _apply_split(self, r: float | None) -> float | None:
        r = float(r or 0.0)
        if not 0.0 <= r < 1.0:
            raise InputError(f"SM split fraction must be in [0, 1), got {r}", field="sm_split")
        self.sm_split = r
        self._split_r = r if r > 0 and self.faser is not None and self.faser.has_r_axis else 0.0
        return r or None

    def frontier_step(self, lengths: Mapping[int, int], chunk: int) -> StepOutcome:
        """One step with FASER's frontier overlap, as `TorchSDEngine.frontier_step` runs it.

        Tokens: request i drafts up to lengths[i] (≤ K_max) tokens in chunks of `chunk`; chunk c is
        verified in its own target pass (chunk + 1 positions: the last committed token and the chunk);
        while it is verified the next chunk is drafted. A fully accepted chunk commits its drafts without
        a bonus token and the step goes on with the pre-drafted next chunk; at the first rejection the
        request commits the correction token, its pre-drafted chunk is thrown away and no later chunk is
        verified; after its last chunk is fully accepted it gets the bonus token. Acceptance is decided
        exactly as `verify` decides it for the same drafts (the same fixed draws), so the
        committed tokens are those of a plain step drafting and verifying lengths[i] — lossless.
        `drafted` counts every draft made (a thrown-away chunk too), `verified` the drafts that went
        to the target.

        Time, without an SM split (or without FASER models that know r): serial, every pass on the
        sim's clock model — the first chunk's draft passes, then per chunk the next chunk's draft passes
        and the chunk's target pass; draft_time_s is all draft passes, verify_time_s all target passes.
        With r = sm_split > 0 and an r axis: FASER's overlapped timing from the piecewise models
        (latency.FaserModels), T = T_q(first chunk; r) + Σ_c max(T_p(chunk c; 1 − r), T_q(chunk c+1;
        r)) — for s drafts in chunks of s_c, all accepted, T_q(s_c) + (s/s_c)·T_p(s_c) when drafting
        hides behind verifying; draft_time_s is the first chunk's drafting, verify_time_s the rest."""
        if chunk < 1:
            raise InputError(f"frontier chunk size must be >= 1, got {chunk}", field="chunk_size")
        tr, reqs, k_max = self.traces, self._reqs, self.k_max
        greedy = self.temperature == 0
        ids = list(lengths)
        made_l, verified_l, accepted_l, committed_l, finished_l, tp_l, kl_l = [], [], [], [], [], [], []
        schedules = []  # per request: [(drafts verified, drafts made during that pass, committed before)]
        first = []  # per request: drafts of the first chunk
        for rid in ids:
            r = reqs[rid]
            if r.finished:
                raise ValueError(f"request {rid} is finished")
            t = max(0, min(int(lengths[rid]), k_max))
            # acceptance and tokens as `verify` decides them for t drafts (same draws, same order)
            a, new = self._accept_greedy(r, t) if greedy else self._accept_sampled(r, t)
            first.append(min(chunk, t))
            passes, made, verified, accepted, committed = _frontier_walk(t, a, chunk, r.room)
            schedules.append(passes)
            made_l.append(made)
            verified_l.append(verified)
            accepted_l.append(accepted)
            committed_l.append(new[:committed])
            finished_l.append(committed >= r.room)
            tp_l.append(tr.target_probs[r.p][:verified])
            kl_l.append(tr.klds[r.p][:verified])
        draft_s, verify_s = self._frontier_time(ids, first, schedules)
        for rid, new, fin, made, acc in zip(ids, committed_l, finished_l, made_l, accepted_l):  # after timing
            r = reqs[rid]
            r.lag = draft_lag(r.lag, made, acc)
            r.out.extend(new)
            r.advance(len(new))
            r.drafted = 0
            r.finished = fin
        return StepOutcome(req_ids=ids, drafted=made_l, verified=verified_l, accepted=accepted_l,
                           committed=committed_l, finished=finished_l, target_probs=tp_l, klds=kl_l,
                           draft_time_s=draft_s, verify_time_s=verify_s)

    def _frontier_time(self, ids: list[int], first: list[int],
                       schedules: list[list[tuple[int, int, int]]]) -> tuple[float, float]:
        """Charge a frontier step's passes to the clock (see `frontier_step`); (draft_s, verify_s)."""
        reqs = self._reqs
        r_split, faser = self.sm_split, self.faser
        overlapped = r_split > 0 and faser is not None and faser.has_r_axis
        n_rounds = max(map(len, schedules), default=0)

        def draft_passes(counts: list[int]) -> float:  # overlapped: one T_q(b, 1, r) per draft pass
            return sum(faser.draft_time(sum(1 for k in counts if k > j), 1, r_split)
                       for j in range(max(counts, default=0)))

        if overlapped:
            draft_s = draft_passes(first)
        else:
            self.draft_rounds(ids, first)  # the first chunk, on the hot path's clock
            draft_s = 0.0
        verify_s = 0.0
        for k in range(n_rounds):
            active = [(rid, sch[k]) for rid, sch in zip(ids, schedules) if len(sch) > k]
            drafting = [(rid, more) for rid, (_, more, _) in active if more > 0]
            lens = [reqs[rid].context + before for rid, (_, _, before) in active]
            if self.padded_batches:
                context = len(active) * max(lens)
                tokens = len(active) * max(n + 1 for _, (n, _, _) in active)
                one_length = min(lens) == max(lens)
            else:
                context = sum(lens)
                tokens = sum(n + 1 for _, (n, _, _) in active)
                one_length = True  # packed rows: no mask
            decode = tokens == len(active)
            if overlapped:
                b = len(active)
                target_s = faser.verify_time(b, tokens / b - 1, r_split)
                verify_s += max(target_s, draft_passes([m for _, m in drafting]))
            else:
                if drafting:  # the next chunk, drafted while this one is verified (serially here)
                    self.draft_rounds([rid for rid, _ in drafting], [m for _, m in drafting])
                dt = self._target_pass_s(context, tokens, decode, one_length)
                self._clock += dt
                self.totals["verify_s"] += dt
                verify_s += dt
        if overlapped:
            self._clock += draft_s + verify_s
            self.totals["draft_s"] += draft_s
            self.totals["verify_s"] += verify_s
        draft_s, self._draft_since_verify = self._draft_since_verify + draft_s, 0.0
        self._end_step()
        return draft_s, verify_s


def _frontier_walk(t: int, a: int, chunk: int, room: int) -> tuple[list[tuple[int, int, int]], int, int, int, int]:
    """The chunk walk of `TorchSDEngine.frontier_step` for one request drafting t tokens of which the
    first a are accepted, with room for `room` more tokens: its target passes as (drafts verified,
    drafts made during that pass, tokens committed before it), then the drafts made, verified and
    accepted and the tokens committed over the step."""
    made = min(chunk, t)
    verified = accepted = committed = 0
    passes = []
    while True:
        n = min(chunk, made - verified)
        more = min(made + chunk, t) - made
        made += more
        got = min(n, a - verified)
        passes.append((n, more, committed))
        verified += n
        accepted += got
        if more > 0 and got == n:  # carried: no bonus, the pre-drafted chunk is verified next
            committed += min(n, room - committed)
            if committed >= room:
                break
            continue
        committed += min(got + 1, room - committed)
        break
    return passes, made, verified, accepted, committed
