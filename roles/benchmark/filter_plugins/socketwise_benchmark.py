"""Ansible door into socketwise.measure.hostdir: the filter `socketwise_bench_dir_error`."""

import sys
from pathlib import Path

try:
    from socketwise.measure import hostdir
except ImportError:
    # Run from a checkout whose package is not installed in Ansible's Python:
    # the package sits three levels above this role's filter_plugins/.
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from socketwise.measure import hostdir


class FilterModule:
    def filters(self):
        return {"socketwise_bench_dir_error": hostdir.host_dir_error}
