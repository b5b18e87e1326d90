"""client.errors: broker codes keep Kafka's names and retriability; local codes librdkafka's."""

from client import KafkaError, KafkaException
from client.errors import broker_error


def test_broker_codes_carry_kafka_names_and_retriability():
    error = KafkaError(121, "not yours")
    assert (error.name(), error.retriable(), str(error)) == ("INVALID_RECORD_STATE", False, "INVALID_RECORD_STATE: not yours")
    assert KafkaError(122).retriable() and KafkaError(122).name() == "SHARE_SESSION_NOT_FOUND"


def test_local_codes():
    assert KafkaError(KafkaError.STATE).name() == "_STATE"
    assert KafkaError(KafkaError.TRANSPORT).retriable()
    assert KafkaError(99999).name() == "ERROR_99999"


def test_exception_wraps_the_error_like_confluent_kafka():
    exc = KafkaException(KafkaError(KafkaError.INVALID_ARG, "bad"))
    assert exc.args[0].code() == KafkaError.INVALID_ARG and exc.error == KafkaError.INVALID_ARG
    assert broker_error(0) is None and broker_error(25).name() == "UNKNOWN_MEMBER_ID"
