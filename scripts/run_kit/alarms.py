"""The watchdog's engine, for any kind of run: a ``Rule`` (an id, the doc section that explains it,
the failure and its fix, the check of a metrics row), which rules fire on the row of the round
just finished (``evaluate``), the one stderr line of one that fires (``alarm_line``) and
``--stop-on``'s rule ids (``parse_stop_on``). Each kind of run brings its own rules and what they
know of the run (``facts``: the policy run's are ``policy_optimization/run/watchdog.py``).
Torch-free.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Rule:
    """One silent failure a metrics row can show: ``check(row, rows before it, facts)`` returns the
    measured value when it holds, else None."""
    id: str
    section: str          # the doc section (path#anchor from the skill root) that explains it
    what: str             # the failure, in a few words
    fix: str
    check: Callable[[dict[str, Any], list[dict[str, Any]], Any], str | None]  # the measured value when it fires
    persist: int = 1      # consecutive rounds the condition must hold: 2 where one round of it is chance


def evaluate(rules: tuple[Rule, ...], row: dict[str, Any], rows: list[dict[str, Any]],
             facts: Any) -> list[tuple[Rule, str]]:
    """The ``rules`` that fire on ``row`` given the ``rows`` before it: (rule, measured value)
    pairs in ``rules`` order. A rule with ``persist`` n fires when its condition also held on the
    n - 1 rounds before this one."""
    fired = []
    for rule in rules:
        value = rule.check(row, rows, facts)
        if value is not None and held_before(rule, rows, facts):
            fired.append((rule, value))
    return fired


def held_before(rule: Rule, rows: list[dict[str, Any]], facts: Any) -> bool:
    """Whether ``rule``'s condition held on each of the ``persist - 1`` trained rounds before."""
    need = rule.persist - 1
    if need == 0:
        return True
    if len(rows) < need or any(r["round"] == 0 for r in rows[-need:]):
        return False
    return all(rule.check(rows[i], rows[:i], facts) is not None for i in range(len(rows) - need, len(rows)))


def alarm_line(rule: Rule, value: str, round_: int) -> str:
    """The one stderr line of a rule that fires: what, the measured value, the doc section, the fix."""
    return f"watchdog {rule.id} (round {round_}): {rule.what}: {value}; read {rule.section}; fix: {rule.fix}"


def parse_stop_on(text: str, rule_ids: tuple[str, ...]) -> frozenset[str]:
    """``--stop-on ID,ID`` or ``all``: the ids among ``rule_ids`` that end the run. Raises
    ValueError naming an unknown id (the caller turns it into a usage error)."""
    if text.strip() == "all":
        return frozenset(rule_ids)
    ids = {part.strip() for part in text.split(",") if part.strip()}
    unknown = sorted(ids - set(rule_ids))
    if unknown or not ids:
        raise ValueError(f"unknown rule {', '.join(unknown) or '(none given)'}; the rules are {', '.join(rule_ids)} or all")
    return frozenset(ids)
