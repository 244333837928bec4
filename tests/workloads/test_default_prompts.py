"""The default prompt sets: inside the package, and no default code prompt from a training file."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest

from autospec.errors import InputError
from autospec.models import BUNDLED_TARGET, MODEL_CARD
from autospec.workloads import stdlib_prompts as sp
from autospec.workloads.default_prompts import bundled_prompt_sets
from autospec.workloads.prompts import prompt_set_digest
from training.train import corpus_held_out, file_list_hash, stdlib_files

CARD = json.loads(MODEL_CARD.read_text())
STDLIB = Path(sysconfig.get_paths()["stdlib"])
TRAINING_PYTHON = file_list_hash(stdlib_files(), STDLIB) == CARD["corpus"]["file_list_sha256"]
needs_training_python = pytest.mark.skipif(not TRAINING_PYTHON, reason="not the Python whose stdlib trained the pair")


def test_default_sets_need_nothing_outside_the_package(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOSPEC_DATA_DIR", str(tmp_path / "nowhere"))
    monkeypatch.chdir(tmp_path)
    sets = bundled_prompt_sets(limit=5)
    assert set(sets) == {"code", "chat", "math"}
    for domain, prompts in sets.items():
        assert len(prompts) == 5 and {p.domain for p in prompts} == {domain}
        assert len({p.source_id for p in prompts}) == 5 and all(p.text.strip() for p in prompts)
    assert len(bundled_prompt_sets()["chat"]) == 48 and len(bundled_prompt_sets()["math"]) == 48


@needs_training_python
def test_the_held_out_list_is_the_training_splits_validation_tail():
    """Recompute the split `train fit` made (last 1% of the token stream) and compare with the card."""
    recomputed = corpus_held_out(BUNDLED_TARGET / "tokenizer.json", CARD["training"]["settings"]["val_fraction"])
    card = {key: value for key, value in CARD["corpus"]["held_out"].items() if key != "shared_with_training"}
    assert recomputed == card
    assert len(recomputed["files"]) >= 10


@needs_training_python
def test_no_default_code_prompt_comes_from_a_training_file():
    held = {entry["path"] for entry in CARD["corpus"]["held_out"]["files"]}
    modules = {entry["module"] for entry in CARD["corpus"]["held_out"]["files"]}
    prompts = sp.stdlib_prompts()
    assert len(prompts) >= 100
    assert {p.source_id.split(":")[1] for p in prompts} <= modules
    training_text = "\0".join(f.read_text(encoding="utf-8", errors="replace") for f in stdlib_files()
                              if f.relative_to(STDLIB).as_posix() not in held)
    leaked = [p.source_id for p in prompts if p.text.strip() in training_text]
    assert leaked == []


def test_code_prompts_are_a_header_and_its_docstring():
    for p in sp.stdlib_prompts(limit=60):
        first = p.text.lstrip()
        assert first.startswith(("def ", "class ", "async def ")), p.source_id
        assert p.text.rstrip().endswith(('"', "'")), p.source_id  # the docstring's closing quote


def test_a_changed_or_missing_held_out_file_is_skipped(monkeypatch, tmp_path):
    card = json.loads(MODEL_CARD.read_text())
    files = card["corpus"]["held_out"]["files"]
    full = {p.source_id.split(":")[1] for p in sp.stdlib_prompts()}
    assert "zipfile" in full
    for entry in files:
        if entry["module"] == "zipfile":
            entry["sha256"] = "0" * 64  # as if another Python shipped a different zipfile.py
    files.append({"module": "no_such_module", "path": "no_such_module.py", "sha256": "0" * 64})
    fake = tmp_path / "card.json"
    fake.write_text(json.dumps(card))
    real = sp.held_out_modules
    monkeypatch.setattr(sp, "held_out_modules", lambda card_path=None: real(fake))
    sp._all_stdlib_prompts.cache_clear()
    try:
        remaining = {p.source_id.split(":")[1] for p in sp.stdlib_prompts()}
    finally:
        sp._all_stdlib_prompts.cache_clear()
    assert remaining == full - {"zipfile"}


def test_no_usable_held_out_file_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(sp, "held_out_modules", lambda card_path=None: ([], set()))
    sp._all_stdlib_prompts.cache_clear()
    try:
        with pytest.raises(InputError, match="--dataset"):
            sp.stdlib_prompts()
    finally:
        sp._all_stdlib_prompts.cache_clear()


def test_the_prompt_set_digest_names_the_texts():
    prompts = sp.stdlib_prompts(limit=10)
    digest = prompt_set_digest(prompts)
    assert digest == prompt_set_digest(list(prompts)) and digest["prompts"] == 10
    assert digest["domains"] == {"code": 10} and len(digest["sha256"]) == 64
    assert prompt_set_digest(prompts[:9])["sha256"] != digest["sha256"]
