"""The share-group fixtures (proxies, names) for the Spark job tests."""

from integration.share.conftest import module_share_proxy  # noqa: F401 - fixture
