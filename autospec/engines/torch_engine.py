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
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import torch

from autospec.contract import DraftToken, StepOutcome
from autospec.engines.base import GenRequest, PrefillResult
from autospec.engines.llama import CompactLlama, KVCache
from autospec.errors import InputError

KL_CLAMP = 1e-8


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


class TorchSDEngine:
    """Target + draft CompactLlama with per-request KV caches; implements `autospec.engines.base.Engine`."""

    def __init__(
        self,
        target_dir: str | Path,
        draft_dir: str | Path | None,
        *,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        temperature: float = 0.0,
        k_max: int = 8,
        seed: int = 0,
        draft_sampling: str = "sample",
    ):
        if temperature < 0:
            raise InputError(f"temperature must be >= 0, got {temperature}", field="temperature")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise InputError(f"device {device} needs a CUDA GPU and none is available", field="device")
        self.device = torch.device(device)
        self.target = CompactLlama(target_dir, self.device, dtype)
        self.draft_model = CompactLlama(draft_dir, self.device, dtype) if draft_dir is not None else None
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
        self.totals = {"prefill_s": 0.0, "draft_s": 0.0, "verify_s": 0.0}

    # ------------------------------------------------------------------ helpers
    def now(self) -> float:
        return time.perf_counter()

    def idle_until(self, t: float) -> None:
        """Sleep until perf_counter() reaches `t`: a real engine's clock is wall time (see Engine)."""
        gap = t - time.perf_counter()
        if gap > 0:
            time.sleep(gap)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

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

    def _choose(self, probs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if self.temperature == 0:
            return logits.argmax(dim=-1)
        flat = probs.reshape(-1, probs.shape[-1])
        return torch.multinomial(flat, 1, generator=self.generator).view(probs.shape[:-1])

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
        chosen = logits.argmax(-1) if self.draft_sampling == "greedy" else self._choose(probs, logits)
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
    @torch.inference_mode()
    def verify(self, plan: Mapping[int, int]) -> StepOutcome:
        """Run the target over `plan[req_id]` drafted tokens per request (0 = a plain decode step).

        Drafts beyond the verified count are discarded. Returns what each request committed plus the
        signals policies learn from.
        """
        t0 = time.perf_counter_ns()
        req_ids = list(plan)
        reqs = [self.request(i) for i in req_ids]
        for req in reqs:
            if req.finished:
                raise ValueError(f"request {req.req_id} is finished")
        verify_n = [max(0, min(int(plan[r.req_id]), len(r.drafts))) for r in reqs]
        feeds = [[r.last_token] + [d.token for d in r.drafts[:n]] for r, n in zip(reqs, verify_n)]
        tokens, q_lens = self._pad(feeds)
        Q = tokens.shape[1]
        rows = torch.tensor([r.slot for r in reqs], dtype=torch.long, device=self.device)
        lens = torch.tensor([r.target_len for r in reqs], dtype=torch.long, device=self.device)
        self.target_cache.ensure(len(self._by_slot), int((lens + Q).max()) + 1)
        logits = self.target.forward(tokens, self.target_cache, rows, lens, q_lens)  # [B, Q, V]
        p = self._probs(logits)  # [B, Q, V]
        B, V = len(reqs), p.shape[-1]
        # Draft distributions and tokens at the verified positions, padded to Q-1.
        q = torch.zeros(B, max(Q - 1, 1), V, device=self.device)
        draft_tok = torch.zeros(B, max(Q - 1, 1), dtype=torch.long, device=self.device)
        for i, (r, n) in enumerate(zip(reqs, verify_n)):
            if n:
                q[i, :n] = torch.stack(r.draft_probs[:n])
                draft_tok[i, :n] = tokens[i, 1: n + 1]
        n_t = torch.tensor(verify_n, device=self.device)
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
            greedy = torch.tensor([r.round_greedy for r in reqs], device=self.device)
            q_accept = torch.where(greedy[:, None], torch.ones_like(q_tok), q_tok)
            u = torch.rand(q_tok.shape, generator=self.generator, device=self.device)
            ok = (u * q_accept < p_tok) & valid  # accept with probability min(1, p/q)
        accepted = ok.long().cumprod(dim=1).sum(dim=1)  # leading run of accepted drafts
        # The next token: from the target at the first rejected position (residual distribution at
        # T>0), or the bonus position after a fully accepted block.
        idx = accepted
        p_next = p[torch.arange(B, device=self.device), idx]
        if self.temperature == 0:
            next_tok = logits[torch.arange(B, device=self.device), idx].argmax(-1)
        else:
            rejected = accepted < n_t
            at = idx.clamp(max=q.shape[1] - 1)
            q_next = q[torch.arange(B, device=self.device), at]
            point_mass = torch.zeros_like(q_next).scatter_(1, draft_tok[torch.arange(B, device=self.device), at][:, None],
                                                           1.0)
            q_next = torch.where(greedy[:, None], point_mass, q_next)
            residual = (p_next - q_next).clamp_min(0)
            mass = residual.sum(-1, keepdim=True)
            residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_next)
            dist = torch.where(rejected[:, None], residual, p_next)
            next_tok = torch.multinomial(dist, 1, generator=self.generator)[:, 0]
        kl = (p_draft_pos * (torch.log(p_draft_pos.clamp_min(KL_CLAMP)) - torch.log(q.clamp_min(KL_CLAMP)))).sum(-1)
        acc_l, next_l, p_tok_l, kl_l = accepted.tolist(), next_tok.tolist(), p_tok.tolist(), kl.tolist()
        committed, finished, target_probs, klds, drafted = [], [], [], [], []
        for i, (req, n) in enumerate(zip(reqs, verify_n)):
            a = acc_l[i]
            k = len(req.drafts)
            drafted.append(k)
            new_tokens = [d.token for d in req.drafts[:a]] + [next_l[i]]
            # Roll the caches back to the accepted prefix (see the module docstring).
            req.target_len += 1 + a
            req.last_token = next_l[i]
            if k == 0:
                req.pending = req.pending + [next_l[i]]
            else:
                req.draft_len = req.round_draft_len + req.round_pending + min(a, k - 1)
                req.pending = ([req.drafts[k - 1].token] if a == k else []) + [next_l[i]]
            req.drafts, req.draft_probs = [], []
            committed.append(self._commit(req, new_tokens))
            finished.append(req.finished)
            target_probs.append(p_tok_l[i][:n])
            klds.append(kl_l[i][:n])
        self._sync()
        elapsed = (time.perf_counter_ns() - t0) / 1e9
        self.totals["verify_s"] += elapsed
        draft_s = self._draft_ns_since_verify / 1e9
        self._draft_ns_since_verify = 0
        return StepOutcome(req_ids=req_ids, drafted=drafted, verified=verify_n, accepted=acc_l, committed=committed,
                           finished=finished, target_probs=target_probs, klds=klds, draft_time_s=draft_s,
                           verify_time_s=elapsed)

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
                     warmup: int = 2) -> list[float]:
        """Seconds per forward pass of `which` ("target" or "draft") over `batch` requests that each
        feed `tokens` new tokens on top of `context` cached ones; one value per repeat.

        Runs on a scratch cache so live requests are untouched. This is the cost the engine pays in
        `verify` (target, tokens = verified drafts + 1) and `draft` (draft, tokens = 1).
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
        times = []
        for i in range(warmup + repeats):
            self._sync()
            t0 = time.perf_counter_ns()
            logits = model.forward(feed, cache, rows, lens, q_lens)
            # the sampling work the engine does on those logits is part of a step's cost
            torch.softmax(logits.float(), dim=-1).argmax(-1)
            self._sync()
            if i >= warmup:
                times.append((time.perf_counter_ns() - t0) / 1e9)
        return times
