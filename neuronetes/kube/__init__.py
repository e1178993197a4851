"""The one Kubernetes API client and the one informer every component uses.

`client`: raw JSON requests over the official client's `ApiClient` (its kubeconfig, in-cluster
service account, token refresh and TLS), failures as one typed `KubeError` carrying the HTTP
status. `informer`: list + watch of one resource in a background thread (paged lists,
bookmarks, relist on 410 Gone, capped backoff, a bounded stop, the hooks readiness and staleness
metrics read).
"""

from __future__ import annotations

from .client import KubeClient, KubeError, WatchStream, load_api_client, token_api_client
from .codec import JsonCodec, StructCodec
from .informer import Informer, InformerHooks, InformerSettings, ListWatch

__all__ = [
    "Informer",
    "InformerHooks",
    "InformerSettings",
    "JsonCodec",
    "KubeClient",
    "KubeError",
    "ListWatch",
    "StructCodec",
    "WatchStream",
    "load_api_client",
    "token_api_client",
]
