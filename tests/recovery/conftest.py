"""Object storage for the recovery tests (``tests/support/object_store.py``)."""

from tests.support.object_store import lake, pipeline_s3  # noqa: F401
