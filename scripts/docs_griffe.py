"""A griffe extension for the API reference (mkdocs.yml loads it through mkdocstrings).

* A package that imports a function under the name of one of its plain modules (``from .optimize import
  optimize``) exposes the function at run time; griffe would document the module. The reference shows the
  function, as Python does. A subpackage of the same name keeps its own page.
* Sphinx roles in docstrings (``:class:`RuleSet```) become Markdown code spans.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`~?\.?([^`]+)`")


class PublicNames(griffe.Extension):
    """Show imported names over the plain modules they shadow, and Sphinx roles as code."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for module in _modules(pkg):
            for name in module.exports or ():
                member = module.members.get(name)
                target = module.imports.get(name)
                if member is not None and target and not member.is_alias and member.is_module \
                        and not member.is_package:
                    module.set_member(name, griffe.Alias(name, target, parent=module))

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(r"`\1`", obj.docstring.value)


def _modules(module: griffe.Module):
    yield module
    for sub in module.modules.values():
        if not sub.is_alias:
            yield from _modules(sub)
