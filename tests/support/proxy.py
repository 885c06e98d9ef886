"""The TCP proxy the object storage tests put between pyiceberg and a server to break the network.

It is the fault harness's (``fault_harness.proxy``): the harness drops a REST commit's response with
it under a real Airflow deployment, and must not import from ``tests/``, so the code lives there.
"""

from __future__ import annotations

from fault_harness.proxy import Proxy, RequestMatcher, SeenRequest

__all__ = ["Proxy", "RequestMatcher", "SeenRequest"]
