"""Models the way users name them: a local directory or a Hugging Face model id, resolved like `vllm serve`.

`--target` / `--draft` (and `[pair]`'s `target` / `draft`) take a model directory or a hub id `org/name`
(`name` alone too, as the hub allows), optionally pinned with `@revision` (a branch, tag or commit).
`resolve_model` turns one into a concrete directory, once, before any work:

1. a local directory of that name wins;
2. otherwise the id is looked up in the local Hugging Face cache (`HF_HUB_CACHE`, else `HF_HOME/hub`,
   else `~/.cache/huggingface/hub`: huggingface_hub's own rule, read when resolving so the environment
   of this call counts) with `snapshot_download(local_files_only=True)` — no network;
3. only when the user opted in (`--allow-download`, `[pair] allow_download = true`) and `HF_HUB_OFFLINE`
   is not true, it is downloaded into that cache.

What cannot be found is one InputError line naming the model, the cache looked in and how to get it.
The result is the snapshot directory (`.../models--org--name/snapshots/<commit>/`); `hub_source` reads
the id and commit back from such a path, which is how the manifest records both.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from autospec.errors import InputError

# org/name or name, each part as the hub allows (letters, digits, - _ .), then an optional @revision
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*(?:@[\w./-]+)?$")
_TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub.constants.ENV_VARS_TRUE_VALUES


def looks_like_hub_id(name: str | Path) -> bool:
    text = str(name)
    return bool(_HUB_ID.match(text)) and ".." not in text and "--" not in text.split("@")[0]


def hub_cache_dir() -> Path:
    """huggingface_hub.constants.HF_HUB_CACHE, recomputed from the environment as it is now."""
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if not cache:
        home = os.environ.get("HF_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
        cache = os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(cache)))


def hub_offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    return value is not None and value.strip().upper() in _TRUE


def resolve_model(name: str | Path, *, allow_download: bool = False, field: str = "target") -> Path:
    """The directory holding model `name` (see the module docstring); InputError when there is none."""
    text = str(name)
    local = Path(text).expanduser()
    if local.is_dir():
        return local
    if not looks_like_hub_id(text):
        raise InputError("model directory does not exist (and it is not a Hugging Face model id)",
                         path=local, field=field)
    repo_id, _, revision = text.partition("@")
    cache = hub_cache_dir()
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, revision=revision or None, cache_dir=cache, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    except (OSError, ValueError) as exc:  # an unreadable cache, an id the hub's validator refuses
        raise InputError(f"cannot read it from the Hugging Face cache {cache} ({_first_line(exc)})",
                         path=text, field=field) from None
    how = (f"pass --allow-download (or [pair] allow_download = true), or run `{_download_command()} {repo_id}"
           + (f" --revision {revision}`" if revision else "`"))
    if not allow_download:
        raise InputError(f"not a local directory and not in the Hugging Face cache {cache}; {how}",
                         path=text, field=field)
    if hub_offline():
        raise InputError(f"not a local directory and not in the Hugging Face cache {cache}, and "
                         f"HF_HUB_OFFLINE is set, so it cannot be downloaded; unset it, or run "
                         f"`{_download_command()} {repo_id}` where there is network", path=text, field=field)
    try:
        return Path(snapshot_download(repo_id, revision=revision or None, cache_dir=cache))
    except Exception as exc:  # not found, gated, no network: huggingface_hub and httpx raise many kinds
        raise InputError(f"download into {cache} failed ({_first_line(exc)})", path=text, field=field) from None


def resolve_pair(pair) -> Any:
    """A copy of a `PairSpec` whose target/draft are directories; it remembers the names the user gave
    for hub models (`PairSpec.hub_names`), so config.toml keeps them."""
    target = resolve_model(pair.target, allow_download=pair.allow_download, field="target")
    draft = None if pair.draft is None else resolve_model(pair.draft, allow_download=pair.allow_download,
                                                          field="draft")
    out = pair.model_copy(update={"target": target, "draft": draft})
    names = {}
    for role, given, got in (("target", pair.target, target), ("draft", pair.draft, draft)):
        if given is not None and Path(str(given)).expanduser() != got:
            names[role] = str(given)
    out._hub_names = {**pair._hub_names, **names}
    return out


def hub_source(path: str | Path | None) -> dict[str, str] | None:
    """{"repo_id", "revision"} when `path` is a snapshot in a Hugging Face cache, else None."""
    if path is None:
        return None
    p = Path(path)
    if p.parent.name != "snapshots" or not p.parent.parent.name.startswith("models--"):
        return None
    return {"repo_id": p.parent.parent.name[len("models--"):].replace("--", "/"), "revision": p.name}


def _download_command() -> str:
    """The download CLI of the installed huggingface_hub: `hf` since 0.34, `huggingface-cli` before."""
    import huggingface_hub

    try:
        major, minor = (int(x) for x in huggingface_hub.__version__.split(".")[:2])
    except ValueError:
        return "hf download"
    return "hf download" if (major, minor) >= (0, 34) else "huggingface-cli download"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return " ".join(text.splitlines()[0].split()) if text else type(exc).__name__
