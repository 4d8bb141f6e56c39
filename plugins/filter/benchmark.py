"""Ansible door into socketwise.measure.hostdir: the filter `socketwise.kit.bench_dir_error`."""

from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.measure import hostdir


class FilterModule:
    def filters(self):
        return {"bench_dir_error": hostdir.host_dir_error}
