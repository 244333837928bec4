"""Prompt datasets by name, the way `vllm bench serve --dataset-name NAME --dataset-path FILE` names them.

`load_dataset(name, path)` is the one entry point (`autospec generate/profile --dataset NAME
[--dataset-path FILE]`, and `{ dataset = "mbpp", path = "mbpp.jsonl" }` in a workload's `prompts`):

| name | file (`path`) | prompt | domain |
|---|---|---|---|
| `stdlib` (default) | none: the running Python's standard library | a def/class header + docstring | code |
| `random` | none | `input_len` random token ids (`range_ratio`, count = `limit`, `seed`) | random |
| `humaneval` | HumanEval.jsonl(.gz) | `prompt` | code |
| `mbpp` | mbpp.jsonl (original) or sanitized-mbpp.json | docstring of the statement + first test | code |
| `gsm8k` | test.jsonl | `question` | math |
| `mt-bench` | question.jsonl (FastChat) | first of `turns` | chat |
| `spec-bench` | question.jsonl (Spec-Bench) | first of `turns` | chat |
| `sharegpt` | JSON array or JSONL of `conversations` | first human/user turn | chat |
| `jsonl` | any JSONL | `prompt` (or the `field` given) | the record's `domain`, else chat |

A named dataset forces its layout (a record without the layout's fields is an error on that line,
never a silent re-detection) and its domain (`domain=` relabels). The parsing is `load_prompts`'s.

Without a file, a dataset that has a usual Hugging Face id is read from the local Hugging Face
datasets cache when the `datasets` package is importable — offline: nothing is downloaded unless
`allow_download=True` (`--allow-download`). Otherwise it is a one-line InputError saying which file is
expected and where to get it.

`random` prompts carry `Prompt.token_ids` (their `text` is only a description); encoders send those
ids as they are. They are drawn uniformly from [0, vocab_size) minus `exclude_ids` — the caller passes
its tokenizer's base vocabulary size and special ids (`autospec.serving.factory.random_vocab`), so every id
is one the model can embed. [chosen] Uniform i.i.d. ids rather than vLLM's offset + consecutive ids:
consecutive ids are an artificial pattern a draft model can learn to predict, i.i.d. ids are not.
Lengths follow vLLM: uniform integers in [floor(L·(1−r)), ceil(L·(1+r))].
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterable

import numpy as np

from autospec.errors import InputError
from autospec.workloads.prompts import Prompt, load_prompts, prompts_from_records
from autospec.workloads.stdlib_prompts import stdlib_prompts

DEFAULT_DATASET = "stdlib"
RANDOM_DOMAIN = "random"
RANDOM_INPUT_LEN = 128  # [chosen] a quarter of vLLM's 1024: the bundled pair's context is 2048 tokens
RANDOM_COUNT = 16  # [chosen] prompts drawn when no limit is given (vLLM's --num-prompts)
_OFFLINE_ENV = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")


@dataclass(frozen=True)
class DatasetInfo:
    """One named dataset: the layout forced on its file, its domain, and where its file comes from."""

    name: str
    layout: str | None  # a `prompts.LAYOUTS` name; None: the dataset reads no file
    domain: str | None  # None: per record (`jsonl`)
    formats: str  # the file(s) expected, for messages and the README
    source: str  # where to get them
    hf: tuple[str, str | None, str] | None = None  # (Hugging Face id, config, split) for the cache


DATASETS: dict[str, DatasetInfo] = {d.name: d for d in (
    DatasetInfo("stdlib", None, "code", "none (the running Python's standard library)", "built in"),
    DatasetInfo("random", None, RANDOM_DOMAIN, "none (random token ids)", "built in"),
    DatasetInfo("humaneval", "humaneval", "code", "HumanEval.jsonl.gz (or the unzipped JSONL)",
                "https://github.com/openai/human-eval/tree/master/data (or the Hugging Face dataset "
                "'openai/openai_humaneval')", ("openai/openai_humaneval", None, "test")),
    DatasetInfo("mbpp", "mbpp", "code", "the original mbpp.jsonl or sanitized-mbpp.json",
                "https://github.com/google-research/google-research/tree/master/mbpp (or the Hugging Face "
                "dataset 'google-research-datasets/mbpp')", ("google-research-datasets/mbpp", "full", "test")),
    DatasetInfo("gsm8k", "gsm8k", "math", "test.jsonl", "https://github.com/openai/grade-school-math "
                "(grade_school_math/data/test.jsonl; or the Hugging Face dataset 'openai/gsm8k', config 'main')",
                ("openai/gsm8k", "main", "test")),
    DatasetInfo("mt-bench", "mt_bench", "chat", "question.jsonl",
                "https://github.com/lm-sys/FastChat/tree/main/fastchat/llm_judge/data/mt_bench (or the Hugging "
                "Face dataset 'philschmid/mt-bench')", ("philschmid/mt-bench", None, "train")),
    DatasetInfo("spec-bench", "mt_bench", "chat", "question.jsonl",
                "https://github.com/hemingkx/Spec-Bench/tree/main/data/spec_bench"),
    DatasetInfo("sharegpt", "sharegpt", "chat", "ShareGPT_V3_unfiltered_cleaned_split.json (a JSON array, or "
                "JSONL, of records with 'conversations')", "the Hugging Face dataset "
                "'anon8231489123/ShareGPT_Vicuna_unfiltered'",
                ("anon8231489123/ShareGPT_Vicuna_unfiltered", None, "train")),
    DatasetInfo("jsonl", "plain", None, "a JSONL file of records with a 'prompt' field (or the field named)",
                "your own data"),
)}
DATASET_NAMES = tuple(DATASETS)


def dataset_info(name: str) -> DatasetInfo:
    """The dataset called `name` (case and `_`/`-` are not significant); else a one-line InputError."""
    key = str(name).strip().lower().replace("_", "-")
    key = {"mtbench": "mt-bench", "specbench": "spec-bench"}.get(key, key)
    if key not in DATASETS:
        raise InputError(f"unknown dataset {name!r}; known datasets: {', '.join(DATASET_NAMES)}", field="dataset")
    return DATASETS[key]


@dataclass(frozen=True)
class DatasetSelection:
    """A dataset as the CLI and settings name it, with its options; `load` adds what the caller knows."""

    name: str
    path: Path | None = None
    field: str | None = None
    input_len: int = RANDOM_INPUT_LEN
    range_ratio: float = 0.0
    allow_download: bool = False

    def load(self, *, limit: int | None = None, domain: str | None = None, seed: int = 0,
             vocab_size: int | None = None, exclude_ids: Iterable[int] = ()) -> list[Prompt]:
        return load_dataset(self.name, self.path, limit=limit, domain=domain, seed=seed, vocab_size=vocab_size,
                            exclude_ids=exclude_ids, input_len=self.input_len, range_ratio=self.range_ratio,
                            field=self.field, allow_download=self.allow_download)

    @property
    def needs_vocab(self) -> bool:
        """Whether `load` needs `vocab_size` (the `random` dataset draws token ids)."""
        return dataset_info(self.name).name == "random"

    @property
    def domain(self) -> str | None:
        """The one domain every prompt gets, or None when records say (`jsonl`)."""
        return dataset_info(self.name).domain


def load_dataset(name: str = DEFAULT_DATASET, path: str | Path | None = None, *, limit: int | None = None,
                 domain: str | None = None, seed: int = 0, vocab_size: int | None = None,
                 exclude_ids: Iterable[int] = (), input_len: int = RANDOM_INPUT_LEN, range_ratio: float = 0.0,
                 field: str | None = None, allow_download: bool = False,
                 path_hint: str = "--dataset-path FILE") -> list[Prompt]:
    """The prompts of dataset `name` (see the module docstring), in file order, at most `limit`.

    `domain` relabels every prompt; `seed`, `vocab_size`, `exclude_ids`, `input_len` and `range_ratio`
    apply to `random` (the count is `limit`, default RANDOM_COUNT); `field` to `jsonl`. `path_hint` is
    how the missing-file message tells the user to name the file.
    """
    info = dataset_info(name)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InputError(f"limit must be a positive integer, got {limit!r}", field="limit")
    if field is not None and info.name != "jsonl":
        raise InputError(f"a text field only applies to dataset 'jsonl', not '{info.name}'", field="field")
    if info.layout is None and path is not None:
        raise InputError(f"dataset '{info.name}' reads no file; drop the path ({path})", field="dataset_path")
    if info.name == "stdlib":
        return _relabel(_stdlib(limit), domain)
    if info.name == "random":
        if vocab_size is None:
            raise InputError("dataset 'random' needs the tokenizer's vocabulary size", field="dataset")
        return random_prompts(limit or RANDOM_COUNT, input_len, vocab_size=vocab_size, range_ratio=range_ratio,
                              seed=seed, exclude_ids=exclude_ids, domain=domain or RANDOM_DOMAIN)
    label = domain or info.domain
    if path is not None and Path(path).expanduser().exists():
        return load_prompts(Path(path).expanduser(), label, limit, layout=info.layout, field=field)
    cached = None if path is not None else _from_hf_cache(info, limit, label, allow_download)
    if cached is not None:
        return cached
    raise _missing_file(info, None if path is None else Path(path), path_hint)


def random_prompts(count: int, input_len: int = RANDOM_INPUT_LEN, *, vocab_size: int, range_ratio: float = 0.0,
                   seed: int = 0, exclude_ids: Iterable[int] = (), domain: str = RANDOM_DOMAIN) -> list[Prompt]:
    """`count` prompts of random token ids below `vocab_size` (none of `exclude_ids`), reproducible by
    `seed`; lengths uniform in [floor(input_len·(1−range_ratio)), ceil(input_len·(1+range_ratio))]."""
    for key, value in (("count", count), ("input_len", input_len), ("vocab_size", vocab_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise InputError(f"{key} must be a positive integer, got {value!r}", field=f"random_{key}")
    if isinstance(range_ratio, bool) or not isinstance(range_ratio, (int, float)) or not 0 <= range_ratio < 1:
        raise InputError(f"range ratio must be in [0, 1), got {range_ratio!r}", field="random_range_ratio")
    allowed = np.setdiff1d(np.arange(int(vocab_size)), np.fromiter((int(i) for i in exclude_ids), dtype=np.int64))
    if allowed.size == 0:
        raise InputError(f"no token id below {vocab_size} is left once special ids are excluded",
                         field="random_vocab_size")
    low = max(1, math.floor(input_len * (1 - range_ratio)))
    high = max(low, math.ceil(input_len * (1 + range_ratio)))
    rng = np.random.default_rng(seed)
    lengths = rng.integers(low, high + 1, size=count)
    prompts = []
    for i, n in enumerate(lengths):
        ids = allowed[rng.integers(0, allowed.size, size=int(n))]
        prompts.append(Prompt(f"<{int(n)} random token ids>", domain, f"random#{i}",
                              token_ids=tuple(int(t) for t in ids)))
    return prompts


def _stdlib(limit: int | None) -> list[Prompt]:
    return stdlib_prompts(limit)


def _relabel(prompts: list[Prompt], domain: str | None) -> list[Prompt]:
    return prompts if domain is None else [dataclasses.replace(p, domain=domain) for p in prompts]


def _missing_file(info: DatasetInfo, path: Path | None, hint: str) -> InputError:
    where = f"{info.formats} from {info.source}"
    if path is not None:
        return InputError(f"no such file; dataset '{info.name}' expects {where}", path=path, field="dataset_path")
    extra = ""
    if info.hf is not None and _datasets_importable():
        extra = (f" (not in the local Hugging Face datasets cache either; --allow-download fetches "
                 f"'{info.hf[0]}')")
    return InputError(f"dataset '{info.name}' needs {hint}: {where}{extra}", field="dataset")


def _datasets_importable() -> bool:
    return importlib.util.find_spec("datasets") is not None


def _from_hf_cache(info: DatasetInfo, limit: int | None, domain: str | None,
                   allow_download: bool) -> list[Prompt] | None:
    """The dataset's rows from the local Hugging Face datasets cache (offline unless `allow_download`),
    or None when `datasets` is not installed or the cache does not hold it."""
    if info.hf is None or not _datasets_importable():
        return None
    hf_id, config, split = info.hf
    saved_env = {k: os.environ.get(k) for k in _OFFLINE_ENV}
    if not allow_download:
        # Read at import time by `datasets`/`huggingface_hub`: set before the (first) import ...
        os.environ.update({k: "1" for k in _OFFLINE_ENV})
    try:
        import datasets as hf_datasets  # not a dependency: imported only on this path

        # ... and patched on the module in case it was imported earlier in this process.
        saved_cfg = {k: getattr(hf_datasets.config, k, None) for k in _OFFLINE_ENV}
        for k in _OFFLINE_ENV:
            if hasattr(hf_datasets.config, k):
                setattr(hf_datasets.config, k, not allow_download)
        try:
            rows = hf_datasets.load_dataset(hf_id, config, split=split,
                                            download_mode="reuse_dataset_if_exists")
            records = ((i + 1, dict(row)) for i, row in enumerate(rows))
            prompts = list(islice(prompts_from_records(records, hf_id, domain, layout=info.layout), limit))
        finally:
            for k, v in saved_cfg.items():
                if v is not None:
                    setattr(hf_datasets.config, k, v)
    except InputError:
        raise
    except Exception:  # noqa: BLE001 - any failure of an optional cache read means "not cached"
        return None
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return prompts or None
