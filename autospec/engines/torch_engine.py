"""autospec's own PyTorch speculative-decoding engine over any Hugging Face Llama/Qwen2/Qwen3 pair.

Bookkeeping, per request:
  target cache  holds every committed token except the last one (`last_token`), which the next
                verify feeds first, followed by the drafts being verified;
  draft cache   holds a prefix of the committed tokens; `pending` are the committed tokens it has not
                seen yet (one or two after a verify, more when the request was not drafted for a while).
Drafting k tokens feeds `pending` then d1..d_{k-1}; after a verify that accepts a of them, both caches
are rolled back by lowering their lengths — rejected positions are never attended to again.

Acceptance is lossless: at T=0 a draft token is kept only if it equals the target's argmax (so output is
token-identical to plain greedy decoding); at T>0 it is kept with probability min(1, p/q) and a rejection
resamples from norm(max(0, p - q)) (Leviathan et al. 2023; Chen et al. 2023), with the bonus token from
the target after a fully accepted block.

FASER's execution mechanisms (docs/policies.md §4), each lossless by the same argument:
  early exit    `verify` cuts drafts out of the target's remaining layers (`_early_exit_hook`); the
                position before the first cut draft runs to full depth, so that draft is tested
                normally; if it is accepted the step ends without a bonus token (d_a becomes
                `last_token`, nothing after it is in either cache) — a shorter step, not a different one.
  frontier      `frontier_step` verifies a step in chunks; a fully accepted chunk commits its drafts
                without a bonus and keeps the drafts made after it (they were drafted on top of it), so
                the next chunk's first draft is tested against the target's next position. Its
                draft_time_s + verify_time_s is the step's time: drafting overlapped with a verify pass
                (CUDA) counts as verify time only, drafting run serially (CPU) as draft time only.
  SM split      draft and target run in their own green context and stream (engines/sm_split.py);
                on CUDA the next chunk is drafted on a worker thread while the target verifies.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import torch
import torch.nn.functional as F

from autospec.contract import DraftToken, StepOutcome
from autospec.early_exit import rank_threshold, ratio_times, should_prune, start_layer
from autospec.engines.base import GenRequest, PrefillResult
from autospec.engines.llama import CompactLlama, KVCache
from autospec.errors import InputError

if TYPE_CHECKING:
    from autospec.engines.sm_split import SMSplit

KL_CLAMP = 1e-8
ACCEPT_EWMA = 0.3  # weight of the newest round in a request's acceptance estimate â_i (Eq. 5) [chosen]
ACCEPT_PRIOR = 0.5  # â_i before a request's first verified draft [chosen]

# (batch, tokens per request, k̂_rej) -> (T_t(k̂_rej), T_ee, T_pr(k̂_rej)) seconds: a fitted FASER model's
# times for Eq. 10 (autospec/latency.py); without one the engine uses EarlyExitParams' cost ratios
# (early_exit.ratio_times).
EarlyExitTimes = Callable[[int, int, float], "tuple[float, float, float]"]


@dataclass
class _Request:
    req_id: int
    prompt_len: int
    max_tokens: int
    ignore_eos: bool
    slot: int
    output: list[int] = field(default_factory=list)
    target_len: int = 0  # tokens in the target cache
    last_token: int = -1  # committed, not yet in the target cache
    draft_len: int = 0  # tokens in the draft cache
    pending: list[int] = field(default_factory=list)  # committed, not yet in the draft cache
    # the current round's drafts
    drafts: list[DraftToken] = field(default_factory=list)
    draft_probs: list[torch.Tensor] = field(default_factory=list)  # q distribution each draft was sampled from
    round_draft_len: int = 0  # draft_len and pending length when this round's first draft was made
    round_pending: int = 0
    round_greedy: bool = False  # this round's proposals were the draft's argmax (point masses)
    finished: bool = False
    acceptance: float = ACCEPT_PRIOR  # EWMA of accepted / verified (â_i, for early exit's Eq. 5)


class TorchSDEngine:
    """Target + draft CompactLlama with per-request KV caches; implements `autospec.engines.base.Engine`.

    Capabilities: FrontierStep, ExecutionConfig, DraftSampling (autospec.engines.base; a real engine's
    drafting is one forward pass per round, so it has no batched draft rounds, and it knows no true
    match length or swap cost; on a CUDA device it also offers StepSmSplit, which a CPU engine does not:
    there are no SMs to split, so a CPU engine has no `set_step_sm_split` and a strategy that chooses a
    split per step is refused before its replay starts).
    """

    def __init__(
        self,
        target_dir: "str | Path | CompactLlama",
        draft_dir: "str | Path | CompactLlama | None",
        *,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        temperature: float = 0.0,
        k_max: int = 8,
        seed: int = 0,
        draft_sampling: str = "sample",
        early_exit: Any = None,
        early_exit_times: EarlyExitTimes | None = None,
        sm_split: float | None = None,
    ):
        """`early_exit`: an `EarlyExitParams` (autospec/early_exit.py) turns on FASER's
        token-wise early exit inside `verify`; `early_exit_times` gives Eq. 10 its times (else the
        params' cost ratios). `sm_split` r in (0, 1): draft and target run in green contexts holding r
        and 1 − r of the SMs (CUDA only; see autospec/engines/sm_split.py)."""
        if temperature < 0:
            raise InputError(f"temperature must be >= 0, got {temperature}", field="temperature")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise InputError(f"device {device} needs a CUDA GPU and none is available", field="device")
        self.sm_split: "SMSplit | None" = None
        if sm_split:
            from autospec.engines.sm_split import require_cuda

            require_cuda()  # before loading any weights
        self.device = torch.device(device)

        def load(model: "str | Path | CompactLlama") -> CompactLlama:  # a directory, or a built model
            return model if isinstance(model, CompactLlama) else CompactLlama(model, self.device, dtype)

        self.target = load(target_dir)
        self.draft_model = load(draft_dir) if draft_dir is not None else None
        if self.draft_model is not None and self.draft_model.shape.vocab_size != self.target.shape.vocab_size:
            raise InputError(
                f"draft vocabulary ({self.draft_model.shape.vocab_size}) does not match the target's "
                f"({self.target.shape.vocab_size})", path=draft_dir)
        self.temperature = float(temperature)
        self.k_max = k_max
        self.draft_sampling = draft_sampling  # "sample" | "greedy" (see set_draft_sampling)
        self.eos_ids = set(self.target.shape.eos_token_ids)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.target_cache: KVCache = self.target.new_cache()
        self.draft_cache: KVCache | None = self.draft_model.new_cache() if self.draft_model is not None else None
        self._requests: dict[int, _Request] = {}
        self._by_slot: list[int] = []  # slot -> req_id; active requests always occupy slots 0..n-1
        self._next_id = 0
        self._draft_ns_since_verify = 0
        self.totals = {"prefill_s": 0.0, "draft_s": 0.0, "verify_s": 0.0, "early_exit_s": 0.0}
        self.early_exit = early_exit
        self.early_exit_times = early_exit_times
        self.early_exit_stats = {"verified": 0, "pruned": 0}  # draft tokens over the engine's life
        if sm_split:
            self.set_sm_split(float(sm_split))
        if self.device.type == "cuda":  # StepSmSplit: only a GPU has SMs to split (class docstring)
            self.set_step_sm_split = self._set_step_sm_split
        self._draft_generator = self.generator  # a separate one while draft and verify overlap on CUDA
        self.frontier_chunk: int | str | None = None  # configure_execution sets it (an int or "auto"); sd_step reads it

    # ------------------------------------------------------------------ helpers
    @property
    def max_context(self) -> int | None:
        """The most positions a request may occupy: the smaller model's max_position_embeddings."""
        limits = [m.shape.max_positions for m in (self.target, self.draft_model) if m is not None]
        known = [n for n in limits if n]
        return min(known) if known else None

    def check_fits(self, prompt_len: int, max_tokens: int) -> None:
        """Refuse a request that cannot fit the models' context window: its prompt, every token it may
        generate and the K_max drafts a last round may verify past them [chosen: reject, never clip —
        clipping is the workload's choice (max_prompt_tokens), and a prompt run past the window returns
        garbage and, at a megabyte, asked for a 193 GB KV cache]."""
        limit = self.max_context
        need = prompt_len + max_tokens + self.k_max
        if limit is not None and need > limit:
            raise InputError(f"a request of {prompt_len} prompt tokens + up to {max_tokens} new ones (+ K_max "
                             f"{self.k_max} drafts) needs {need} positions, more than the models' context window "
                             f"of {limit}; shorten it (a workload's max_prompt_tokens / max_output_tokens clip "
                             "its requests)", field="prompt")

    def check_all_fit(self, shapes: Iterable[tuple[str, int, int]], field: str) -> None:
        """check_fits for every (name, prompt length, max new tokens) before any runs, the first refusal
        naming its request (e.g. "request r12", "prompt 3") under `field`."""
        for name, prompt_len, max_tokens in shapes:
            try:
                self.check_fits(prompt_len, max_tokens)
            except InputError as exc:
                raise InputError(f"{name}: {exc.problem}", field=field) from None

    def now(self) -> float:
        return time.perf_counter()

    def idle_until(self, t: float) -> None:
        """Sleep until perf_counter() reaches `t`: a real engine's clock is wall time (see Engine)."""
        gap = t - time.perf_counter()
        if gap > 0:
            time.sleep(gap)

    def _sync(self) -> None:
        # The current stream only: while draft and target overlap on their own streams, a
        # device-wide synchronize would serialise them.
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _pad(self, seqs: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(s) for s in seqs)
        tokens = torch.zeros(len(seqs), width, dtype=torch.long)
        for i, s in enumerate(seqs):
            tokens[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
        q_lens = torch.tensor([len(s) for s in seqs], dtype=torch.long)
        return tokens.to(self.device), q_lens.to(self.device)

    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution tokens are drawn from: softmax(logits / T), or softmax(logits) at T=0."""
        t = self.temperature if self.temperature > 0 else 1.0
        return torch.softmax(logits.float() / t, dim=-1)

    def _choose(self, probs: torch.Tensor, logits: torch.Tensor, generator: torch.Generator | None = None
                ) -> torch.Tensor:
        if self.temperature == 0:
            return logits.argmax(dim=-1)
        flat = probs.reshape(-1, probs.shape[-1])
        return torch.multinomial(flat, 1, generator=generator or self.generator).view(probs.shape[:-1])

    def _commit(self, req: _Request, tokens: Sequence[int]) -> list[int]:
        """Append tokens until max_tokens or EOS; returns what was actually appended."""
        kept = []
        for tok in tokens:
            req.output.append(tok)
            kept.append(tok)
            if len(req.output) >= req.max_tokens or (not req.ignore_eos and tok in self.eos_ids):
                req.finished = True
                break
        return kept

    def set_draft_sampling(self, mode: str) -> None:
        """At T>0 the draft either samples its proposal ("sample") or proposes its argmax ("greedy"),
        which verification then treats as a point mass: accept with probability p(d), else resample from
        p with d removed. Both are lossless; greedy keeps any verify rule that looks at the proposals'
        confidences lossless too, because the proposals are then not random."""
        if mode not in ("sample", "greedy"):
            raise InputError(f"draft_sampling must be 'sample' or 'greedy', got {mode!r}", field="draft_sampling")
        self.draft_sampling = mode

    def configure_execution(self, execution: Any, faser: Any = None) -> None:
        """Apply a strategy's execution config (autospec.strategy.ExecutionSpec, duck-typed: engines do not
        import strategies): early exit on/off with its constants, the frontier chunk size (an int, or
        "auto": the serving step picks it per step), the SM split. `faser` — the fit's
        `latency.FaserModels` — gives early exit's Eq. 10 the fitted T_t, T_ee and T_pr at this split
        when the profile timed them; otherwise Eq. 10 keeps the constructor's `early_exit_times` (or
        the params' cost ratios)."""
        self.early_exit = execution.early_exit_params if execution.early_exit else None
        chunk = execution.chunk_size
        self.frontier_chunk = chunk if isinstance(chunk, str) else (int(chunk) or None)
        r = float(execution.sm_split or 0.0)
        self.set_sm_split(r or None)
        fitted = faser.early_exit_times(r) if faser is not None else None
        if fitted is not None:
            self.early_exit_times = fitted

    def set_sm_split(self, r: float | None) -> None:
        """Run draft and target in green contexts with r and 1 − r of the SMs (None: the whole GPU).
        Contexts are created once per r and kept in a pool. Without CUDA: a one-line InputError."""
        if r is None:
            self.sm_split = None
            return
        from autospec.engines.sm_split import SMSplit, require_cuda

        require_cuda()
        if self.device.type != "cuda":
            raise InputError(f"SM split needs device cuda, got {self.device}", field="device")
        pool = getattr(self, "_split_pool", None)
        if pool is None or r not in pool.counts:
            pool = self._split_pool = SMSplit(self.device, [r] + (list(pool.counts) if pool else []))
        pool.select(r)
        self.sm_split = pool

    def _set_step_sm_split(self, r: float | None) -> float | None:
        """`StepSmSplit.set_step_sm_split`, bound on the instance on CUDA only (class docstring): the next
        steps' passes run in the green contexts of split r (None or 0: the whole GPU); a split not in
        the pool yet is created on first use. Returns r (None: no split)."""
        self.set_sm_split(float(r) if r else None)
        return float(r) if r else None

    def request(self, req_id: int) -> _Request:
        try:
            return self._requests[req_id]
        except KeyError:
            raise KeyError(f"unknown request id {req_id}") from None

    def active_ids(self) -> list[int]:
        return list(self._by_slot)

    def output(self, req_id: int) -> list[int]:
        return list(self.request(req_id).output)

    def is_finished(self, req_id: int) -> bool:
        return self.request(req_id).finished

    def context_len(self, req_id: int) -> int:
        r = self.request(req_id)
        return r.prompt_len + len(r.output)

    def kv_bytes(self) -> int:
        return self.target_cache.nbytes() + (self.draft_cache.nbytes() if self.draft_cache is not None else 0)

    # ------------------------------------------------------------------ add / prefill
    @torch.inference_mode()
    def add(self, requests: Sequence[GenRequest]) -> PrefillResult:
        if not requests:
            return PrefillResult([], [], [], 0.0)
        for r in requests:
            if len(r.prompt) == 0:
                raise InputError("a request has an empty prompt", field="prompt")
            if r.max_tokens < 1:
                raise InputError(f"max_tokens must be >= 1, got {r.max_tokens}", field="max_tokens")
            # the prompt itself must fit; whether its whole budget does is checked by the callers that take
            # requests from users (generate, evaluate): timing calls give requests a budget they never use
            self.check_fits(len(r.prompt), 0)
        t0 = time.perf_counter_ns()
        first_slot = len(self._by_slot)
        new = []
        for i, r in enumerate(requests):
            req = _Request(self._next_id, len(r.prompt), r.max_tokens, r.ignore_eos, first_slot + i)
            self._next_id += 1
            self._requests[req.req_id] = req
            self._by_slot.append(req.req_id)
            new.append(req)
        slots = len(self._by_slot)
        longest = max(len(r.prompt) for r in requests)
        tokens, q_lens = self._pad([r.prompt for r in requests])
        rows = torch.arange(first_slot, slots, device=self.device)
        zeros = torch.zeros(len(requests), dtype=torch.long, device=self.device)
        self.target_cache.ensure(slots, longest + 1)
        logits = self.target.forward(tokens, self.target_cache, rows, zeros, q_lens, logits_at=(q_lens - 1)[:, None])
        logits = logits[:, 0]
        first = self._choose(self._probs(logits), logits).tolist()
        if self.draft_model is not None:
            self.draft_cache.ensure(slots, longest + 1)
            self.draft_model.forward(tokens, self.draft_cache, rows, zeros, q_lens, logits_at=(q_lens - 1)[:, None])
        finished = []
        for req, r, tok in zip(new, requests, first):
            req.target_len = len(r.prompt)
            req.draft_len = len(r.prompt) if self.draft_model is not None else 0
            req.last_token = tok
            req.pending = [tok]
            self._commit(req, [tok])
            finished.append(req.finished)
        self._sync()
        elapsed = (time.perf_counter_ns() - t0) / 1e9
        self.totals["prefill_s"] += elapsed
        return PrefillResult([r.req_id for r in new], first, finished, elapsed)

    # ------------------------------------------------------------------ draft
    @torch.inference_mode()
    def draft(self, req_ids: Sequence[int]) -> list[DraftToken]:
        """One more draft token for each request in `req_ids` (one batched draft forward)."""
        if not req_ids:
            return []
        with self._phase("draft"):  # the draft's green context and stream under an SM split
            return self._draft(req_ids)

    def _draft(self, req_ids: Sequence[int]) -> list[DraftToken]:
        if self.draft_model is None:
            raise InputError("this engine has no draft model; use K=0", field="draft")
        t0 = time.perf_counter_ns()
        reqs = [self.request(i) for i in req_ids]
        for req in reqs:
            if req.finished:
                raise ValueError(f"request {req.req_id} is finished")
            if not req.drafts:
                req.round_draft_len, req.round_pending = req.draft_len, len(req.pending)
                req.round_greedy = self.temperature == 0 or self.draft_sampling == "greedy"
        tokens, q_lens = self._pad([req.pending for req in reqs])
        rows = torch.tensor([req.slot for req in reqs], dtype=torch.long, device=self.device)
        lens = torch.tensor([req.draft_len for req in reqs], dtype=torch.long, device=self.device)
        self.draft_cache.ensure(len(self._by_slot), int((lens + tokens.shape[1]).max()) + 1)
        logits = self.draft_model.forward(tokens, self.draft_cache, rows, lens, q_lens, logits_at=(q_lens - 1)[:, None])
        logits = logits[:, 0]
        probs = self._probs(logits)
        chosen = (logits.argmax(-1) if self.draft_sampling == "greedy"
                  else self._choose(probs, logits, self._draft_generator))
        conf = probs.gather(1, chosen[:, None])[:, 0]
        entropy = -(probs * torch.log(probs.clamp_min(KL_CLAMP))).sum(-1)
        out = []
        for i, (req, tok, c, h) in enumerate(zip(reqs, chosen.tolist(), conf.tolist(), entropy.tolist())):
            req.draft_len += len(req.pending)
            req.pending = [tok]
            d = DraftToken(tok, c, h)
            req.drafts.append(d)
            req.draft_probs.append(probs[i])
            out.append(d)
        self._sync()
        elapsed = time.perf_counter_ns() - t0
        self._draft_ns_since_verify += elapsed
        self.totals["draft_s"] += elapsed / 1e9
        return out

    def drafts_of(self, req_id: int) -> list[DraftToken]:
        return list(self.request(req_id).drafts)

    # ------------------------------------------------------------------ verify
    def _phase(self, which: str):
        """The green context + stream `which` ("draft" or "target") runs in under an SM split; a no-op
        context otherwise."""
        return nullcontext() if self.sm_split is None else self.sm_split.phase(which)

    @torch.inference_mode()
    def verify(self, plan: Mapping[int, int]) -> StepOutcome:
        """Run the target over `plan[req_id]` drafted tokens per request (0 = a plain decode step).

        Drafts beyond the verified count are discarded. Returns what each request committed plus the
        signals policies learn from. With early exit on, a request whose draft token was pruned
        commits the accepted drafts without a bonus token when every tested draft was accepted
        (module docstring of the early-exit helper `_early_exit_hook`).
        """
        return self._verify(plan)

    def _verify(self, plan: Mapping[int, int], carry: frozenset[int] = frozenset(),
                overlap: Callable[[], None] | None = None) -> StepOutcome:
        """`verify`, plus two things the frontier protocol needs: requests in `carry` that accept
        their whole verified chunk keep their further drafts (no bonus token; the next chunk's first
        draft is tested against this chunk's last position when it is verified), and `overlap` runs
        (the next chunk's drafting) while the target's forward pass is in flight."""
        t0 = time.perf_counter_ns()
        req_ids = list(plan)
        reqs = [self.request(i) for i in req_ids]
        for req in reqs:
            if req.finished:
                raise ValueError(f"request {req.req_id} is finished")
        verify_n = [max(0, min(int(plan[r.req_id]), len(r.drafts))) for r in reqs]
        feeds = [[r.last_token] + [d.token for d in r.drafts[:n]] for r, n in zip(reqs, verify_n)]
        draft_q = [list(r.draft_probs[:n]) for r, n in zip(reqs, verify_n)]  # snapshot: overlap appends
        greedy_l = [r.round_greedy for r in reqs]
        tokens, q_lens = self._pad(feeds)
        kept = [n + 1 for n in verify_n]  # feed positions per row that reach the last layer
        hook, ee_ns = None, [0]
        if self.early_exit is not None and tokens.shape[1] > 1:
            hook = self._early_exit_hook(tokens, kept, reqs, verify_n, ee_ns)
        draft_ns_before = self._draft_ns_since_verify
        logits, concurrent, serial_ns = self._target_pass(reqs, tokens, q_lens, hook, overlap)
        # Drafts tested against a full-depth distribution: up to and including the first pruned one.
        test_n = [min(n, k) for n, k in zip(verify_n, kept)]
        pruned_l = [n - (k - 1) if k <= n else 0 for n, k in zip(verify_n, kept)]
        acc_l, next_l, p_tok_l, kl_l = self._accept(logits, tokens, test_n, draft_q, greedy_l)
        committed, finished, target_probs, klds, drafted = [], [], [], [], []
        for i, (req, n) in enumerate(zip(reqs, verify_n)):
            tested = test_n[i]
            drafted.append(len(req.drafts))
            new_tokens = self._settle(req, n, acc_l[i], tested, next_l[i], pruned_l[i], req.req_id in carry)
            committed.append(self._commit(req, new_tokens))
            finished.append(req.finished)
            target_probs.append(p_tok_l[i][:tested])
            klds.append(kl_l[i][:tested])
        self._sync()
        # The step's time is draft_time_s + verify_time_s: drafting that runs at the same time as this pass
        # (CUDA) is inside verify_time_s and left out of draft_time_s; drafting run one after the other
        # (CPU) is draft time, taken out of verify_time_s.
        elapsed = (time.perf_counter_ns() - t0 - serial_ns) / 1e9
        self.totals["verify_s"] += elapsed
        draft_s = (draft_ns_before if concurrent else self._draft_ns_since_verify) / 1e9
        self._draft_ns_since_verify = 0
        pruned_out: list[int] = []
        if self.early_exit is not None:
            pruned_out = pruned_l
            self.early_exit_stats["verified"] += sum(verify_n)
            self.early_exit_stats["pruned"] += sum(pruned_l)
            self.totals["early_exit_s"] += ee_ns[0] / 1e9
        return StepOutcome(req_ids=req_ids, drafted=drafted, verified=verify_n, accepted=acc_l, committed=committed,
                           finished=finished, target_probs=target_probs, klds=klds, draft_time_s=draft_s,
                           verify_time_s=elapsed, early_exit_time_s=ee_ns[0] / 1e9, pruned=pruned_out)

    def _target_pass(self, reqs: list[_Request], tokens: torch.Tensor, q_lens: torch.Tensor,
                     hook: Callable[[int, torch.Tensor], int | None] | None,
                     overlap: Callable[[], None] | None) -> tuple[torch.Tensor, bool, int]:
        """The target's forward pass over the packed feeds, with `overlap` (the next chunk's drafting)
        run alongside it: on a worker thread on CUDA, before it on a CPU. Returns the logits [B, Q, V]
        (padded back to Q when early exit shortened the batch), whether the overlap ran concurrently,
        and the nanoseconds it took when it ran serially."""
        Q = tokens.shape[1]
        rows = torch.tensor([r.slot for r in reqs], dtype=torch.long, device=self.device)
        lens = torch.tensor([r.target_len for r in reqs], dtype=torch.long, device=self.device)
        future, serial_ns = None, 0
        if overlap is not None:
            if self.device.type == "cuda":
                future = self._overlap_pool().submit(overlap)
            else:
                o0 = time.perf_counter_ns()
                overlap()  # CPU: sequential, same bookkeeping
                serial_ns = time.perf_counter_ns() - o0
        with self._phase("target"):
            try:
                # grown on the target's stream, so the copy is ordered before the forward that reads it
                self.target_cache.ensure(len(self._by_slot), int((lens + Q).max()) + 1)
                logits = self.target.forward(tokens, self.target_cache, rows, lens, q_lens, layer_hook=hook)
                self._sync()  # the target's stream: the acceptance math below reads these logits
            finally:
                if future is not None:
                    future.result()
        if logits.shape[1] < Q:  # early exit shortened the batch; later positions are never read
            logits = F.pad(logits, (0, 0, 0, Q - logits.shape[1]))
        return logits, future is not None, serial_ns

    def _accept(self, logits: torch.Tensor, tokens: torch.Tensor, test_n: list[int], draft_q: list[list[torch.Tensor]],
                greedy_l: list[bool]) -> tuple[list[int], list[int], list[list[float]], list[list[float]]]:
        """The acceptance rule over a batch (module docstring): per request the accepted count, the next
        token (correction or bonus), and per draft position the target's probability and
        KL(target‖draft)."""
        Q = tokens.shape[1]
        p = self._probs(logits)  # [B, Q, V]
        B, V = len(test_n), p.shape[-1]
        # Draft distributions and tokens at the verified positions, padded to Q-1.
        q = torch.zeros(B, max(Q - 1, 1), V, device=self.device)
        draft_tok = torch.zeros(B, max(Q - 1, 1), dtype=torch.long, device=self.device)
        for i, n in enumerate(test_n):
            if n:
                q[i, :n] = torch.stack(draft_q[i][:n])
                draft_tok[i, :n] = tokens[i, 1: n + 1]
        n_t = torch.tensor(test_n, device=self.device)
        positions = torch.arange(q.shape[1], device=self.device)[None, :]
        valid = positions < n_t[:, None]
        p_draft_pos = p[:, : q.shape[1]] if Q > 1 else p[:, :1]
        p_tok = p_draft_pos.gather(2, draft_tok[:, :, None])[:, :, 0]
        q_tok = q.gather(2, draft_tok[:, :, None])[:, :, 0]
        if self.temperature == 0:
            target_choice = logits[:, : q.shape[1]].argmax(-1)
            ok = (target_choice == draft_tok) & valid
        else:
            # Greedy proposals are point masses: q(d) = 1, so acceptance is min(1, p(d)).
            greedy = torch.tensor(greedy_l, device=self.device)
            q_accept = torch.where(greedy[:, None], torch.ones_like(q_tok), q_tok)
            u = torch.rand(q_tok.shape, generator=self.generator, device=self.device)
            ok = (u * q_accept < p_tok) & valid  # accept with probability min(1, p/q)
        accepted = ok.long().cumprod(dim=1).sum(dim=1)  # leading run of accepted drafts
        # The next token: from the target at the first rejected position (residual distribution at
        # T>0), or the bonus position after a fully accepted block.
        idx = accepted
        rows = torch.arange(B, device=self.device)
        p_next = p[rows, idx]
        if self.temperature == 0:
            next_tok = logits[rows, idx].argmax(-1)
        else:
            rejected = accepted < n_t
            at = idx.clamp(max=q.shape[1] - 1)
            q_next = q[rows, at]
            point_mass = torch.zeros_like(q_next).scatter_(1, draft_tok[rows, at][:, None], 1.0)
            q_next = torch.where(greedy[:, None], point_mass, q_next)
            residual = (p_next - q_next).clamp_min(0)
            mass = residual.sum(-1, keepdim=True)
            residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_next)
            dist = torch.where(rejected[:, None], residual, p_next)
            next_tok = torch.multinomial(dist, 1, generator=self.generator)[:, 0]
        kl = (p_draft_pos * (torch.log(p_draft_pos.clamp_min(KL_CLAMP)) - torch.log(q.clamp_min(KL_CLAMP)))).sum(-1)
        return accepted.tolist(), next_tok.tolist(), p_tok.tolist(), kl.tolist()

    def _settle(self, req: _Request, n: int, a: int, tested: int, next_token: int, pruned: int,
                may_carry: bool) -> list[int]:
        """Fold one request's verdict into its caches (n verified, `tested` of them tested at full
        depth, a accepted, `pruned` cut by early exit) and return the tokens it commits. No bonus token
        when the whole tested run was accepted but the position after it did not reach full depth
        (early exit), or the request carries its further drafts (frontier, `may_carry`)."""
        k = len(req.drafts)
        base = req.round_draft_len + req.round_pending  # draft-cache position of this round's d_1
        if n:
            req.acceptance = (1 - ACCEPT_EWMA) * req.acceptance + ACCEPT_EWMA * a / n
        carried = may_carry and pruned == 0 and a == n and k > n
        if a == tested and a > 0 and (pruned > 0 or carried):
            new_tokens = [d.token for d in req.drafts[:a]]
            req.target_len += a  # last_token, d_1..d_{a-1}; d_a becomes the new last_token
            req.last_token = req.drafts[a - 1].token
            if carried:  # d_{a+1}.. stay: they were drafted after d_a, which is now committed
                req.drafts, req.draft_probs = req.drafts[a:], req.draft_probs[a:]
                req.round_draft_len, req.round_pending = base + a, 0
            else:  # the draft re-feeds d_a to get its next-token distribution
                req.draft_len = base + a - 1
                req.pending = [req.drafts[a - 1].token]
                req.drafts, req.draft_probs = [], []
            return new_tokens
        new_tokens = [d.token for d in req.drafts[:a]] + [next_token]
        # Roll the caches back to the accepted prefix (see the module docstring).
        req.target_len += 1 + a
        req.last_token = next_token
        if k == 0:
            req.pending = req.pending + [next_token]
        else:
            req.draft_len = base + min(a, k - 1)
            req.pending = ([req.drafts[k - 1].token] if a == k else []) + [next_token]
        req.drafts, req.draft_probs = [], []
        return new_tokens

    def _early_exit_hook(self, tokens: torch.Tensor, kept: list[int], reqs: list[_Request], verify_n: list[int],
                         spent_ns: list[int]) -> Callable[[int, torch.Tensor], int | None]:
        """FASER token-wise early exit (§4.2, docs/policies.md §4) as a CompactLlama layer hook.

        After each layer ℓ in [L_init, L − 2] the hidden state at feed position j (it predicts draft
        d_{j+1}) goes through the final norm + LM head; d_{j+1} is flagged when at least K_ℓ entries
        score above it. If Eq. 10 says pruning pays, each row's first flagged draft and everything
        after it leave the remaining layers: the row keeps positions 0..j, so the position that
        predicts the first pruned draft still runs to full depth and that draft gets the normal
        acceptance test; later pruned drafts are discarded like drafts after a rejection. `kept` (feed
        positions per row) is updated in place; the hook returns the batch's new width (the packed
        batch is cut to its longest surviving row; shorter rows are padding, as in any verify).
        """
        params = self.early_exit
        n_layers = self.target.shape.num_layers
        first = start_layer(n_layers, params.start_fraction)
        B = tokens.shape[0]
        k_rej = sum(n * (1.0 - r.acceptance) for r, n in zip(reqs, verify_n))  # Eq. 5
        # Eq. 6–10 at k̂_rej: T_t is the target's time for the tokens expected to be rejected
        if self.early_exit_times is not None:
            t_t, t_ee, t_pr = self.early_exit_times(B, tokens.shape[1], k_rej)
        else:
            t_t, t_ee, t_pr = ratio_times(params, sum(n + 1 for n in verify_n), k_rej)

        def hook(layer: int, hidden: torch.Tensor) -> int | None:
            # The last layer's output is the full-depth one: nothing left to save there.
            if layer < first or layer >= n_layers - 1:
                return None
            t0 = time.perf_counter_ns()
            try:
                width = hidden.shape[1]
                if width <= 1:
                    return None
                # Eq. 6–10 first: when pruning cannot pay at this depth, skip the check itself.
                if not should_prune(n_layers, layer + 1, t_t, t_ee, t_pr):
                    return None
                scores = self.target.head(hidden[:, : width - 1]).float()  # [B, W-1, V]
                draft_next = tokens[:, 1:width]
                own = scores.gather(2, draft_next[:, :, None])
                above = (scores > own).sum(-1)  # rank test, no top-k
                live = torch.tensor([k - 1 for k in kept], device=tokens.device)  # live drafts per row
                pos = torch.arange(width - 1, device=tokens.device)[None, :]
                flagged = (above >= rank_threshold(layer, n_layers, params)) & (pos < live[:, None])
                if not bool(flagged.any()):
                    return None
                has = flagged.any(1)
                first_flag = torch.where(has, flagged.int().argmax(1), live).tolist()
                for i in range(B):
                    kept[i] = min(kept[i], first_flag[i] + 1)
                new_width = max(kept)
                return new_width if new_width < width else None
            finally:
                spent_ns[0] += time.perf_counter_ns() - t0

        return hook

    # ------------------------------------------------------------------ frontier overlap
    def _overlap_pool(self) -> ThreadPoolExecutor:
        pool = getattr(self, "_pool", None)
        if pool is None:
            pool = self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="autospec-draft")
            # Concurrent draft sampling and verify acceptance draws must not share one generator.
            self._draft_generator = torch.Generator(device=self.device).manual_seed(
                int(self.generator.initial_seed()) + 1)
        return pool

    @torch.inference_mode()
    def frontier_step(self, lengths: Mapping[int, int], chunk: int) -> StepOutcome:
        """One SD step with FASER's frontier overlap (§4.3): request i drafts up to `lengths[i]` tokens
        in chunks of `chunk`; while the target verifies chunk c the draft drafts chunk c+1 (concurrently
        on CUDA, in its own stream and green context; sequentially on a CPU, same bookkeeping). A
        request that accepts all of chunk c goes on with its pre-drafted chunk c+1 (no bonus token in
        between); on a rejection everything after it is discarded and the step ends for that request
        with the usual correction token; after its last chunk is fully accepted it gets the bonus.

        Returns one StepOutcome over the whole step: drafted counts every draft made (also a
        pre-drafted chunk thrown away), verified the drafts that went to the target.
        """
        if chunk < 1:
            raise InputError(f"frontier chunk size must be >= 1, got {chunk}", field="chunk_size")
        ids = list(lengths)
        target = {i: max(0, min(int(lengths[i]), self.k_max)) for i in ids}
        if self.draft_model is None and any(target.values()):
            raise InputError("this engine has no draft model; use K=0", field="draft")
        made = {i: 0 for i in ids}
        self._draft_upto(made, {i: min(chunk, target[i]) for i in ids})
        tally = _FrontierTally(ids)
        active = list(ids)
        while active:
            plan = {i: min(chunk, len(self.request(i).drafts)) for i in active}
            nxt = {i: min(made[i] + chunk, target[i]) for i in active if made[i] < target[i]}
            overlap = partial(self._draft_upto, made, nxt) if nxt else None  # the next chunk, during this verify
            out = self._verify(plan, carry=frozenset(nxt), overlap=overlap)
            tally.add(out)
            # still active: this chunk was accepted whole and the next one is already drafted (carried)
            active = [i for i in out.req_ids if not self.request(i).finished and self.request(i).drafts]
        return tally.outcome(made, early_exit=self.early_exit is not None)

    def _draft_upto(self, made: dict[int, int], limit: Mapping[int, int]) -> None:
        """Draft until each request in `limit` has made limit[id] drafts this step (or finished): one
        batched draft pass per token position; `made` counts them."""
        while True:
            todo = [i for i in limit if made[i] < limit[i] and not self.request(i).finished]
            if not todo:
                return
            self.draft(todo)
            for i in todo:
                made[i] += 1

    # ------------------------------------------------------------------ remove
    @torch.inference_mode()
    def remove(self, req_ids: Sequence[int]) -> None:
        """Free requests' slots, moving the last active slot into each hole so slots stay dense."""
        for rid in req_ids:
            req = self._requests.pop(rid)
            hole = req.slot
            last = len(self._by_slot) - 1
            if hole != last:
                moved = self._requests[self._by_slot[last]]
                self.target_cache.move_slot(last, hole, moved.target_len + 1)
                if self.draft_cache is not None:
                    self.draft_cache.move_slot(last, hole, moved.draft_len + 1)
                moved.slot = hole
                self._by_slot[hole] = moved.req_id
            self._by_slot.pop()

    # ------------------------------------------------------------------ profiling
    @torch.inference_mode()
    def time_forward(self, which: str, batch: int, tokens: int, context: int, repeats: int = 5,
                     warmup: int = 2, prefill: bool = False) -> list[float]:
        """Seconds per forward pass of `which` ("target" or "draft") over `batch` requests that each
        feed `tokens` new tokens on top of `context` cached ones; one value per repeat.

        Runs on a scratch cache so live requests are untouched. This is the cost the engine pays in
        `verify` (target, tokens = verified drafts + 1) and `draft` (draft, tokens = 1). With `prefill`
        the pass is timed as `add` runs it: the LM head on each request's last position only — a
        prompt's other positions need no logits, and on the bundled pair the head over every position
        was 30% of a 256-token target prefill and half the draft's.
        """
        model = self.target if which == "target" else self.draft_model
        if model is None:
            raise InputError("this engine has no draft model", field="draft")
        cache = model.new_cache()
        cache.ensure(batch, context + tokens + 1)
        rows = torch.arange(batch, device=self.device)
        lens = torch.full((batch,), context, dtype=torch.long, device=self.device)
        q_lens = torch.full((batch,), tokens, dtype=torch.long, device=self.device)
        gen = torch.Generator().manual_seed(batch * 1000 + tokens)
        feed = torch.randint(0, model.shape.vocab_size, (batch, tokens), generator=gen).to(self.device)
        logits_at = (q_lens - 1)[:, None] if prefill else None
        times = []
        for i in range(warmup + repeats):
            self._sync()
            t0 = time.perf_counter_ns()
            logits = model.forward(feed, cache, rows, lens, q_lens, logits_at=logits_at)
            # the sampling work the engine does on those logits is part of a step's cost
            torch.softmax(logits.float(), dim=-1).argmax(-1)
            self._sync()
            if i >= warmup:
                times.append((time.perf_counter_ns() - t0) / 1e9)
        return times


