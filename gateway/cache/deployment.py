"""The deployment identity that scopes the node tier, the one cache tier two gateways on a host
could share by accident.

The node tier's directory is shared by every process that opens it: the workers of one gateway,
as intended, but also any other gateway on the host pointed at the same directory. A cache key
names the tenant (the scope) and the model by name and version; it cannot tell that another
gateway maps other API keys to the same tenant name, or serves other weights under the same
model name and version. So node entries carry the deployment that wrote them:

- ``namespace``: ``cache.node.deployment`` when set (an operator's name for the deployment:
  gateways sharing it share entries, whatever else differs), else derived from the tenants file
  as loaded at start-up: its (API-key digest, tenant) pairs, so gateways whose keys reach other
  tenants under the same names never share. Folded into every node key's scope tag.
- the model's identity: the SHA-256 of the graph its backends serve, as their metadata reports
  it (``parameters.model_sha256``; ``Router.model_identity``), folded into each key's digest,
  so other weights under one name and version never answer. A backend that reports none (Triton
  or KServe without it) leaves name and version, already in every key, as the identity.

The default directory is per deployment too (``NodeCacheSettings.directory``): unset,
``cache.node.path`` is ``$XDG_CACHE_HOME/edge-gateway/node/<tag>`` (the tag: 16 hex characters
of the namespace's hash, never the tenants file's contents), so two deployments by one user do
not even share a map. A derived namespace changes when the tenants file's keys change and the
gateway restarts: its node entries start cold then; set ``cache.node.deployment`` to keep them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import xxhash

from gateway.cache.settings import NodeCacheSettings


@dataclass(frozen=True, slots=True)
class Deployment:
    """What scopes this gateway's node entries (see the module docstring)."""

    namespace: str
    """Folded into every node key's scope tag (``nodestore.node_tag``)."""
    source: str
    """``settings`` (``cache.node.deployment``) or ``tenants`` (derived from the file)."""

    @property
    def tag(self) -> str:
        """16 hex characters naming the deployment (the default directory's last part)."""
        return xxhash.xxh3_64_hexdigest(self.namespace.encode())


def deployment_of(settings: NodeCacheSettings, *, keys: Iterable[tuple[str, str]],
                  configured: bool) -> Deployment:
    """This gateway's deployment: the configured name, else one derived from the tenants file's
    ``keys`` ((API-key digest, tenant) pairs) and whether a file is ``configured`` at all (the
    cache knows nothing of the tenants package: the app hands it these values)."""
    if settings.deployment:
        return Deployment(f"name\0{settings.deployment}", "settings")
    pairs = "\n".join(f"{digest} {tenant}" for digest, tenant in sorted(keys))
    material = f"tenants\0{int(configured)}\0{pairs}"
    # The namespace is a hash, not the pairs: it is logged and hashed again per key.
    return Deployment(xxhash.xxh3_128_hexdigest(material.encode()), "tenants")
