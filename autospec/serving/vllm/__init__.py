"""vLLM as a runner: it schedules its own steps, so the serving loop cannot drive it as an `Engine`;
autospec replays traces through it and runs online length policies inside its scheduler.

* `engine` — strategies → speculative_config, engine arguments, trace replay, offline generation and
  the vLLM latency profile (vLLM is imported only inside its functions);
* `online` — the online length policies' settings and their vLLM-free driver;
* `scheduler` — the `scheduler_cls` / `worker_extension_cls` vLLM loads by dotted path (imports vLLM).

Nothing is imported here: vLLM's engine core imports `autospec.serving.vllm.scheduler` by name, and
`import autospec.serving.vllm.engine` must not import vLLM.
"""
