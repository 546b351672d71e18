"""Every relative link between the README, the changelog and docs/ resolves: the file
exists, and so does the #anchor (a heading, as GitHub makes its anchor, or an
`<a id>`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text outside fenced blocks and code spans (links there are not links)."""
    text = re.sub(r"^[ \t]*```.*?^[ \t]*```", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "", text)


def github_anchor(heading: str) -> str:
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = page.read_text()
    found: set[str] = set(re.findall(r'<a id="([^"]+)"></a>', text))
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", re.sub(r"^[ \t]*```.*?^[ \t]*```", "", text,
                                                        flags=re.MULTILINE | re.DOTALL), re.MULTILINE):
        anchor = github_anchor(heading)
        found.add(anchor if anchor not in seen else f"{anchor}-{seen[anchor]}")
        seen[anchor] = seen.get(anchor, 0) + 1
    return found


def test_the_anchor_rule_is_githubs() -> None:
    assert github_anchor("Trusting mitmproxy's CA") == "trusting-mitmproxys-ca"
    assert github_anchor("`faults:` in rules.yaml") == "faults-in-rulesyaml"
    assert github_anchor("Security and bounds") == "security-and-bounds"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no {linked}")
        elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
            broken.append(f"{target}: no #{anchor} in {linked.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def test_the_readme_links_every_doc_and_is_a_front_page() -> None:
    readme = (ROOT / "README.md").read_text()
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert f"](docs/{doc.name})" in readme, f"the README does not link docs/{doc.name}"
    assert len(readme.splitlines()) <= 250
    # the two set-up commands first, then the demo and try
    order = [readme.index(text) for text in ("scripts/run ", "scripts/test ", "scripts/demo ", "scripts/try")]
    assert order == sorted(order)
