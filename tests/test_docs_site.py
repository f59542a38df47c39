"""The documentation site builds with warnings as errors, and every link in it and in the README leads
somewhere that exists: a page, a file of the repository, an anchor of that page. No network."""

from __future__ import annotations

import ast
import dataclasses
import os
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt
from mkdocs.config import load_config
from pymdownx.slugs import slugify

import turnguard

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MARKDOWN = (ROOT / "README.md", *sorted(DOCS.rglob("*.md")))
heading_slug = slugify(case="lower")  # mkdocs.yml's toc slugify: GitHub's anchors


def build(config_dir: Path, site_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's end-of-life banner, not a warning
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "--site-dir", str(site_dir)],
        cwd=config_dir, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )


@dataclasses.dataclass(frozen=True)
class Site:
    root: Path
    result: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    root = tmp_path_factory.mktemp("site")
    return Site(root, build(ROOT, root))


def test_the_site_builds_with_warnings_as_errors(site: Site):
    assert site.result.returncode == 0, site.result.stderr
    assert "WARNING" not in site.result.stderr


def test_a_broken_link_a_missing_anchor_and_a_page_outside_the_nav_fail_the_build(tmp_path: Path):
    copy = tmp_path / "project"
    shutil.copytree(DOCS, copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy)
    (copy / "src").symlink_to(ROOT / "src")
    with (copy / "docs" / "usage.md").open("a", encoding="utf-8") as page:
        page.write("\n[gone](no-such-page.md) and [nowhere](telemetry.md#no-such-heading)\n")
    (copy / "docs" / "orphan.md").write_text("# Not in the nav\n", encoding="utf-8")
    result = build(copy, tmp_path / "site")
    assert result.returncode != 0
    assert "'no-such-page.md'" in result.stderr
    assert "'#no-such-heading'" in result.stderr
    assert "orphan.md" in result.stderr


