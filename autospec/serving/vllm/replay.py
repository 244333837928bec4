"""Trace replay through vLLM's `AsyncLLM`: `VllmReplayer` (docs/vllm.md, "Replaying a workload").

vLLM runs its own continuous-batching scheduler, so the serving loop (`autospec.serving.loop.serve`)
cannot drive it step by step. A replay therefore submits every trace request at its trace time
(`ignore_eos`, `max_tokens` = the trace's output length) on one engine per strategy, and rebuilds the
records the loop writes from the recording scheduler's per-step log (`autospec.serving.vllm.step_log`).
With `max_concurrency = N` a request, once its trace time has come, also waits for one of N slots (an
`asyncio.Semaphore`, as `vllm bench serve --max-concurrency` does) before it is submitted; its record's
`sent_s` is when it was submitted, the time its latencies count from.

vLLM is imported only inside the methods that start or feed an engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from autospec.errors import InputError
from autospec.serving.records import ServeRecords
from autospec.serving.vllm.engine import (
    config_vocab_size,
    engine_kwargs,
    require_vllm,
    serve_prompts,
    served_max_model_len,
    set_env_defaults,
)
from autospec.serving.vllm.speculative_config import speculative_config_for, vllm_form
from autospec.serving.vllm.speed_check import PROBE_ROUNDS, PROBE_TOKENS, VllmSpeedReference
from autospec.serving.vllm.step_log import ClientRecord, read_step_log, records_from_steps
from autospec.strategy import StrategySpec

__all__ = ["VllmReplayer", "VllmWindowReplay"]

RunOnce = Callable[..., ServeRecords]  # VllmReplayer.session's run(requests, repeat, on_finish=None)


class VllmReplayer:
    """One AsyncLLM per strategy, replaying a request list at its trace times (module docstring)."""

    def __init__(self, target: Path, draft: Path | None, *, max_batch: int, temperature: float = 0.0,
                 seed: int = 0, k_schedules: Mapping[str, Sequence[tuple[int, int, int]]] | None = None,
                 k_max: int | None = None, fit: Path | None = None, max_concurrency: int | None = None,
                 speed_reference: VllmSpeedReference | None = None, load_meter: Any = None):
        self.target, self.draft = Path(target), None if draft is None else Path(draft)
        self.max_batch, self.temperature, self.seed = max_batch, temperature, seed
        self.k_schedules = dict(k_schedules or {})
        self.k_max, self.fit = k_max, fit  # online length policies: K_max and the fitted latency model
        if max_concurrency is not None and max_concurrency < 1:
            raise InputError(f"max concurrency must be >= 1 request, got {max_concurrency}", field="max_concurrency")
        self.max_concurrency = max_concurrency  # requests in flight at most; None = open loop
        # the host-speed probe before and after each run (speed_check.py); None = no check
        self.speed_reference = speed_reference
        # a telemetry.HostLoadMeter that measures the host's CPU over each run, while the engine's processes
        # are alive (its docstring says why not over the engine's whole life); None = no measurement
        self.load_meter = load_meter
        self._probes = itertools.count()  # probe request ids, unique on an engine

    def config_for(self, spec: StrategySpec) -> dict[str, Any]:
        rows = self.k_schedules.get(spec.name)
        if spec.length.policy == "batch-schedule" and rows is None:
            # the per-batch-size K policy: its buckets up to max_batch become vLLM's schedule rows
            spec, rows = vllm_form(spec, self.max_batch)
        return speculative_config_for(spec, self.target, self.draft, rows, k_max=self.k_max, fit=self.fit,
                                      temperature=self.temperature)

    def check(self, specs: Sequence[StrategySpec]) -> None:
        """Every strategy must be expressible before any engine starts."""
        require_vllm()
        for spec in specs:
            self.config_for(spec)

    def replay(self, spec: StrategySpec, requests: Sequence[Any], repeats: int,
               on_start: Callable[[int], Callable[[int], None] | None] | None = None) -> list[ServeRecords]:
        """ServeRecords for each repeat of `requests` under `spec`, on one engine."""
        with self.session(spec, requests) as run:
            return [run(requests, repeat, on_start(repeat) if on_start is not None else None)
                    for repeat in range(repeats)]

    @contextlib.contextmanager
    def session(self, spec: StrategySpec, requests: Sequence[Any]) -> Iterator[RunOnce]:
        """One engine for `spec`, sized for the longest of `requests` and warmed up on them; yields
        run(requests, repeat, on_finish) -> ServeRecords, which replays a request list (any subset or
        rescaling of `requests`) at its trace times on it. The engine is shut down on exit."""
        require_vllm()
        set_env_defaults()
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        cfg = self.config_for(spec)
        longest = max(len(r.prompt) + r.max_tokens for r in requests)
        if self.speed_reference is not None:
            longest = max(longest, max(self.speed_reference.prompt_lengths()) + PROBE_TOKENS,
                          (self.speed_reference.prefill_tokens or 0) + 1)
        with tempfile.TemporaryDirectory(prefix="autospec-vllm-") as tmp:
            log_path = Path(tmp) / "steps.jsonl"
            # [chosen] Prefix caching off: every repeat replays the same prompts, and with the cache on a
            # repeat after the first would skip its prefills (measured: static-k4's mean TPOT 58 ms in
            # the first repeat, 40 ms in the second). The torch engine and the simulator keep no prefix
            # cache either, so all three engines replay the same work.
            kwargs = engine_kwargs(self.target, cfg, max_num_seqs=self.max_batch, seed=self.seed,
                                   record_steps=log_path, max_model_len=served_max_model_len(self.target, longest),
                                   enable_prefix_caching=False)
            # The engine's output handler lives on this loop: shut the engine down before closing it.
            loop = asyncio.new_event_loop()
            try:
                engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
                held = [engine]  # what run() serves on; emptied with the engine's shutdown
                try:
                    loop.run_until_complete(self._warm_up(engine, requests))

                    def host_speed() -> tuple[float | None, float | None]:
                        """The probe's decode and prefill step times over the profile's (speed_check.py),
                        None without a reference."""
                        reference = self.speed_reference
                        if reference is None:
                            return None, None
                        t0 = time.perf_counter()
                        loop.run_until_complete(self._probe(held[0], reference))
                        t1 = time.perf_counter()
                        loop.run_until_complete(self._probe_prefill(held[0], reference))
                        steps = read_step_log(log_path, t0)
                        return (reference.ratio([s for s in steps if s["t0"] < t1]),
                                reference.prefill_ratio([s for s in steps if s["t0"] >= t1]))

                    def run(batch: Sequence[Any], repeat: int,
                            on_finish: Callable[[int], None] | None = None) -> ServeRecords:
                        if self.load_meter is not None:
                            self.load_meter.resume()
                        before = host_speed()
                        t0 = time.perf_counter()
                        client = loop.run_until_complete(self._submit_all(held[0], batch, t0, repeat, on_finish))
                        wall = time.perf_counter() - t0
                        steps = read_step_log(log_path, t0)
                        records = records_from_steps(spec.name, batch, steps, t0, client, wall)
                        after = host_speed()  # its steps come after the run's, which were read above
                        if self.load_meter is not None:
                            self.load_meter.pause()
                        records.host_speed = [r for r, _ in (before, after) if r is not None]
                        records.prefill_speed = [r for _, r in (before, after) if r is not None]
                        return records

                    yield run
                finally:
                    engine.shutdown()
                    loop.run_until_complete(asyncio.sleep(0))  # let cancelled handler tasks finish
                    # Drop the engine now, while the interpreter is whole. When this call is the first to
                    # import vllm.engine.arg_utils, vLLM keeps this frame (and its locals) alive after it
                    # returns: vllm/multimodal/media/audio.py stores its failed torchcodec import's
                    # exception at module level, and that traceback's frames lead back here. The AsyncLLM
                    # would then be finalised at interpreter exit, where its __del__ -> shutdown() finds
                    # its module globals gone and prints "Exception ignored in AsyncLLM.__del__" (issue
                    # 17). shutdown() is idempotent, so the second call from __del__ does nothing.
                    del engine
                    held.clear()
                    gc.collect()
            finally:
                loop.close()

    async def _warm_up(self, engine, requests: Sequence[Any]) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        for i, r in enumerate(requests[:2]):
            async for _ in engine.generate(TokensPrompt(prompt_token_ids=list(r.prompt)), params,
                                           request_id=f"warmup{i}"):
                pass

    async def _probe(self, engine, reference: VllmSpeedReference) -> None:
        """The host-speed probe: `reference.batch` requests of random prompt tokens, as long as the profile's
        decode rows' (`VllmSpeedReference.prompt_lengths`), PROBE_TOKENS tokens each, submitted together
        (greedy; the same prompts every probe), PROBE_ROUNDS times."""
        rng = np.random.default_rng(0)
        vocab = config_vocab_size(self.target)
        prompts = [rng.integers(1, vocab, n).tolist() for n in reference.prompt_lengths()]
        tags = (f"speed-probe-{i}" for i in self._probes)  # the engine's own count, shared with the prefill probe
        for _ in range(PROBE_ROUNDS):  # one round after the other (speed_check.PROBE_ROUNDS says why)
            await serve_prompts(engine, prompts, PROBE_TOKENS, tags)

    async def _probe_prefill(self, engine, reference: VllmSpeedReference) -> None:
        """The prefill probe: one request of `reference.prefill_tokens` random prompt tokens and one token
        out (its step is the prefill alone), PROBE_ROUNDS times one after the other; nothing when the
        profile has no prefill row."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if reference.prefill_tokens is None:
            return
        prompt = np.random.default_rng(1).integers(1, config_vocab_size(self.target),
                                                   reference.prefill_tokens).tolist()
        params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        for _ in range(PROBE_ROUNDS):
            async for _ in engine.generate(TokensPrompt(prompt_token_ids=prompt), params,
                                           request_id=f"speed-probe-{next(self._probes)}"):
                pass

    async def _submit_all(self, engine, requests: Sequence[Any], t0: float, repeat: int,
                          on_finish: Callable[[int], None] | None) -> dict[int, ClientRecord]:
        # One semaphore per repeat; its waiters are woken first come first served, and they queue in
        # trace order (each waits from its trace time), so requests are sent in trace order.
        slots = asyncio.Semaphore(self.max_concurrency) if self.max_concurrency is not None else None
        return dict(await asyncio.gather(*(self._submit_one(engine, r, t0, repeat, on_finish, slots)
                                           for r in requests)))

    async def _submit_one(self, engine, r: Any, t0: float, repeat: int, on_finish: Callable[[int], None] | None,
                          slots: asyncio.Semaphore | None = None) -> tuple[int, ClientRecord]:
        """Submit `r` at its trace time (t0 + arrival_s) — and, under max_concurrency, once a slot is
        free — and wait for its final output."""
        delay = t0 + r.arrival_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        async with slots if slots is not None else contextlib.nullcontext():
            submitted = time.perf_counter() - t0
            rec = await self._generate(engine, r, repeat, submitted)
        if on_finish is not None:
            on_finish(r.req_id)
        return r.req_id, rec

    async def _generate(self, engine, r: Any, repeat: int, submitted: float) -> ClientRecord:
        """Run `r` on the engine to its end: what the client saw of it."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(temperature=self.temperature, max_tokens=r.max_tokens, ignore_eos=True,
                                seed=None if self.temperature == 0 else (self.seed + repeat) * 1_000_003 + r.req_id,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        final: Any = None
        async for output in engine.generate(TokensPrompt(prompt_token_ids=list(r.prompt)), params,
                                            request_id=f"{r.req_id}"):
            final = output  # FINAL_ONLY: the one output, with the whole completion
        comp = final.outputs[0]
        rec = ClientRecord(submitted, len(comp.token_ids))
        if final.metrics is not None:
            rec.preemptions = int(getattr(final.metrics, "num_preemptions", 0) or 0)
        sdm = getattr(comp, "spec_decode_metrics", None)
        if sdm is not None:
            rec.spec_steps = list(zip(sdm.per_step_drafted, sdm.per_step_accepted))
        return rec


class VllmWindowReplay:
    """A request window on vLLM with the simulator's replay interface — `requests`, `slo`, `k_max`,
    `run(spec, seed, requests=...)` — for what replays one window many times under few strategies
    (`autospec.confirm`, a capacity search): every run of a strategy reuses one engine, started at its
    first run and shut down when another strategy runs or at `close()` [why: a vLLM engine takes ~20 s
    to start on a CPU; a confirmation replays each strategy at three loads and two repeats]. The run's
    `seed` − the replayer's seed is its repeat (vLLM's seed is the engine's; it seeds sampled drafts)."""

    def __init__(self, replayer: VllmReplayer, requests: Sequence[Any], slo: Any, k_max: int):
        self.replayer, self.requests, self.slo, self.k_max = replayer, list(requests), slo, k_max
        self._open: tuple[str, RunOnce] | None = None
        self._stack = contextlib.ExitStack()

    def run(self, spec: StrategySpec, seed: int, *, requests: Sequence[Any] | None = None,
            on_finish: Callable[[int], None] | None = None) -> ServeRecords:
        key = spec.model_dump_json()
        if self._open is None or self._open[0] != key:
            self.close()
            self._open = (key, self._stack.enter_context(self.replayer.session(spec, self.requests)))
        return self._open[1](self.requests if requests is None else requests, max(0, seed - self.replayer.seed),
                             on_finish)

    def close(self) -> None:
        """Shut the open engine down (a later run starts another)."""
        self._open = None
        self._stack.close()
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "VllmWindowReplay":
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()
