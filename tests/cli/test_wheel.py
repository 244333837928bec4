"""The wheel works: built from the sources, installed in a fresh venv, run from a folder outside the repo.

The checkout keeps the strategy presets (policies/) and workload specs (workloads/) at its top level;
pyproject.toml maps them into the package as autospec/presets and autospec/workload_specs. These tests
check that mapping (no symlinks, no subpackage forgotten) and, slowly, that an installed wheel finds
its presets, workload specs, bundled trace, prompts and model weights with no checkout and no
../shared/data anywhere near.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import stat
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "autospec"
MAPPED = {"policies": "autospec/presets", "workloads": "autospec/workload_specs"}  # checkout -> wheel


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def test_pyproject_lists_every_subpackage_and_maps_the_top_level_folders():
    setuptools = _pyproject()["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(REPO).parts) for p in PACKAGE.rglob("__init__.py")}
    listed = set(setuptools["packages"])
    assert on_disk <= listed, f"add to [tool.setuptools] packages: {sorted(on_disk - listed)}"
    assert setuptools["package-dir"] == {"autospec.presets": "policies", "autospec.workload_specs": "workloads"}
    assert listed - on_disk == {"autospec.presets", "autospec.workload_specs"}


def test_no_symlinks_in_the_package_or_the_mapped_folders():
    for root in (PACKAGE, REPO / "policies", REPO / "workloads"):
        links = [str(p.relative_to(REPO)) for p in [root, *root.rglob("*")] if p.is_symlink()]
        assert not links, f"symlinks: {links}"


def _run(cmd: list, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kwargs)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _wheel_files(wheel: Path) -> dict[str, zipfile.ZipInfo]:
    with zipfile.ZipFile(wheel) as zf:
        return {info.filename: info for info in zf.infolist()}


def _expected_in_wheel() -> set[str]:
    """Every file of the package as the checkout holds it, where the wheel must put it."""
    files = {str(p.relative_to(REPO)) for p in PACKAGE.rglob("*")
             if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    for folder, target in MAPPED.items():
        files |= {f"{target}/{p.name}" for p in (REPO / folder).glob("*.toml")}
    return files


def _checkout_spec_sizes() -> dict[str, int]:
    """Requests per bundled workload spec built from the checkout (trace part only, as CHECK does)."""
    from autospec.workloads.spec import read_workload_spec

    return {p.stem: len(read_workload_spec(p).model_copy(update={"prompts": []}).build("."))
            for p in sorted((REPO / "workloads").glob("*.toml"))}


CHECK = """
import json, sys
import autospec
from autospec.config import bundled_workload
from autospec.models import BUNDLED_DRAFT, BUNDLED_TARGET
from autospec.strategy import list_presets, presets_dir
from autospec.workloads.loaders import bundled_trace
from autospec.workloads.spec import read_workload_spec

specs = {}
for path in sorted(bundled_workload("bursty").parent.glob("*.toml")):
    spec = read_workload_spec(bundled_workload(path.stem))
    # prompts = []: the trace part only (`autospec run` below exercises the default prompt sets)
    specs[path.stem] = len(spec.model_copy(update={"prompts": []}).build("."))
print(json.dumps({"package": autospec.__file__, "presets_dir": str(presets_dir()), "presets": list_presets(),
                  "workload": str(bundled_workload("azure-code-cpu")), "specs": specs,
                  "trace": str(bundled_trace("azure-code-2023")), "target": str(BUNDLED_TARGET),
                  "draft": str(BUNDLED_DRAFT), "prefix": sys.prefix}))
"""


@pytest.mark.slow
def test_installed_wheel_runs_outside_the_repo(tmp_path):
    # Build from a copy holding only what the wheel is made of (symlinks kept as symlinks, so a
    # link that crept back would show up in the wheel's listing, not be silently followed).
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for name in ("autospec", "policies", "workloads"):
        shutil.copytree(REPO / name, src / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", src, "--no-deps", "-q", "-w", dist])
    (wheel,) = dist.glob("autospec-*.whl")

    files = _wheel_files(wheel)
    links = [name for name, info in files.items() if stat.S_ISLNK(info.external_attr >> 16)]
    assert not links, f"symlinks in the wheel: {links}"
    assert {name.split("/")[0] for name in files} == {"autospec", wheel.name.split("-py")[0] + ".dist-info"}
    missing = _expected_in_wheel() - set(files)
    assert not missing, f"not in the wheel: {sorted(missing)}"
    for name in ("autospec/presets/static-k4.toml", "autospec/presets/adaspec.toml",
                 "autospec/workload_specs/azure-code-cpu.toml", "autospec/workloads/data/azure_llm_2023_code.csv.gz",
                 "autospec/workloads/data/ATTRIBUTION.txt", "autospec/models/bundled/draft/model.safetensors"):
        assert name in files
    assert any(n.startswith("autospec/models/bundled/target/") and n.endswith(".safetensors") for n in files)

    # A fresh venv: the wheel installed first (so pip sees no other autospec), then the test venv's
    # site-packages made visible for the dependencies (torch etc.), after the venv's own.
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel])
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (purelib / "zz_autospec_test_deps.pth").write_text("".join(f"{p}\n" for p in deps))

    work = tmp_path / "elsewhere"  # an empty folder: no checkout, no ../shared/data next to it
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("AUTOSPEC_DATA_DIR", "PYTHONPATH", "PYTHONHOME")}
    env.update(COLUMNS="200", PYTHONDONTWRITEBYTECODE="1")

    listing = _run([venv / "bin" / "autospec", "presets"], cwd=work, env=env).stdout
    for name in sorted(p.stem for p in (REPO / "policies").glob("*.toml")):
        assert name in listing, f"preset {name} missing from `autospec presets`:\n{listing}"

    found = json.loads(_run([python, "-c", CHECK], cwd=work, env=env).stdout.strip().splitlines()[-1])
    installed = Path(found["prefix"]).resolve()
    assert installed == venv.resolve()
    for key in ("package", "presets_dir", "workload", "trace", "target", "draft"):
        assert installed in Path(found[key]).resolve().parents, f"{key} not from the wheel: {found[key]}"
    assert Path(found["presets_dir"]).parts[-2:] == ("autospec", "presets")
    assert Path(found["workload"]).parts[-3:] == ("autospec", "workload_specs", "azure-code-cpu.toml")
    assert {"static-k4", "adaspec"} <= set(found["presets"])
    assert found["specs"] == _checkout_spec_sizes() and found["specs"]["azure-code-cpu"] == 200

    # `autospec run` on a generate-only config: the bundled pair over the default prompt sets, which must
    # come from the package too (no AUTOSPEC_DATA_DIR, nothing outside the installed wheel).
    config = work / "run.toml"
    config.write_text('stages = ["generate"]\n[generate]\nmax_tokens = 4\nprompts_per_set = 1\n')
    proc = _run([venv / "bin" / "autospec", "run", config, "--out", work / "run", "--json"], cwd=work, env=env)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    summary = json.loads((work / "run" / "generate" / "summary.json").read_text())
    assert len(report["texts"]) >= 1 and summary["requests"] == len(report["texts"])
    assert 0 < summary["generated_tokens"] <= 4 * len(report["texts"]) and summary["strategy"] == "static-k4"
