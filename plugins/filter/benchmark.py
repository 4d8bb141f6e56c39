"""Ansible door into socketwise.measure.hostdir: the filter `socketwise.kit.bench_dir_error`."""

from ansible_collections.socketwise.kit.plugins.module_utils.lazy import core_filter

# The core is imported inside each filter, never when the file loads: Ansible loads every
# filter file of the collection in each task's process (docs/development/architecture.md).


class FilterModule:
    def filters(self):
        return {"bench_dir_error": core_filter("measure.hostdir", "host_dir_error")}
