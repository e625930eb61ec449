"""Cache policies: which requests may be cached, for whom, how long, and what privacy demands.

Pure parts (no I/O): ``model`` (the policy as values), ``normalize``, ``pii`` (the detector API)
over ``detectors`` and ``tokens`` (the detectors themselves), ``evaluate`` (policy x request ->
``Decision``). Files: ``loader`` with ``schema`` and ``yamlpos`` (YAML + JSON Schema, errors with
file, line and field). Live state: ``store`` (reload, polling, shadow comparison, metrics).
``cli``: the ``policy check`` and ``policy explain`` commands.
"""

from gateway.policy.evaluate import Decision, ItemDecision, evaluate, evaluate_groups
from gateway.policy.loader import PolicyError, PolicyIssue, default_policy, load_policy
from gateway.policy.model import (
    NO_MATCH,
    Match,
    Normalization,
    Policy,
    Privacy,
    Rule,
)
from gateway.policy.normalize import normalize_text
from gateway.policy.pii import DETECTORS, Finding, redact, scan

__all__ = [
    "DETECTORS",
    "NO_MATCH",
    "Decision",
    "Finding",
    "ItemDecision",
    "Match",
    "Normalization",
    "Policy",
    "PolicyError",
    "PolicyIssue",
    "Privacy",
    "Rule",
    "default_policy",
    "evaluate",
    "evaluate_groups",
    "load_policy",
    "normalize_text",
    "redact",
    "scan",
]
