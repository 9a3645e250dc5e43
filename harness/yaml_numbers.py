"""The YAML loader of suites and ``--option`` values: PyYAML's safe loader, with numbers as people write them.

PyYAML follows YAML 1.1, where a float needs a dot: ``1e-3`` and ``5e-1`` are text, and a suite's
``time_limit: 1e-3`` reached the planner as the string ``'1e-3'``. YAML 1.2 (and JSON) read them as
numbers; so does this loader. A quoted ``'1e-3'`` stays text. Likewise an integer with leading zeros
is decimal, as in YAML 1.2: YAML 1.1 reads ``slots: 0200`` as octal 128 (and ``08`` as text); ``0x80``
is still hexadecimal.
"""

from __future__ import annotations

import re
from typing import Any

import yaml


class NumberLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also reads ``1e-3``, ``2E5`` and ``.5e1`` as floats (YAML 1.2's float)."""


_FLOAT_1_2 = re.compile(r"""^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$""")
# An implicit resolver is consulted by a plain scalar's first character: these start a number.
NumberLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_1_2, list("-+0123456789."))


_LEADING_ZEROS = re.compile(r"^[-+]?0[0-9_]+$")
NumberLoader.add_implicit_resolver("tag:yaml.org,2002:int", _LEADING_ZEROS, list("-+0"))  # 08, which 1.1 leaves text


def _int_1_2(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    if _LEADING_ZEROS.match(text):
        return int(text.replace("_", ""), 10)
    return loader.construct_yaml_int(node)


NumberLoader.add_constructor("tag:yaml.org,2002:int", _int_1_2)


def load(text: str) -> Any:
    """One YAML document from ``text``, read by ``NumberLoader``."""
    return yaml.load(text, Loader=NumberLoader)  # noqa: S506 -- NumberLoader is a SafeLoader
