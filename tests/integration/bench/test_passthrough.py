"""passthrough's parsing of the proxies it is asked to measure beside its own."""

from __future__ import annotations

import argparse

import pytest

from integration.bench.passthrough import _named_variant, parse_variant


def test_parse_variant_splits_the_serve_arguments_like_a_shell():
    assert parse_variant("glibc-arenas=--malloc-arenas 0") == ("glibc-arenas", ("--malloc-arenas", "0"))
    assert parse_variant("quoted=--config '/tmp/a b.toml'") == ("quoted", ("--config", "/tmp/a b.toml"))
    for text in ("glibc-arenas", "=--malloc-arenas 0", "empty=  "):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_variant(text)


def test_a_variant_may_not_take_the_name_of_one_of_passthroughs_own_paths():
    assert _named_variant("gather=--stream-responses-from 0") == ("gather", ("--stream-responses-from", "0"))
    for name in ("direct", "proxy", "gather-tls"):
        with pytest.raises(argparse.ArgumentTypeError):
            _named_variant(f"{name}=--stream-responses-from 0")
