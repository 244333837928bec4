"""--target/--draft as Hugging Face ids: a local directory wins, then the local hub cache; downloads only on
opt-in. The cache here is a real hub cache layout built in tmp (no network: HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import json
import shutil
import socket
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autospec.cli import app
from autospec.config import PairSpec, dump_run_spec, load_run_spec
from autospec.errors import InputError
from autospec.hub import hub_source, resolve_model

from autospec_testing import make_tiny_model

COMMIT = "3f5c1d2e4b6a79801234567890abcdef12345678"  # a snapshot is named by its 40-hex commit
OLD_COMMIT = "0" * 39 + "1"


def _tokenizer(path: Path) -> None:
    """A word-level tokenizer over the tiny models' six ids, so the CLI can run the pair end to end."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"alpha": 0, "beta": 1, "gamma": 2, "delta": 3, "<unk>": 4, "</s>": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>").save_pretrained(path)


def _cache_model(cache: Path, repo_id: str, model: Path, commit: str = COMMIT, ref: str = "main") -> Path:
    """models--org--name/snapshots/<commit>/ holding the model, refs/<ref> naming the commit."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(model, snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / ref).write_text(commit)  # written without a newline, as huggingface_hub does
    return snapshot


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_hub_models")
    target = make_tiny_model(root / "target", vocab=6, layers=2, seed=1)
    draft = make_tiny_model(root / "draft", vocab=6, layers=1, seed=2)
    for model in (target, draft):
        _tokenizer(model)
    return target, draft


@pytest.fixture()
def hub(tmp_path, monkeypatch, tiny_models):
    """A hub cache with org/tiny-target (main → COMMIT, plus an older snapshot) and org/tiny-draft."""
    home = tmp_path / "hf-home"
    cache = home / "hub"
    target, draft = tiny_models
    snapshots = {"target": _cache_model(cache, "org/tiny-target", target),
                 "draft": _cache_model(cache, "org/tiny-draft", draft),
                 "old": _cache_model(cache, "org/tiny-target", target, commit=OLD_COMMIT, ref="v0")}
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # there is no network here
    return cache, snapshots


@pytest.fixture()
def no_network(monkeypatch):
    """Record (and refuse) every attempt to reach the network."""
    attempts: list[object] = []

    def refuse(*args, **_kwargs):
        attempts.append(args)
        raise OSError("network access attempted in a test")

    monkeypatch.setattr(socket.socket, "connect", lambda self, address: refuse(address))
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return attempts


def test_hub_id_resolves_to_its_cached_snapshot(hub):
    cache, snapshots = hub
    assert resolve_model("org/tiny-target") == snapshots["target"].resolve()
    assert resolve_model("org/tiny-target@main") == snapshots["target"].resolve()
    assert resolve_model("org/tiny-target@v0") == snapshots["old"].resolve()  # a tag / branch via refs/
    assert resolve_model(f"org/tiny-target@{OLD_COMMIT}") == snapshots["old"].resolve()  # a commit
    assert hub_source(resolve_model("org/tiny-target")) == {"repo_id": "org/tiny-target", "revision": COMMIT}


def test_a_pair_of_ids_resolves_and_remembers_the_names(hub):
    _cache, snapshots = hub
    pair = PairSpec(target="org/tiny-target", draft="org/tiny-draft@main").resolved()
    assert pair.target == snapshots["target"].resolve() and pair.draft == snapshots["draft"].resolve()
    assert pair.hub_names == {"target": "org/tiny-target", "draft": "org/tiny-draft@main"}
    assert PairSpec().resolved() == PairSpec()  # the bundled pair: local directories, unchanged


def test_a_local_directory_wins_over_the_cache(hub, tmp_path, monkeypatch, tiny_models):
    local = tmp_path / "work"
    shutil.copytree(tiny_models[1], local / "org" / "tiny-target")  # a directory named like the id
    monkeypatch.chdir(local)
    assert resolve_model("org/tiny-target") == Path("org/tiny-target")
    assert resolve_model(tiny_models[0]) == tiny_models[0]  # and a plain directory path still works
    pair = PairSpec(target="org/tiny-target", draft=tiny_models[1]).resolved()
    assert pair.hub_names == {}


def test_a_missing_model_is_one_line_naming_the_cache_and_the_way_to_get_it(hub, no_network):
    cache, _ = hub
    with pytest.raises(InputError) as exc:
        resolve_model("org/absent", field="draft")
    line = exc.value.one_line()
    assert "\n" not in line and line.startswith("org/absent [draft]: not a local directory")
    assert str(cache) in line and "--allow-download" in line and "download org/absent" in line
    with pytest.raises(InputError, match="does not exist"):
        resolve_model("/no/such/model/dir")  # a path, not an id: no cache to look in
    assert no_network == []


def test_no_network_call_without_opt_in(hub, monkeypatch, no_network):
    monkeypatch.delenv("HF_HUB_OFFLINE")  # nothing but the opt-in stands between the code and the network
    with pytest.raises(InputError, match="not in the Hugging Face cache"):
        resolve_model("org/absent")
    assert no_network == []
    assert resolve_model("org/tiny-target").name == COMMIT  # a cached id needs no network either
    assert no_network == []


def test_opting_in_while_offline_says_so_without_a_network_call(hub, no_network):
    with pytest.raises(InputError, match="HF_HUB_OFFLINE is set"):
        resolve_model("org/absent", allow_download=True)
    assert no_network == []


def test_generate_runs_a_pair_named_by_hub_ids(hub, tmp_path):
    _cache, snapshots = hub
    prompts = tmp_path / "p.txt"
    prompts.write_text("alpha beta gamma\ndelta alpha\n")
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["generate", "--target", "org/tiny-target", "--draft", "org/tiny-draft",
                                   "--prompts", str(prompts), "--k", "2", "--max-tokens", "4", "--json",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.stdout)["texts"]) == 2
    manifest = json.loads((out / "manifest.json").read_text())
    target = manifest["models"]["target"]
    assert Path(target["path"]) == snapshots["target"].resolve()
    assert target["repo_id"] == "org/tiny-target" and target["revision"] == COMMIT
    assert target["sha256"]["config.json"]  # the snapshot's files are what gets hashed
    config = tomllib.loads((out / "config.toml").read_text())
    assert config["pair"]["target"] == "org/tiny-target" and config["pair"]["draft"] == "org/tiny-draft"


@pytest.mark.parametrize("command", ["generate", "profile", "evaluate"])
def test_a_missing_id_on_the_command_line_is_exit_2_without_traceback(hub, tmp_path, command):
    cache, _ = hub
    out = tmp_path / "out"
    extra = {"generate": [], "profile": [],
             "evaluate": ["--workload", str(tmp_path / "w.toml"), "--strategies", "no-sd"]}[command]
    res = CliRunner().invoke(app, [command, "--target", "org/absent", "--draft", "org/tiny-draft",
                                   "--out", str(out), *extra])
    assert res.exit_code == 2, res.output
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: org/absent [target]: "), res.stderr
    assert str(cache) in res.stderr and "Traceback" not in res.output
    assert not out.exists()


def test_run_config_takes_ids_and_allow_download(hub, tmp_path):
    (tmp_path / "models" / "draft").mkdir(parents=True)
    config = tmp_path / "c.toml"
    config.write_text('stages = ["generate"]\n[pair]\ntarget = "org/tiny-target@main"\n'
                      'draft = "models/draft"\nallow_download = true\n')
    spec = load_run_spec(config)
    # an id stays an id; a directory next to the config file resolves against the file's folder
    assert spec.pair.target == Path("org/tiny-target@main") and spec.pair.draft == tmp_path / "models" / "draft"
    assert spec.pair.allow_download is True
    spec.pair = spec.pair.resolved()
    assert tomllib.loads(dump_run_spec(spec))["pair"]["target"] == "org/tiny-target@main"

    config.write_text('stages = ["generate"]\n[pair]\ntarget = "org/absent"\ndraft = "org/tiny-draft"\n')
    res = CliRunner().invoke(app, ["run", str(config), "--out", str(tmp_path / "run")])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "org/absent" in res.stderr, res.output
    assert not (tmp_path / "run").exists()
