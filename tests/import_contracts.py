"""An import-linter contract type the built-in ones lack: "imports only the standard library".

Code that runs on target hosts (topology detection, host tuning, service checks, the
benchmark runner) is shipped without a virtualenv, so nothing it imports, directly or
through other socketwise modules, may come from outside the standard library.
"""

from __future__ import annotations

import sys

import grimp
from importlinter import Contract, ContractCheck, fields, output


class StdlibOnlyContract(Contract):
    """Every module below `source_modules`, and every socketwise module it imports, imports
    only the standard library (needs `include_external_packages = true`)."""

    type_name = "stdlib_only"

    source_modules = fields.ListField(subfield=fields.ModuleField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        roots = set(self.session_options["root_packages"])
        sources = sorted(
            {
                name
                for module in self.source_modules  # type: ignore[attr-defined]
                for name in {module.name} | graph.find_descendants(module.name)
            }
        )
        violations = []
        for source in sources:
            for imported in sorted(graph.find_upstream_modules(source)):
                top = imported.split(".")[0]
                if top in roots or top in sys.stdlib_module_names:
                    continue
                chain = graph.find_shortest_chain(importer=source, imported=imported)
                violations.append({"module": source, "imported": imported, "chain": chain})
        return ContractCheck(kept=not violations, metadata={"violations": violations})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for violation in check.metadata["violations"]:
            output.print_error(
                f"{violation['module']} imports {violation['imported']}, which is not in the "
                f"standard library: {' -> '.join(violation['chain'])}"
            )
            output.new_line()
