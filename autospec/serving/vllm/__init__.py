"""vLLM as a runner: it schedules its own steps, so the serving loop cannot drive it as an `Engine`;
autospec replays traces through it and runs online length policies inside its scheduler (docs/vllm.md).

* `speculative_config` — strategies → vLLM's speculative_config and launch flags (what vLLM can run,
  and why the rest is refused);
* `engine` — starting vLLM: the install check, the environment, engine arguments, validation of a
  deploy config, offline generation;
* `replay` — trace replay through `AsyncLLM` (`VllmReplayer`);
* `step_log` — the recording scheduler's per-step log → autospec's records;
* `latency_profile` — the vLLM latency profile (`autospec profile --engine vllm`);
* `openmp` — the OpenMP runtime vLLM's worker computes on (read in the worker; the SD warning);
* `online` — the online length policies' settings and their vLLM-free driver;
* `scheduler` — the `scheduler_cls` / `worker_extension_cls` vLLM loads by dotted path (imports vLLM).

Nothing is imported here: vLLM's engine core imports `autospec.serving.vllm.scheduler` by name, and
only `scheduler` imports vLLM at import time; the other modules import it inside functions.
"""
