"""The documentation site builds with every link and anchor resolved, and its generated
reference names everything it documents: each role variable, each command and its options,
each `socketwise_*` name an inventory sets that the playbooks and roles read.

Each check finds what must be documented on its own (the specs, the parser, the
playbooks), not through socketwise.docs.reference, so a generator that skips something
fails here."""

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from socketwise.cli import build_parser
from socketwise.docs import reference

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def site() -> Iterator[Path]:
    # Not tmp_path_factory: its first use sweeps old pytest directories, seconds on a
    # controller whose labs leave large ones.
    with tempfile.TemporaryDirectory(prefix="socketwise-site-") as scratch:
        yield _build(Path(scratch))


def _build(out: Path) -> Path:
    result = subprocess.run(
        [str(BIN / "mkdocs"), "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        env=os.environ | {"NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return out


def _sections(markdown: str, level: int) -> dict[str, str]:
    """{heading text: the text up to the next heading of that level or above}."""
    found, title = {}, None
    for line in markdown.splitlines():
        heading = re.match(rf"^(#{{1,{level}}}) (.+)$", line)
        if heading:
            title = heading[2] if len(heading[1]) == level else None
            if title is not None:
                found[title] = ""
        elif title is not None:
            found[title] += line + "\n"
    return found


def test_the_site_builds_strict_with_every_page_of_the_nav(site):
    nav = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)["nav"]
    pages = re.findall(r"[\w/-]+\.md", str(nav))
    committed = {path.relative_to(REPO / "docs").as_posix() for path in REPO.glob("docs/**/*.md")}
    generated = set(reference.pages(REPO))
    # The generated pages are the site's, never files in docs/.
    assert committed & generated == set()
    assert len(pages) == len(set(pages))
    assert set(pages) == committed | generated
    for page in pages:
        html = "index.html" if page == "index.md" else page.removesuffix(".md") + "/index.html"
        assert (site / html).is_file(), page


def test_every_renamed_variable_is_listed_and_its_new_name_is_a_role_variable():
    """A renamed variable's new name is one a role declares, its old one none does: the
    first play's refusal sends a user to a name that works."""
    renamed = yaml.safe_load((REPO / reference.RENAMED_VARIABLES).read_text())
    declared = {
        name
        for spec in reference.role_specs(REPO).values()
        for entry_point in spec.values()
        for name in entry_point.get("options") or {}
    }
    renamed_rows = reference.variables_page(REPO).split("## Renamed variables\n", 1)[1]
    for old, new in renamed.items():
        assert old not in declared, f"{old} is declared again: take it out of the renamed"
        assert new["name"] in declared, f"{old}: its new name {new['name']} is no role's"
        assert f"| `{old}` | [`{new['name']}`](#{new['name']}) |" in renamed_rows


def test_every_role_variable_is_in_the_variables_reference():
    page = reference.variables_page(REPO)
    roles = _sections(page, 2)
    specs = sorted(REPO.glob("roles/*/meta/argument_specs.yml"))
    assert len(specs) >= 7
    for spec_file in specs:
        role = spec_file.parent.parent.name
        assert role in roles, f"{role} has no section"
        for entry_point, spec in yaml.safe_load(spec_file.read_text())["argument_specs"].items():
            assert f"### {role}: {entry_point}" in page
            for name, option in (spec.get("options") or {}).items():
                # The anchor other pages link to: reference/variables.md#NAME.
                row = f'| <a id="{name}"></a>`{name}` | '
                assert row in roles[role], f"{role}: {name}"
                # Its Required cell says whether a play may leave it out.
                # (after its type and its default, whose code may hold a `|`).
                cells = re.match(r"[^|]+ \| (`[^`]*`)? \| (\w*) \|", roles[role].split(row, 1)[1])
                assert cells, f"{role}: {name}"
                assert cells[2] == ("yes" if option.get("required") else "no"), f"{role}: {name}"
            # The entry point names what it reads, each a link to the role's one row of it.
            section = page.split(f"### {role}: {entry_point}\n", 1)[1].split("\n#", 1)[0]
            names = re.findall(r"\[`(\w+)`\]\(#\1\)", section)
            assert names == list(spec.get("options") or {}), f"{role}: {entry_point}"
    # Each variable is anchored once, however many entry points read it.
    anchors = re.findall(r'<a id="(\w+)"></a>', page)
    assert len(anchors) == len(set(anchors))


def _commands(parser, words):
    yield words, parser
    if parser._subparsers is not None:
        for action in parser._subparsers._group_actions:
            for name, subparser in action.choices.items():
                yield from _commands(subparser, (*words, name))


def test_every_command_and_option_is_in_the_cli_reference():
    page = reference.cli_page(REPO)
    sections = _sections(page, 2) | _sections(page, 3) | _sections(page, 4)
    commands = list(_commands(build_parser(), ("socketwise",)))
    assert len(commands) >= 8
    for words, parser in commands:
        section = sections[" ".join(words)]
        for action in parser._actions:
            if action.help == "==SUPPRESS==" or "-h" in action.option_strings:
                continue
            if action.option_strings:
                for option in action.option_strings:
                    assert re.search(rf"`{re.escape(option)}\b", section), (words, option)
            elif action.dest != "==SUPPRESS==" and not action.choices:
                assert (action.metavar or action.dest) in section, (words, action.dest)
    scripts = [
        path.name
        for path in (REPO / "scripts").iterdir()
        if path.read_text().startswith("#!/usr/bin/env python3") and "argparse" in path.read_text()
    ]
    assert scripts
    for script in scripts:
        assert f"scripts/{script}" in sections, script
        assert "usage:" in sections[f"scripts/{script}"]


_NAME = re.compile(r"(?<![\w/.-])socketwise_[a-z0-9_]*[a-z0-9]\b")


def _strings_and_kit_facts(node, strings: list[str], kit: set[str]) -> None:
    """Every string value under `node` (comments and keys are not reads), and the names
    tasks set: set_fact and vars keys, register, group_by key and add_host groups values."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("set_fact", "ansible.builtin.set_fact", "vars") and isinstance(value, dict):
                kit.update(value)
            if key == "register":
                kit.add(value)
            if key in ("group_by", "ansible.builtin.group_by"):
                kit.add(value["key"])
            if key in ("add_host", "ansible.builtin.add_host"):
                kit.add(value["groups"])
            _strings_and_kit_facts(value, strings, kit)
    elif isinstance(node, list):
        for item in node:
            _strings_and_kit_facts(item, strings, kit)
    elif isinstance(node, str):
        strings.append(node)


def test_every_inventory_variable_the_kit_reads_is_documented_and_none_is_unused():
    strings, kit = [], set()
    files = [*REPO.glob("*.yml"), *REPO.glob("playbooks/**/*.yml"), *REPO.glob("molecule/**/*.yml")]
    files += [p for p in REPO.glob("roles/*/*/**/*.yml") if "/meta/" not in str(p)]
    for path in files:
        _strings_and_kit_facts(yaml.safe_load(path.read_text()), strings, kit)
    for path in [*REPO.glob("templates/**/*.j2"), *REPO.glob("roles/*/templates/**/*.j2")]:
        strings.append(re.sub(r"\{#.*?#\}", "", path.read_text(), flags=re.DOTALL))
    read = {name for text in strings for name in _NAME.findall(text)}
    # A Prometheus label and a metric the monitor's templates write, not variables.
    inventory_level = read - kit - {"socketwise_instance", "socketwise_operation_in_progress"}
    assert {"socketwise_cluster", "socketwise_tune", "socketwise_frontdoor"} <= inventory_level

    entries = yaml.safe_load((REPO / "docs/reference/inventory-variables.yml").read_text())
    documented = {entry["name"] for entry in entries}
    assert inventory_level - documented == set(), "read by the kit, missing from the file"
    assert documented - inventory_level == set(), "in the file, read by nothing"
    assert reference.inventory_problems(REPO) == []
    for entry in entries:
        assert entry["kind"] in ("variable", "group") and entry["meaning"], entry["name"]


def test_the_readme_links_become_the_sites():
    readme = "\n".join(
        [
            "[lab](docs/getting-started/lab.md#boot) [log](CHANGELOG.md) [terms](./LICENSE)",
            "[play](playbooks/deploy.yml) [web](https://example.org/x.md) [up](#quick-start)",
            "![plot](docs/img/plot.png)",
            "[ref]: docs/reference/cli.md",
            "```markdown",
            "[as written](docs/guides/deploy.md)",
            "```",
        ]
    )
    assert reference.site_links(readme).splitlines() == [
        "[lab](getting-started/lab.md#boot) [log](changelog.md) [terms](license.md)",
        "play [web](https://example.org/x.md) [up](#quick-start)",
        "![plot](img/plot.png)",
        "[ref]: reference/cli.md",
        "```markdown",
        "[as written](docs/guides/deploy.md)",
        "```",
    ]
    with_repo = reference.site_links("[play](playbooks/deploy.yml#L3)", "https://git.example/sw/")
    assert with_repo == "[play](https://git.example/sw/blob/HEAD/playbooks/deploy.yml#L3)"


def test_the_home_page_keeps_the_readmes_nested_lists_and_names_pages_by_their_titles():
    import markdown  # mkdocs's own Markdown

    html = markdown.markdown(reference.home_page(REPO), extensions=["tables", "toc"])
    # Each section of the README's table of contents is a list of its own pages.
    guides = html.split("<li>Guides", 1)[1].split("</ul>", 1)[0]
    assert "<ul>" in guides and '<a href="guides/deploy.md">Deploying</a>' in guides
    # A link the README writes as its own path reads as the page's title on the site.
    assert '<a href="getting-started/lab.md">The lab</a>' in html
    assert ">docs/getting-started/lab.md<" not in html


def test_a_readme_link_that_leads_nowhere_in_the_repository_is_reported():
    with tempfile.TemporaryDirectory() as scratch:
        repo = Path(scratch)
        (repo / "LICENSE").write_text("terms")
        (repo / "README.md").write_text(
            "[terms](LICENSE) [cli](docs/reference/cli.md) [gone](docs/guides/gone.md#x)\n"
            "[site-relative](guides/deploy.md) [web](https://example.org/) [up](#top)\n"
        )
        problems = reference.repository_link_problems(repo)
    assert problems == [
        "README.md: the link docs/guides/gone.md#x leads nowhere in the repository",
        "README.md: the link guides/deploy.md leads nowhere in the repository",
    ]


def test_every_key_deploy_summary_json_records_is_in_the_deploy_guide():
    tasks = yaml.safe_load((REPO / "roles/vllm_service/tasks/verify.yml").read_text())
    (written,) = [t for t in tasks if t["name"] == "Write deploy-summary.json on the controller"]
    guide = (REPO / "docs/guides/deploy.md").read_text()
    section = guide.split("## deploy-summary.json", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([a-z0-9_]+)`", section))
    summary = written["vars"]["__vllm_service_summary"]
    missing = sorted(set(summary) - named) + sorted(
        f"{key}.{inner}"
        for key in ("front_door", "versions", "build")
        for inner in summary[key]
        if inner not in named
    )
    assert missing == [], f"deploy-summary.json keys the deploy guide does not name: {missing}"
