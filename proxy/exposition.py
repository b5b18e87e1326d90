"""Prometheus text exposition that writes large label-heavy families straight from their rows.

prometheus-client's ``generate_latest`` spends ~9 us per sample: every sample is a ``Sample``
with a label dict, and every line validates, escapes and sorts its label names again. With
``--metrics-per-partition`` a share-partition has ~52 samples, so a scrape of 1,000 of them took
~0.5 s of CPU (docs/benchmarks.md, stop 51). The families here (:class:`GaugeSeries`,
:class:`CounterSeries`, :class:`HistogramSeries`) take the same ``add_metric`` calls as
prometheus-client's ``*MetricFamily`` classes but keep only the rows; :func:`exposition` writes
their lines with the label names checked and ordered once per family. Their text is byte for byte
what ``generate_latest`` writes for the same family (tests/proxy/test_exposition.py checks it
against the installed prometheus-client), and their ``samples`` are prometheus-client's own, made
when asked for, so a registry's other readers see the same family.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

# Names the text format takes as they are (others need quoting or escaping, left to prometheus-client).
_PLAIN_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_PLAIN_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Integers in this range print as repr(float(n)) in Go's style ("12.0"); larger ones take an exponent.
_PLAIN_INT = 1_000_000


def _value(value: float) -> str:
    if type(value) is int and -_PLAIN_INT < value < _PLAIN_INT:
        return f"{value}.0"
    return floatToGoString(value)


def _escaped(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _help_lines(name: str, documentation: str, kind: str) -> str:
    documentation = documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {documentation}\n# TYPE {name} {kind}\n"


class _Series(Metric):
    """A family kept as rows of label values; its samples are made by prometheus-client on demand."""

    _family_class: type = Metric

    def __init__(self, name: str, documentation: str, labels: Sequence[str] = ()) -> None:
        # Metric.__init__ is not called: it would set ``samples``, which here is made on demand. A
        # prometheus-client family of the kind checks the name and settles name, type and unit.
        model = self._family_class(name, documentation, labels=list(labels))
        self.name, self.documentation, self.unit, self.type = model.name, documentation, model.unit, model.type
        self._labels = list(labels)
        names = [*self._labels, *self._extra_labels()]
        if not _PLAIN_METRIC_NAME.fullmatch(name) or not all(_PLAIN_LABEL_NAME.fullmatch(label) for label in names):
            raise ValueError(f"{name}: only plain metric and label names are written by hand: {names}")
        # Lines list labels sorted by name; each row's values are put in that order once.
        self._order = sorted(range(len(names)), key=names.__getitem__)
        self._names = names
        self._rows: list[tuple] = []

    def _extra_labels(self) -> tuple[str, ...]:
        return ()

    @property
    def samples(self) -> list:
        model = self._family_class(self.name, self.documentation, labels=self._labels)
        for row in self._rows:
            model.add_metric(*row)
        return model.samples

    def _label_text(self, values: Sequence[str]) -> str:
        names = self._names
        return ",".join(f'{names[i]}="{_escaped(values[i])}"' for i in self._order)

    def text(self) -> str:
        raise NotImplementedError


class _ValueSeries(_Series):
    """A family with one value per row, its samples named ``name + _suffix``."""

    _suffix = ""

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        self._rows.append((labels, value))

    def text(self) -> str:
        name = self.name + self._suffix
        lines = [_help_lines(name, self.documentation, self.type)]
        for labels, value in self._rows:
            lines.append(f"{name}{{{self._label_text(labels)}}} {_value(value)}\n" if labels
                         else f"{name} {_value(value)}\n")
        return "".join(lines)


class GaugeSeries(_ValueSeries):
    """A gauge family, as :class:`prometheus_client.core.GaugeMetricFamily` with labels."""

    _family_class = GaugeMetricFamily


class CounterSeries(_ValueSeries):
    """A counter family, as :class:`prometheus_client.core.CounterMetricFamily` with labels."""

    _family_class = CounterMetricFamily
    _suffix = "_total"


class HistogramSeries(_Series):
    """A histogram family, as :class:`prometheus_client.core.HistogramMetricFamily` with labels
    (buckets as ``(le, count)`` pairs ending with ``+Inf``)."""

    _family_class = HistogramMetricFamily

    def _extra_labels(self) -> tuple[str, ...]:
        return ("le",)

    def add_metric(self, labels: Sequence[str], buckets: Sequence[tuple[str, float]],
                   sum_value: float | None) -> None:
        self._rows.append((labels, buckets, sum_value))

    def text(self) -> str:
        name = self.name
        lines = [_help_lines(name, self.documentation, self.type)]
        names, at = self._names, self._order.index(len(self._labels))  # where "le" goes among the labels
        before, after = self._order[:at], self._order[at + 1:]
        for labels, buckets, sum_value in self._rows:
            first = [f'{names[i]}="{_escaped(labels[i])}"' for i in before]
            last = [f'{names[i]}="{_escaped(labels[i])}"' for i in after]
            head, tail = "".join(f"{pair}," for pair in first), "".join(f",{pair}" for pair in last)
            for bound, count in buckets:
                lines.append(f'{name}_bucket{{{head}le="{_escaped(bound)}"{tail}}} {_value(count)}\n')
            if float(buckets[0][0]) >= 0 and sum_value is not None:
                plain = ",".join(first + last)
                plain = f"{{{plain}}}" if plain else ""
                lines.append(f"{name}_count{plain} {_value(buckets[-1][1])}\n")
                lines.append(f"{name}_sum{plain} {_value(sum_value)}\n")
        return "".join(lines)


class _Families:
    """A registry stand-in that yields some families (for ``generate_latest``)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def exposition(registry) -> bytes:
    """``generate_latest(registry)``: the Prometheus text format (0.0.4) of every family the
    registry collects, the families above written from their rows, the rest by prometheus-client."""
    out: list[bytes] = []
    others: list[Metric] = []
    for family in registry.collect():
        if isinstance(family, _Series):
            if others:
                out.append(generate_latest(_Families(others)))
                others = []
            out.append(family.text().encode())
        else:
            others.append(family)
    if others:
        out.append(generate_latest(_Families(others)))
    return b"".join(out)


__all__ = ["CounterSeries", "GaugeSeries", "HistogramSeries", "exposition"]
