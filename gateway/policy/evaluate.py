"""Policy x request -> Decision: the rule that applies, and each text as it may be sent and cached.

Pure: values in, values out. For every text: normalize it, run the rule's PII detectors on the
normalized text, then apply their actions. ``reject`` raises a 422 naming the detector (never the
text); ``redact`` masks the span, so the backend and the cache key see ``[EMAIL]``; ``no_store``
marks only that item as not to be cached (its neighbours in a list still are).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.errors import PolicyRejected, ValidationFailed
from gateway.policy.detectors import Shape
from gateway.policy.model import DETECTOR_NAMES, SHARED_SCOPE, Headers, Policy, Rule
from gateway.policy.normalize import canonical, limit
from gateway.policy.pii import Finding, redact, scan, scan_shape

# Detection looks a little past a truncation point, so a value cut in half still counts.
_SCAN_MARGIN = 256


# Decisions are created per request and per text on the hit path, and a frozen dataclass costs
# almost twice as much to build; they are treated as read-only values all the same.
@dataclass(slots=True, kw_only=True)
class ItemDecision:
    """One text: ``text`` is what goes to the backend and into the key (normalized, redacted)."""

    text: str
    store: bool
    """False: answer it, but never write it to a cache (and do not look it up)."""
    detectors: tuple[str, ...] = ()
    """Detectors that fired on this text, in ``DETECTORS`` order (names only)."""


@dataclass(slots=True, kw_only=True)
class Decision:
    """What the policy decided for one request."""

    rule: Rule
    policy_version: str
    items: tuple[ItemDecision, ...]
    cache: bool
    """The rule allows caching at all (individual items may still be ``store=False``)."""
    scope: str
    """The cache scope: the tenant id, or ``"shared"``."""

    @property
    def trail(self) -> str:
        """``rule@version``, the value of the ``X-Cache-Policy`` response header."""
        return f"{self.rule.name}@{self.policy_version}"

    @property
    def not_stored(self) -> tuple[int, ...]:
        """Indexes of the items that must not be cached."""
        return tuple(i for i, item in enumerate(self.items) if not item.store)

    def explain(self) -> dict[str, Any]:
        """The decision as JSON-able data, for ``policy explain``; never contains request text."""
        rule = self.rule
        fired = {name for item in self.items for name in item.detectors}
        detectors = [name for name in DETECTOR_NAMES if name in fired]
        return {
            "rule": rule.name,
            "rule_origin": rule.origin,
            "policy_version": self.policy_version,
            "trail": self.trail,
            "cacheable": self.cache and any(item.store for item in self.items),
            "cache": self.cache,
            "scope": rule.scope,
            "scope_key": self.scope,
            "ttl_s": rule.ttl_s,
            "stale_while_revalidate_s": rule.stale_while_revalidate_s,
            "stale_if_error_s": rule.stale_if_error_s,
            "normalization": rule.normalization.fingerprint,
            "detectors": detectors,
            "actions": {name: rule.privacy.detectors[name] for name in detectors},
            "items": len(self.items),
            "not_stored": list(self.not_stored),
        }


def _field(field: str, index: int | None) -> str:
    return field if index is None else f"{field}[{index}]"


def _item(text: str, rule: Rule, field: str, index: int | None) -> ItemDecision:
    norm = rule.normalization
    privacy = rule.privacy
    names = privacy.names
    shape: Shape | None = None
    if names and norm.whitespace == "collapse" and text.isascii():
        # The hot path. The detectors' shape of the text also shows whether it is canonical
        # already, so clean text is neither copied nor mapped twice.
        if norm.casefold:
            text = text.lower()
        shape = Shape(text)
        if "\t" in shape.cls or "  " in text or text[:1] == " " or text[-1:] == " ":
            full, shape = canonical(text, norm), None
        else:
            full = text
    else:
        full = canonical(text, norm)
    cut = len(full) > norm.max_chars
    text = limit(full, norm, field=_field(field, index)) if cut else full
    if not names:
        return ItemDecision(text=text, store=rule.cache)
    if cut:  # scan a little past the cut; values wholly past it are not sent anywhere
        findings = [f for f in scan(full[: len(text) + _SCAN_MARGIN], names)
                    if f.start < len(text)]
    else:
        findings = scan_shape(shape, names) if shape is not None else scan(text, names)
    if not findings:
        return ItemDecision(text=text, store=rule.cache)
    actions = privacy.detectors
    fired = {f.detector for f in findings}
    hit = tuple(name for name in DETECTOR_NAMES if name in fired)
    for name in hit:
        if actions[name] == "reject":
            raise PolicyRejected(_field(field, index), name, rule.name)
    masked = [f for f in findings if actions[f.detector] == "redact"]
    if masked:
        if cut:
            masked = [Finding(f.detector, f.start, min(f.end, len(text))) for f in masked]
        text = redact(text, masked)
    store = rule.cache and not any(actions[name] == "no_store" for name in hit)
    return ItemDecision(text=text, store=store, detectors=hit)


def decide(
    rule: Rule, policy_version: str, *, tenant: str, texts: Sequence[str], field: str = "input"
) -> Decision:
    """Apply one already-matched rule to the texts of a request (``evaluate`` without matching)."""
    limit_items = rule.normalization.max_items
    if len(texts) > limit_items:
        raise ValidationFailed(field, f"at most {limit_items} items allowed, got {len(texts)}")
    if len(texts) == 1:
        items: tuple[ItemDecision, ...] = (_item(texts[0], rule, field, None),)
    else:
        items = tuple([_item(text, rule, field, i) for i, text in enumerate(texts)])
    return Decision(rule=rule, policy_version=policy_version, items=items, cache=rule.cache,
                    scope=SHARED_SCOPE if rule.scope == "shared" else tenant)


def evaluate(
    policy: Policy,
    *,
    route: str,
    model: str,
    tenant: str,
    headers: Headers,
    texts: Sequence[str],
    field: str = "input",
) -> Decision:
    """Match the request to a rule, then normalize and privacy-check every text under it.

    Raises ``ValidationFailed`` (too many items, or too long with ``on_overflow: reject``) and
    ``PolicyRejected`` (a detector with action ``reject`` fired).
    """
    rule = policy.match(route=route, model=model, tenant=tenant, headers=headers)
    return decide(rule, policy.version, tenant=tenant, texts=texts, field=field)


def evaluate_groups(
    policy: Policy,
    *,
    route: str,
    model: str,
    tenant: str,
    headers: Headers,
    groups: Sequence[tuple[str, Sequence[str]]],
) -> Decision:
    """One decision over several fields of one request (``query`` and ``documents``...).

    Items are concatenated in group order; ``max_items`` applies to each field on its own.
    """
    rule = policy.match(route=route, model=model, tenant=tenant, headers=headers)
    if len(groups) == 1:  # one field (``input``): its decision is the request's, as built
        field, texts = groups[0]
        return decide(rule, policy.version, tenant=tenant, texts=texts, field=field)
    parts = [decide(rule, policy.version, tenant=tenant, texts=texts, field=field)
             for field, texts in groups]
    items = tuple(item for part in parts for item in part.items)
    return Decision(rule=rule, policy_version=policy.version, items=items, cache=rule.cache,
                    scope=SHARED_SCOPE if rule.scope == "shared" else tenant)
