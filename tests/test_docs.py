"""Documentation that is generated from code stays current."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_config_reference_is_current():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen-config-docs.py"), "--check"], capture_output=True)
    assert r.returncode == 0, "docs/CONFIG.md is stale: run .venv/bin/python scripts/gen-config-docs.py"


def test_readme_names_the_two_setup_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    assert "bash scripts/demo.sh" in readme and "bash scripts/test.sh" in readme
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_every_cli_contract_command_is_documented():
    readme = (ROOT / "README.md").read_text()
    for cmd in (
        "peep keys generate", "peep bundle build", "peep bundle verify", "peep serve", "peep mqtt retire", "peep train",
        "peep audit",
        "peep qbbs evaluate", "peep bench", "peep demo", "peep-edge run", "peep-edge enroll", "peep-edge bundle verify",
        "peep anonymize run", "peep anonymize evaluate", "peep sgap train",
    ):  # fmt: skip
        assert cmd in readme, cmd


def _project_texts() -> list[Path]:
    roots = ["shared/src", "edge/src", "server/src", "lab/src", "tests", "scripts", "deploy", "docs", ".ci"]
    files = [ROOT / "README.md", *(f for r in roots for f in (ROOT / r).rglob("*") if f.is_file())]
    return [f for f in files if f.suffix in {".py", ".md", ".sh", ".toml", ""} and f != Path(__file__).resolve()]


def test_design_documents_cited_are_in_the_repository():
    """The blueprint and conventions are cited as docs/DESIGN.md and docs/CONVENTIONS.md, which exist;
    nothing points at a team folder outside the repository."""
    outside = "/work/" + "shared"
    for f in _project_texts():
        text = f.read_text(errors="replace")
        rel = f.relative_to(ROOT)
        for page in re.findall(r"\bdocs/([\w-]+\.md)", text):
            assert (ROOT / "docs" / page).is_file(), f"{rel} cites docs/{page}, which does not exist"
        if rel.parts[0] != "docs":  # pages in docs/ link to each other relatively
            for doc in set(re.findall(r"\b(DESIGN|CONVENTIONS)\b", text)):
                assert f"docs/{doc}.md" in text, f"{rel} cites {doc} without its path docs/{doc}.md"
        assert outside not in text, f"{rel} refers to {outside}, outside the repository"


# --------------------------------------------------------------------------- the README and docs/ pages

README_MAX_LINES = 250


def _pages() -> list[Path]:
    """The README and every page under docs/ (the pages a reader follows links between)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_readme_is_a_newcomers_page_of_at_most_250_lines():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines, at most {README_MAX_LINES}: move a section to docs/"


def test_readme_test_command_is_the_one_ci_runs():
    """.ci/run ends by running one command; the README shows a newcomer exactly that command."""
    ci = (ROOT / ".ci" / "run").read_text()
    [command] = re.findall(r"^exec (.+)$", ci, flags=re.M)
    readme_commands = {line.split("#")[0].strip() for line in _code_lines((ROOT / "README.md").read_text())}
    assert command.strip() in readme_commands, f".ci/run runs {command!r}, which no README code line shows"


def test_every_docs_page_starts_with_an_introduction():
    """A page says who it is for and what is in it before its first section."""
    for page in sorted((ROOT / "docs").glob("*.md")):
        lines = page.read_text().splitlines()
        assert lines and lines[0].startswith("# "), f"{page.name}: no title on its first line"
        before = []
        for line in lines[1:]:
            if line.startswith("## "):
                break
            before.append(line)
        assert len(" ".join(before).split()) >= 15, f"{page.name}: no introduction before its first section"


# --------------------------------------------------------------------------- no tracker numbers

#: A citation of a tracker entry: "issue 14", "issues #12", "ticket 3", "PR 7", "(#14)", "see #14".
TRACKER = re.compile(
    r"\b(?:issues?|tickets?|bugs?|PRs?|pull requests?)\s*(?:#|no\.\s*|number\s*)?\d+"
    r"|\(#\d+\)|\b(?:see|fixes|closes|in)\s+#\d+\b",
    flags=re.IGNORECASE,
)


def _citations(text: str) -> list[str]:
    return [m.group() for m in TRACKER.finditer(re.sub(r"\s+", " ", text))]


def test_the_tracker_pattern_catches_citations_and_nothing_else():
    for cited in ("see issue 14", "issue #14", "Issue\n  16's targets", "(#14)", "issues 12 and 15", "PR 7", "see #3"):
        assert _citations(cited), cited
    plain_texts = ("migration 9", "CONVENTIONS item 7", "the tracker's max_age_s", "&#39;", "color: #333", "CA issues")
    for plain in plain_texts:
        assert not _citations(plain), plain


