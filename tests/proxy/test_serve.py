"""proxy.serve: the process-wide settings `serve` applies from its configuration before threads start."""

from __future__ import annotations

from tests.proxy.test_allocator import arenas_in_use, glibc_only

SERVE_SETTINGS = """
import argparse

from proxy.config import configure_parser, load_config
from proxy.serve import tune_allocator

parser = argparse.ArgumentParser()
configure_parser(parser)
tune_allocator(load_config(parser.parse_args({argv!r})))
applied = "tuned"
"""


@glibc_only
def test_serve_caps_malloc_arenas_by_default_and_leaves_glibcs_default_at_zero():
    assert arenas_in_use(SERVE_SETTINGS.format(argv=["--upstream", "k:1"])) == ("tuned", 2)
    assert arenas_in_use(SERVE_SETTINGS.format(argv=["--upstream", "k:1", "--malloc-arenas", "0"])) == ("tuned", 7)
    assert arenas_in_use(SERVE_SETTINGS.format(argv=["--upstream", "k:1", "--malloc-arenas", "3"])) == ("tuned", 3)
