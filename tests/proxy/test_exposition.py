"""The families written from their rows give exactly prometheus-client's own text and samples."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from proxy.exposition import CounterSeries, GaugeSeries, HistogramSeries, exposition

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)  # quotes, backslashes, newlines among them
label_names = st.lists(st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True).filter(lambda n: n != "le"),
                       max_size=4, unique=True)
metric_names = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True)
values = st.one_of(st.integers(-10**20, 10**20), st.floats(), st.just(0), st.just(-1), st.just(999_999),
                   st.just(1_000_000))


class Families:
    def __init__(self, *families) -> None:
        self.families = families

    def collect(self):
        return self.families


@st.composite
def plain_families(draw, kind):
    labels = draw(label_names)
    family = kind(draw(metric_names), draw(text), labels)
    for _ in range(draw(st.integers(0, 4))):
        family.add_metric([draw(text) for _ in labels], draw(values))
    return family


@st.composite
def histograms(draw):
    labels = draw(label_names)
    family = HistogramSeries(draw(metric_names), draw(text), labels)
    for _ in range(draw(st.integers(0, 3))):
        bounds = sorted(draw(st.lists(st.floats(-100, 100), max_size=4, unique=True)))
        counts = draw(st.lists(st.integers(0, 10**7), min_size=len(bounds) + 1, max_size=len(bounds) + 1))
        buckets = [(str(bound), count) for bound, count in zip([*bounds, "+Inf"], counts)]
        family.add_metric([draw(text) for _ in labels], buckets, draw(st.one_of(st.none(), values)))
    return family


@settings(max_examples=300, deadline=None)
@given(st.one_of(plain_families(GaugeSeries), plain_families(CounterSeries), histograms()))
def test_a_family_written_from_its_rows_is_byte_for_byte_what_prometheus_client_writes(family):
    assert family.text().encode() == generate_latest(Families(family))
    assert exposition(Families(family)) == generate_latest(Families(family))


@pytest.mark.parametrize(("series", "model", "row"), [
    (GaugeSeries, GaugeMetricFamily, (["g", "t", "0"], 5)),
    (CounterSeries, CounterMetricFamily, (["g", "t", "0"], 7)),
    (HistogramSeries, HistogramMetricFamily, (["g", "t", "0"], [("1.0", 2), ("+Inf", 3)], 4.5)),
])
def test_its_samples_are_those_of_prometheus_clients_family(series, model, row):
    family, expected = series("ksp_x", "help", ["group", "topic", "partition"]), model(
        "ksp_x", "help", labels=["group", "topic", "partition"])
    family.add_metric(*row)
    expected.add_metric(*row)
    assert family == expected
    assert (family.name, family.type, family.samples) == (expected.name, expected.type, expected.samples)


def test_a_registry_mixing_both_kinds_of_family_is_written_in_its_own_order():
    registry = CollectorRegistry()
    Counter("ksp_plain", "a library metric", ["group"], registry=registry).labels("g").inc(3)

    class Mixed:
        def collect(self):
            gauge = GaugeSeries("ksp_rows_gauge", "rows", ["group", "partition"])
            gauge.add_metric(["g", "1"], 2)
            yield gauge
            plain = GaugeMetricFamily("ksp_between", "a prometheus-client family", labels=["a"])
            plain.add_metric(["x"], 1.5)
            yield plain
            counter = CounterSeries("ksp_rows", "rows", ["group"])
            counter.add_metric(["g"], 4)
            yield counter

    registry.register(Mixed())
    body = exposition(registry)
    assert body == generate_latest(registry)
    assert body.index(b"ksp_rows_gauge{") < body.index(b"ksp_between{") < body.index(b"ksp_rows_total{")


@pytest.mark.parametrize(("name", "labels"), [("ksp.dotted", ["group"]), ("ksp_x", ["bad-label"])])
def test_names_that_need_escaping_are_refused(name, labels):
    with pytest.raises(ValueError, match="plain metric and label names"):
        GaugeSeries(name, "help", labels)
