"""MkDocs hook: adds the pages generated from the code (socketwise.docs.reference) to the
site, and fails a strict build when the inventory variables' file and the playbooks
disagree, or a link of README.md, CHANGELOG.md or CONTRIBUTING.md leads nowhere in the
repository (where it is read first). The pages are never written into docs/."""

import logging
from pathlib import Path

from mkdocs.structure.files import File, Files

from socketwise.docs import reference

log = logging.getLogger("mkdocs.hooks.reference")


def on_files(files: Files, config) -> Files:
    repo = Path(config.config_file_path).parent
    for problem in reference.inventory_problems(repo) + reference.repository_link_problems(repo):
        log.warning(problem)
    for src_uri, content in reference.pages(repo, config.repo_url).items():
        committed = files.get_file_from_path(src_uri)
        if committed is not None:
            log.warning(f"docs/{src_uri} is generated at build time: remove the committed file")
            files.remove(committed)
        files.append(File.generated(config, src_uri, content=content))
    return files
