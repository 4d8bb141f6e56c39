#!/usr/bin/python
"""Documentation of the action socketwise.kit.controller_file: the action plugin of the
same name does the work on the controller; no module runs on a host."""

DOCUMENTATION = r"""
---
module: controller_file
short_description: Write a file on the controller without starting a module
description:
  - An action that runs in the controller's own process (plugins/action/controller_file.py)
    and writes I(content) to I(dest) there, making its parent directories. The file is
    rewritten only when its content differs, atomically, and the result says whether it
    was.
options:
  dest:
    description: The file's path on the controller.
    type: path
    required: true
  content:
    description: Its text.
    type: str
    required: true
  mode:
    description: Its mode, in octal.
    type: str
    default: "0644"
"""

EXAMPLES = r"""
- name: Save the plan on the controller
  socketwise.kit.controller_file:
    content: "{{ socketwise_plan | to_nice_json }}\n"
    dest: "{{ socketwise_artifacts_dir }}/{{ inventory_hostname }}/plan.json"
    mode: "0644"
"""

RETURN = r"""
dest:
  description: The file's path, with C(~) expanded.
  type: str
  returned: always
"""