class Page(HTMLParser):
    """The ids a built page defines and the URLs it refers to (links and loaded resources)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.resources: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(values["id"])
        if tag == "a" and values.get("name"):
            self.ids.add(values["name"])
        if tag == "a" and values.get("href"):
            self.links.append(values["href"])
        elif tag in ("link", "script", "img", "source", "iframe") and (values.get("href") or values.get("src")):
            self.resources.append(values.get("href") or values.get("src") or "")


def parsed(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


@pytest.fixture(scope="module")
def pages(site: Site) -> dict[Path, Page]:
    assert site.result.returncode == 0, site.result.stderr
    return {path: parsed(path) for path in site.root.rglob("*.html")}


def test_every_link_in_the_built_site_leads_to_a_page_and_an_anchor_it_has(site: Site, pages: dict[Path, Page]):
    broken = []
    for path, page in pages.items():
        if path.name == "404.html":  # served at any depth: its links are site-absolute by design
            continue
        for href in page.links + page.resources:
            url = urlsplit(href)
            if url.scheme or href.startswith("//"):
                continue
            target = (path.parent / unquote(url.path)).resolve() if url.path else path
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file() or not target.is_relative_to(site.root):
                broken.append(f"{path.relative_to(site.root)}: {href} (no such file)")
            elif url.fragment and target.suffix == ".html" and unquote(url.fragment) not in pages[target].ids:
                broken.append(f"{path.relative_to(site.root)}: {href} (no such anchor)")
    assert broken == []
    assert sum(len(p.links) for p in pages.values()) > 500  # the walk saw the site's links


def test_the_site_loads_nothing_from_the_network(pages: dict[Path, Page]):
    remote = sorted({r for page in pages.values() for r in page.resources if urlsplit(r).scheme or r.startswith("//")})
    assert remote == []


def reference_ids(pages: dict[Path, Page], site: Site, name: str) -> set[str]:
    return pages[site.root / "reference" / name / "index.html"].ids


def test_the_api_reference_documents_every_public_name_of_the_package(site: Site, pages: dict[Path, Page]):
    documented = set().union(*(page.ids for path, page in pages.items() if "reference" in path.parts))
    missing = {f"turnguard.{name}" for name in turnguard.__all__} - documented
    assert missing == set(), "give these a '::: ' entry in docs/reference/turnguard.md"


def test_the_api_reference_documents_every_hook_and_every_configuration_option(site: Site, pages: dict[Path, Page]):
    import turnguard.hookspecs as hookspecs

    hooks = {f"turnguard.hookspecs.{name}" for name in vars(hookspecs) if name.startswith("turnguard_")}
    options = {f"turnguard.GuardConfig.{f.name}" for f in dataclasses.fields(turnguard.GuardConfig)}
    assert len(hooks) >= 15 and hooks - reference_ids(pages, site, "hookspecs") == set()
    assert options - reference_ids(pages, site, "config") == set()


def public_definitions(module: Path) -> set[str]:
    """Classes and functions a module defines at top level without a leading underscore."""
    tree = ast.parse(module.read_text(encoding="utf-8"))
    kinds = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {node.name for node in tree.body if isinstance(node, kinds) and not node.name.startswith("_")}


def test_the_api_reference_documents_telemetry_configure_and_every_integration(site: Site, pages: dict[Path, Page]):
    assert "turnguard.telemetry.configure" in reference_ids(pages, site, "telemetry")
    documented = reference_ids(pages, site, "integrations")
    hidden = {"register_commands", "TurnGuardState"}  # llm's plugin hook and LangChain's state schema
    for module in sorted((ROOT / "src" / "turnguard" / "integrations").glob("[!_]*.py")):
        names = {f"turnguard.integrations.{module.stem}.{name}" for name in public_definitions(module) - hidden}
        assert names, module.name
        assert names - documented == set(), f"{module.name}: add '::: ' entries to docs/reference/integrations.md"


# -- the Markdown as GitHub shows it: README.md links into docs/, and pages link each other ---------

def headings(page: Path) -> set[str]:
    tokens = MarkdownIt("commonmark").parse(page.read_text(encoding="utf-8"))
    return {heading_slug(tokens[i + 1].content, "-") for i, t in enumerate(tokens) if t.type == "heading_open"}


def markdown_links(page: Path) -> list[str]:
    tokens = MarkdownIt("commonmark").enable("table").parse(page.read_text(encoding="utf-8"))
    inline = (child for token in tokens if token.type == "inline" for child in token.children or ())
    return [str(child.attrs.get("href") or child.attrs.get("src")) for child in inline
            if child.type in ("link_open", "image")]


@pytest.mark.parametrize("page", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_in_the_markdown_leads_to_a_file_and_a_heading_it_has(page: Path):
    broken = []
    for href in markdown_links(page):
        url = urlsplit(href)
        if url.scheme:
            continue
        target = (page.parent / unquote(url.path)).resolve() if url.path else page
        if not target.exists() or not target.is_relative_to(ROOT):
            broken.append(f"{href} (no such file)")
        elif url.fragment and target.suffix == ".md" and url.fragment not in headings(target):
            broken.append(f"{href} (no such heading)")
    assert broken == []


def nav_pages(nav: list) -> list[str]:
    found: list[str] = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        found += nav_pages(value) if isinstance(value, list) else [value]
    return found


def test_the_readme_links_every_page_of_the_site():
    linked = {urlsplit(href).path for href in markdown_links(ROOT / "README.md")}
    pages = {f"docs/{page}" for page in nav_pages(load_config(str(ROOT / "mkdocs.yml"))["nav"])} - {"docs/index.md"}
    assert pages - linked == set()


def test_the_readme_opens_with_install_the_two_commands_and_the_loop_within_30_lines():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    loop = lines.index("## Wrap your loop")
    end = lines.index("```", lines.index("```python", loop))
    opening = "\n".join(lines[:loop])
    assert end < 30
    assert "`pip install turnguard`" in opening and '`pip install "turnguard[otlp]"`' in opening
    assert "`turnguard demo`" in opening  # what a pip user can run at once
    assert "./dev.sh demo" in opening and "./dev.sh test" in opening
