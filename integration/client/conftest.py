"""Fixtures for the Python client's integration tests: the share-group fixtures, reused."""

from integration.share.conftest import create_topic, module_share_proxy, names, share_proxy  # noqa: F401
