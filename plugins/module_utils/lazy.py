"""Filters of the Python core imported when first called, never when Ansible loads a filter
file: Ansible loads every filter file of the collection in each task's process
(docs/development/architecture.md)."""

import importlib

CORE = "ansible_collections.socketwise.kit.plugins.module_utils.socketwise"


def core_filter(module, name):
    """The core's MODULE.NAME as a filter, imported when the filter is first called."""

    def call(*args, **kwargs):
        return getattr(importlib.import_module(f"{CORE}.{module}"), name)(*args, **kwargs)

    return call
