"""The design lives in the repository (docs/) and every pointer to it resolves.

* Every relative link in README.md and docs/*.md names an existing file, and a `#fragment` names a
  heading of the linked Markdown file.
* Every `docs/<name>.md` that code, docstrings or comments under autospec/ (and tests/, benchmarks/)
  name exists; a `docs/policies.md §N` citation names a section docs/policies.md has, and a
  `docs/architecture.md, "Title"` (or vllm.md) citation a heading that file has.
* Nothing a user gets (autospec/, workloads/, policies/, docs/, README.md) points outside the
  repository at `../shared`, except the lines about the test-data folder `AUTOSPEC_DATA_DIR`.
* Every policy registered in the code (autospec/policies/base.py registries) has its name, in
  backticks, in docs/policies.md.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
MARKDOWN = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
CITING = ("autospec", "tests", "benchmarks")  # folders whose .py files may cite docs/*.md
USER_FACING = ("autospec", "workloads", "policies", "docs")

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
DOC_NAME = re.compile(r"docs/([A-Za-z0-9_.-]+\.md)")


def _prose(text: str) -> str:
    """Markdown without fenced blocks and code spans: a link-like string inside code is not a link."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def _slug(title: str) -> str:
    """GitHub's heading anchor: lower case, markup and punctuation dropped, spaces to hyphens."""
    title = re.sub(r"[`*_]", "", title).strip().lower()
    return re.sub(r"[^\w\- ]", "", title).replace(" ", "-")


def headings(path: Path) -> list[str]:
    return HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8")))


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for title in headings(path):
        slug = _slug(title)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    links = LINK.findall(_prose(path.read_text(encoding="utf-8")))
    return [t for t in links if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I)]  # http:, https:, mailto:


def broken_links(path: Path) -> list[str]:
    problems = []
    for target in relative_links(path):
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{path.name}: {target} (no such file)")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            problems.append(f"{path.name}: {target} (no heading #{fragment} in {dest.name})")
    return problems


def _label(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def python_files(folders) -> list[Path]:
    """The .py files of `folders`, this file excepted (its own probes cite sections that do not exist)."""
    here = Path(__file__).resolve()
    return [f for folder in folders for f in sorted((REPO / folder).rglob("*.py")) if f.resolve() != here]


def _flat(text: str) -> str:
    """Source with line breaks (and a continuing comment's `#`) folded into spaces, so a citation
    wrapped over two lines reads as one."""
    return re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)


# --- the checks, as functions of the files, so the tests below can feed them bad input too ----------


def test_the_three_documents_exist_and_the_readme_links_them():
    for name in ("architecture.md", "policies.md", "vllm.md"):
        assert (DOCS / name).is_file(), name
        assert f"(docs/{name})" in (REPO / "README.md").read_text(encoding="utf-8"), f"README does not link {name}"


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: p.name)
def test_relative_links_resolve(path):
    assert path.is_file()
    assert broken_links(path) == []


def test_the_link_check_sees_a_broken_link_and_a_bad_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Title\n\n## A section, with §2 — marks\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md) [ok](other.md#a-section-with-2--marks) [web](https://example.com/x.md)\n"
                    "[gone](missing.md) [bad](other.md#nowhere)\n```\n[in code](also-missing.md)\n```\n"
                    "`[span](span-missing.md)`\n")
    assert broken_links(page) == ["page.md: missing.md (no such file)",
                                  "page.md: other.md#nowhere (no heading #nowhere in other.md)"]


def cited_docs(files) -> dict[str, set[str]]:
    """docs/<name>.md -> the files that name it."""
    out: dict[str, set[str]] = {}
    for f in files:
        for name in DOC_NAME.findall(f.read_text(encoding="utf-8")):
            out.setdefault(name, set()).add(_label(f))
    return out


def missing_docs(files) -> dict[str, list[str]]:
    return {name: sorted(by) for name, by in cited_docs(files).items() if not (DOCS / name).is_file()}


