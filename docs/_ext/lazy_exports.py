"""Griffe extension for the manual: names a package exports lazily (PEP 562).

`fbt_probe/__init__.py` imports `load_model` inside `__getattr__`, so that the package root stays
import-light; a static reader of the source does not see the name. For every module whose
`__getattr__` holds `from MODULE import NAME` with NAME in `__all__`, this adds NAME to the module
as an alias of `MODULE.NAME`, so that `::: fbt_probe.load_model` renders `fbt_probe.loading.load_model`.
"""
from __future__ import annotations

import ast

import griffe


class LazyExports(griffe.Extension):
    def on_module_members(self, *, mod: griffe.Module, **kwargs) -> None:
        if mod.filepath is None or isinstance(mod.filepath, list):
            return
        tree = ast.parse(mod.filepath.read_text(encoding="utf-8"))
        exported = set(mod.exports or ())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
                for imp in ast.walk(node):
                    if isinstance(imp, ast.ImportFrom) and imp.module:
                        for a in imp.names:
                            name = a.asname or a.name
                            if name in exported and name not in mod.members:
                                mod.set_member(name, griffe.Alias(name, f"{imp.module}.{a.name}", lineno=imp.lineno,
                                                                  parent=mod))
