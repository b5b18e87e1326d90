"""client.config: confluent-style keys checked once; unknown keys refused."""

from __future__ import annotations

import pytest

from client import KafkaError, KafkaException
from client.config import new_member_id, parse_config

BASE = {"bootstrap.servers": "127.0.0.1:9092", "group.id": "g"}


def refused(config) -> str:
    with pytest.raises(KafkaException) as caught:
        parse_config(config)
    assert caught.value.args[0].code() == KafkaError.INVALID_ARG
    return str(caught.value)


def test_defaults():
    config = parse_config(BASE)
    assert config.bootstrap_servers == (("127.0.0.1", 9092),)
    assert (config.acknowledgement_mode, config.explicit) == ("implicit", False)
    assert config.max_poll_records == 500
    assert config.max_in_flight_progress_batches == 100
    assert (config.mark_in_progress_api_key, config.describe_in_flight_api_key) == (81, 82)


def test_explicit_mode_and_overrides():
    config = parse_config({**BASE, "bootstrap.servers": "a:1, b:2", "share.acknowledgement.mode": "explicit",
                           "max.poll.records": "10", "max.in-flight.progress.batches": 0, "client.id": "me",
                           "ksp.mark.in.progress.api.key": 1081, "check.crcs": "false"})
    assert config.bootstrap_servers == (("a", 1), ("b", 2))
    assert config.explicit and config.max_poll_records == 10 and config.max_in_flight_progress_batches == 0
    assert config.client_id == "me" and config.mark_in_progress_api_key == 1081 and config.check_crcs is False


def test_unknown_keys_are_refused_by_name():
    message = refused({**BASE, "max.poll.record": 5, "enable.auto.commit": True})
    assert "'enable.auto.commit'" in message and "'max.poll.record'" in message


@pytest.mark.parametrize("config, words", [
    ({"group.id": "g"}, "bootstrap.servers is required"),
    ({"bootstrap.servers": "h:1"}, "group.id is required"),
    ({**BASE, "bootstrap.servers": "nohost"}, "not host:port"),
    ({**BASE, "bootstrap.servers": "h:70000"}, "not host:port"),
    ({**BASE, "group.id": ""}, "group.id must be a non-empty string"),
    ({**BASE, "share.acknowledgement.mode": "auto"}, "'implicit' or 'explicit'"),
    ({**BASE, "max.poll.records": 0}, "max.poll.records must be between 1"),
    ({**BASE, "max.poll.records": 2.5}, "must be an integer"),
    ({**BASE, "max.poll.records": True}, "must be an integer"),
    ({**BASE, "max.in-flight.progress.batches": -1}, "between 0"),
    ({**BASE, "ksp.mark.in.progress.api.key": 82}, "must differ"),
    ({**BASE, "check.crcs": "yes"}, "true or false"),
])
def test_bad_values_are_refused_with_a_clear_message(config, words):
    assert words in refused(config)


def test_not_a_dict():
    assert "must be a dict" in refused([("group.id", "g")])


def test_member_ids_are_unique_22_char_strings():
    ids = {new_member_id() for _ in range(100)}
    assert len(ids) == 100 and {len(i) for i in ids} == {22}