def _help_texts() -> list[tuple[str, str]]:
    """(command, help text) for every parser and sub-parser of `peep` and `peep-edge`."""
    import argparse

    from peep.edge.cli import _parser as edge_parser
    from peep.server.cli import build_parser

    def walk(parser: argparse.ArgumentParser, name: str):
        yield name, parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    yield from walk(sub, f"{name} {sub_name}")

    return [*walk(build_parser(), "peep"), *walk(edge_parser(), "peep-edge")]


def test_no_help_text_cites_a_tracker_number():
    texts = _help_texts()
    names = {name for name, _ in texts}
    assert {"peep serve", "peep sgap train", "peep anonymize run", "peep-edge deadletter list"} <= names
    for name, text in texts:
        assert not _citations(text), f"`{name} --help` cites {_citations(text)}: say what the thing is instead"


def test_no_page_or_deployment_file_cites_a_tracker_number():
    deploy = [f for f in (ROOT / "deploy").rglob("*") if f.is_file()]
    for f in [*_pages(), *deploy]:
        found = _citations(f.read_text(errors="replace"))
        assert not found, f"{f.relative_to(ROOT)} cites {found}: a reader cannot look that up; say what the thing is"


def test_no_source_comment_or_docstring_cites_a_tracker_number():
    suffixes = {".py", ".md", ".toml", ".sh", ".html", ".js", ".css", ".proto", ".cfg", ".yaml", ".conf"}
    roots = ["shared", "edge", "server", "tests", "scripts", "proto", ".ci"]
    files = [ROOT / "pyproject.toml", *(f for r in roots for f in (ROOT / r).rglob("*") if f.is_file())]
    files = [f for f in files if (f.suffix in suffixes or f.parent.name == ".ci") and "egg-info" not in str(f)]
    files = [f for f in files if f != Path(__file__).resolve()]  # this file's examples of what is refused
    cited = {str(f.relative_to(ROOT)): _citations(f.read_text(errors="replace")) for f in files}
    cited = {f: c for f, c in cited.items() if c}
    assert not cited, f"tracker numbers cited (say what the thing is instead): {cited}"


# --------------------------------------------------------------------------- links

LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _code_lines(text: str) -> list[str]:
    """The lines inside the fenced code blocks of a Markdown text."""
    out, inside = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
        elif inside:
            out.append(line)
    return out


def _outside_code_blocks(text: str) -> list[str]:
    """The lines of a Markdown text outside its fenced code blocks."""
    out, inside = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
        elif not inside:
            out.append(line)
    return out


def _prose(text: str) -> str:
    """A Markdown text without its fenced code blocks and code spans (links there are not links)."""
    return "\n".join(re.sub(r"`[^`\n]*`", "", line) for line in _outside_code_blocks(text))


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: formatting removed, lower case, punctuation and symbols dropped
    except '-' and '_', each space a '-'."""
    import unicodedata

    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for line in _outside_code_blocks(page.read_text()):
        m = re.match(r"^#{1,6}\s+(.+?)\s*#*\s*$", line)
        if not m:
            continue
        slug = github_slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def test_github_slugs():
    assert github_slug("Anonymised face datasets: `peep anonymize`") == "anonymised-face-datasets-peep-anonymize"
    assert github_slug("What the server keeps, for whom, for how long") == "what-the-server-keeps-for-whom-for-how-long"
    assert github_slug("A deep public embedding: dlib-resnet and PrivUnit (the demo's default)") == (
        "a-deep-public-embedding-dlib-resnet-and-privunit-the-demos-default"
    )
    assert github_slug("Server settings (`server.toml`, `[mqtt]`)") == "server-settings-servertoml-mqtt"
    assert github_slug("Honest per-template ε: Fisherfaces") == "honest-per-template-ε-fisherfaces"


def test_every_link_in_the_readme_and_docs_resolves():
    """Relative links name an existing file, and an anchor a heading of it; web links are well formed
    (not fetched: CI has no network)."""
    from urllib.parse import unquote, urlparse

    pages = [*_pages(), *sorted((ROOT / "deploy").rglob("*.md"))]
    broken = []
    for page in pages:
        for target in LINK.findall(_prose(page.read_text())):
            where = f"{page.relative_to(ROOT)}: ({target})"
            url = urlparse(target)
            if url.scheme in ("http", "https"):
                if not url.netloc or "." not in url.netloc:
                    broken.append(f"{where} is not a well-formed web address")
                continue
            if url.scheme == "mailto":
                continue
            if url.scheme:
                broken.append(f"{where}: scheme {url.scheme!r} is neither http(s) nor a relative path")
                continue
            path = (page.parent / unquote(url.path)).resolve() if url.path else page
            if not path.exists():
                shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                broken.append(f"{where} names {shown}, which does not exist")
                continue
            if url.fragment and path.suffix == ".md" and unquote(url.fragment) not in _anchors(path):
                broken.append(f"{where}: {path.name} has no heading with the anchor #{url.fragment}")
    assert not broken, "broken links:\n" + "\n".join(broken)