def test_every_cited_doc_exists(tmp_path):
    files = python_files(CITING)
    assert {"architecture.md", "policies.md", "vllm.md"} <= set(cited_docs(files)), "the code no longer cites the docs"
    assert missing_docs(files) == {}
    probe = tmp_path / "probe.py"
    probe.write_text("# the plan is in docs/plan.md, the math in docs/policies.md\n")
    assert list(missing_docs([probe])) == ["plan.md"]


def bad_section_citations(files) -> list[str]:
    """`docs/policies.md §N` needs a heading starting `§N`; `docs/<doc>.md, "Title"` a heading Title."""
    problems = []
    policy_sections = {m.group(1) for h in headings(DOCS / "policies.md") if (m := re.match(r"§(\d+)\b", h))}
    titles = {name: {h.strip().lower() for h in headings(DOCS / name)} for name in ("architecture.md", "vllm.md")}
    for f in files:
        text = _flat(f.read_text(encoding="utf-8"))
        for refs in re.findall(r"docs/policies\.md((?:,? (?:and )?§\d+(?:\.\d+)?)+)", text):
            for n in re.findall(r"§(\d+)", refs):
                if n not in policy_sections:
                    problems.append(f"{_label(f)}: docs/policies.md §{n}")
        for name, title in re.findall(r"docs/(architecture\.md|vllm\.md),? \"([^\"]+)\"", text):
            if title.strip().lower() not in titles[name]:
                problems.append(f'{_label(f)}: docs/{name}, "{title}"')
    return problems


def test_section_citations_name_sections_that_exist(tmp_path):
    assert bad_section_citations(python_files(CITING)) == []
    bad = tmp_path / "bad.py"
    bad.write_text('"""See docs/policies.md §99 and docs/architecture.md, "No such\nheading"."""\n'
                   '# docs/policies.md §6: fine\n')
    assert bad_section_citations([bad]) == ["bad.py: docs/policies.md §99",
                                            'bad.py: docs/architecture.md, "No such heading"']


def shared_pointers(paths) -> list[str]:
    """Lines naming `../shared`, except those about AUTOSPEC_DATA_DIR (the line or its neighbours)."""
    hits = []
    for path in paths:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        for i, line in enumerate(lines):
            if "../shared" not in line:
                continue
            near = " ".join(lines[max(0, i - 1):i + 2])
            if "AUTOSPEC_DATA_DIR" in near and "../shared/data" in line:
                continue
            hits.append(f"{_label(path)}:{i + 1}: {line.strip()}")
    return hits


def user_facing_files() -> list[Path]:
    files = [REPO / "README.md"]
    for folder in USER_FACING:
        files += [f for f in sorted((REPO / folder).rglob("*")) if f.is_file() and "__pycache__" not in f.parts
                  and f.suffix not in (".safetensors", ".gz", ".pyc")]
    return files


def test_nothing_user_facing_points_at_the_shared_folder():
    assert shared_pointers(user_facing_files()) == []


def test_the_shared_folder_check_sees_a_dangling_pointer(tmp_path):
    probe = tmp_path / "probe.md"
    probe.write_text("see ../shared/POLICIES.md\nAUTOSPEC_DATA_DIR (default ../shared/data)\n"
                     "AUTOSPEC_DATA_DIR is not an excuse for ../shared/DESIGN.md\n")
    assert [h.split(":")[1] for h in shared_pointers([probe])] == ["1", "3"]


def test_every_registered_policy_is_specified_in_policies_md():
    from autospec.policies.base import REGISTRIES, policy_class

    policy_class("length", "static")  # loads the built-in policies into the registries
    text = (DOCS / "policies.md").read_text(encoding="utf-8")
    names = {name for registry in REGISTRIES.values() for name in registry}
    assert {"static", "gp-lcb", "dspark", "laps-sd"} <= names
    assert sorted(n for n in names if f"`{n}`" not in text) == []
