"""The API record (``scripts/api_record.json``) against the installed library's signatures."""
from __future__ import annotations

import importlib
import inspect
import json
import re
from typing import Any

from skill_check import RECORD_FILE


def resolve(symbol: str) -> Any:
    """Import ``palm_rlhf_pytorch.grpo.RLHFTrainer``-style dotted names (module, then attribute)."""
    module_name, _, attr = symbol.rpartition(".")
    return getattr(importlib.import_module(module_name), attr)


def underlying(func: Any) -> Any:
    """The function a decorator wraps: follows ``__wrapped__`` (functools.wraps), then a closure
    holding exactly one function when the wrapper's own signature is only ``(self, *args,
    **kwargs)``: ``palm_rlhf_pytorch/utils.py``'s ``eval_decorator`` (on ``PaLM.generate`` and the
    actors' ``generate``) does not use functools.wraps."""
    while True:
        func = inspect.unwrap(func)
        kinds = {p.kind for p in inspect.signature(func).parameters.values() if p.name != "self"}
        cells = [c.cell_contents for c in (getattr(func, "__closure__", None) or ())
                 if inspect.isfunction(c.cell_contents)]
        if kinds <= {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD} and len(cells) == 1:
            func = cells[0]
            continue
        return func


def default_repr(value: Any) -> str:
    """``repr()`` of a default, with functions named ``module.qualname`` (no memory address)."""
    if callable(value) and hasattr(value, "__qualname__") and not isinstance(value, type):
        return f"{getattr(value, '__module__', None) or '?'}.{value.__qualname__}"
    return repr(value)


def describe_signature(func: Any) -> list[dict[str, Any]]:
    """Parameters of ``func`` (``self`` dropped) as ``{name, kind, default}`` dicts.

    ``kind`` is the ``inspect.Parameter`` kind name (``POSITIONAL_OR_KEYWORD``, ``KEYWORD_ONLY``,
    ``VAR_POSITIONAL``, ``VAR_KEYWORD``); ``default`` is ``default_repr()`` of the default, or ``None``
    when the parameter has none. beartype-wrapped ``__init__``s keep their signature through
    ``functools.wraps``, so ``inspect.signature`` sees the library's own parameters.
    """
    params = list(inspect.signature(underlying(func)).parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    return [{"name": p.name, "kind": p.kind.name,
             "default": None if p.default is inspect.Parameter.empty else default_repr(p.default)}
            for p in params]


def installed_api(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The installed signatures of every symbol and method the record names.

    Returns ``{symbol: {method: [param, ...] or None when the method is missing}}``; a symbol the
    library no longer has maps to ``None``. Raises ImportError when palm_rlhf_pytorch is missing.
    """
    out: dict[str, Any] = {}
    for symbol, entry in record["api"].items():
        try:
            obj = resolve(symbol)
        except (ImportError, AttributeError):
            out[symbol] = None
            continue
        methods = {}
        for method in entry["methods"]:
            func = getattr(obj, method, None)
            methods[method] = describe_signature(func) if callable(func) else None
        out[symbol] = methods
    return out


def dump_installed(record: dict[str, Any]) -> dict[str, Any]:
    """The record's ``api`` section regenerated from the installed library, keeping the documented
    ``returns`` text. ``--dump-installed`` prints the whole record with it; that wrote the first
    version of ``scripts/api_record.json`` (palm-rlhf-pytorch 0.8.0)."""
    installed = installed_api(record)
    api = {}
    for symbol, entry in record["api"].items():
        methods = {}
        for method, doc in entry["methods"].items():
            methods[method] = {"params": installed[symbol][method],
                               **{k: v for k, v in doc.items() if k != "params"}}
        api[symbol] = {**{k: v for k, v in entry.items() if k != "methods"}, "methods": methods}
    return api


def record_json(record: dict[str, Any]) -> str:
    """The record as JSON text, one line per parameter so a diff shows one changed default."""
    text = json.dumps(record, indent=2)
    return re.sub(r'\{\s+"name": ("[^"]*"),\s+"kind": ("[^"]*"),\s+"default": (null|"(?:[^"\\]|\\.)*")\s+\}',
                  r'{"name": \1, "kind": \2, "default": \3}', text) + "\n"


def compare_api(record: dict[str, Any], installed: dict[str, Any]) -> list[dict[str, str]]:
    """Drift between the record and the installed signatures, one dict per difference."""
    drift = []

    def add(symbol: str, documented: str, found: str) -> None:
        drift.append({"file": RECORD_FILE, "symbol": symbol, "documented": documented, "installed": found})

    for symbol, entry in record["api"].items():
        if installed[symbol] is None:
            add(symbol, "present", "missing")
            continue
        for method, doc in entry["methods"].items():
            name = f"{symbol}.{method}"
            got = installed[symbol][method]
            if got is None:
                add(name, "present", "missing")
                continue
            want = {p["name"]: p for p in doc["params"]}
            have = {p["name"]: p for p in got}
            for pname in want.keys() - have.keys():
                add(f"{name}({pname})", "parameter present", "missing")
            for pname in have.keys() - want.keys():
                add(f"{name}({pname})", "missing", f"parameter present (default {have[pname]['default']})")
            for pname in want.keys() & have.keys():
                for key in ("kind", "default"):
                    if want[pname][key] != have[pname][key]:
                        add(f"{name}({pname})", f"{key} {want[pname][key]}", f"{key} {have[pname][key]}")
            common = [p for p in want if p in have]
            if [p for p in have if p in want] != common:
                add(name, "order " + ", ".join(common), "order " + ", ".join(p for p in have if p in want))
    return drift
