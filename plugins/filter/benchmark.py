"""Ansible door into socketwise.measure.hostdir: the filter `socketwise.kit.bench_dir_error`."""

# The core is imported inside each filter, never when the file loads: Ansible loads every
# filter file of the collection in each task's process (docs/development/architecture.md).


def bench_dir_error(*args, **kwargs):
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.measure import hostdir

    return hostdir.host_dir_error(*args, **kwargs)


class FilterModule:
    def filters(self):
        return {"bench_dir_error": bench_dir_error}