class _FrontierTally:
    """A frontier step's per-request sums over its chunk verifies (`TorchSDEngine.frontier_step`)."""

    def __init__(self, ids: list[int]):
        self.ids = ids
        self.verified = dict.fromkeys(ids, 0)
        self.accepted = dict.fromkeys(ids, 0)
        self.pruned = dict.fromkeys(ids, 0)
        self.committed: dict[int, list[int]] = {i: [] for i in ids}
        self.probs: dict[int, list[float]] = {i: [] for i in ids}
        self.klds: dict[int, list[float]] = {i: [] for i in ids}
        self.finished: dict[int, bool] = {}
        self.draft_s = self.verify_s = self.ee_s = 0.0

    def add(self, out: StepOutcome) -> None:
        self.draft_s += out.draft_time_s
        self.verify_s += out.verify_time_s
        self.ee_s += out.early_exit_time_s
        for j, i in enumerate(out.req_ids):
            self.verified[i] += out.verified[j]
            self.accepted[i] += out.accepted[j]
            self.committed[i] += out.committed[j]
            self.probs[i] += out.target_probs[j]
            self.klds[i] += out.klds[j]
            self.pruned[i] += out.pruned[j] if out.pruned else 0
            self.finished[i] = out.finished[j]

    def outcome(self, made: Mapping[int, int], early_exit: bool) -> StepOutcome:
        """One StepOutcome over the whole step; `made` counts the drafts made per request."""
        ids = self.ids
        return StepOutcome(
            req_ids=ids, drafted=[made[i] for i in ids], verified=[self.verified[i] for i in ids],
            accepted=[self.accepted[i] for i in ids], committed=[self.committed[i] for i in ids],
            finished=[self.finished[i] for i in ids], target_probs=[self.probs[i] for i in ids],
            klds=[self.klds[i] for i in ids], draft_time_s=self.draft_s, verify_time_s=self.verify_s,
            early_exit_time_s=self.ee_s, pruned=[self.pruned[i] for i in ids] if early_exit else [])
