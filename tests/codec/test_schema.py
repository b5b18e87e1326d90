import dataclasses
import json

import pytest
from kio.static.primitive import i16, i32

from codec.errors import SchemaDefinitionError
from codec.registry import decode_entity, encode
from codec.schema import MessageDefinition, VersionRange, snake_case


def _definition(fields, valid="0-2", flexible="1+", **extra):
    return MessageDefinition(
        {"name": "Thing", "type": "data", "validVersions": valid, "flexibleVersions": flexible, "fields": fields, **extra}
    )


@pytest.mark.parametrize(
    ("spec", "low", "high"), [("0+", 0, None), ("1-2", 1, 2), ("3", 3, 3)]
)
def test_version_ranges(spec, low, high):
    assert VersionRange.parse(spec) == VersionRange(low, high)


def test_none_and_bad_version_specs():
    assert VersionRange.parse("none") is None
    with pytest.raises(SchemaDefinitionError):
        VersionRange.parse("1-")


@pytest.mark.parametrize(
    ("name", "expected"),
    [("DeliveryCompleteCount", "delivery_complete_count"), ("TopicId", "topic_id"), ("ThrottleTimeMs", "throttle_time_ms")],
)
def test_snake_case(name, expected):
    assert snake_case(name) == expected


def test_fields_exist_only_in_their_versions_and_flexibility_follows_the_spec():
    definition = _definition(
        [
            {"name": "A", "type": "int32", "versions": "0+"},
            {"name": "B", "type": "string", "versions": "1+", "nullableVersions": "2+"},
        ]
    )
    v0, v1, v2 = (definition.entity(version) for version in range(3))
    assert [f.name for f in dataclasses.fields(v0)] == ["a"]
    assert not v0.__flexible__ and v1.__flexible__
    assert v1().b == "" and v2().b == ""  # Kafka's implicit default, even where nullable
    assert v2(a=i32(1), b=None).b is None
    assert encode(v0(a=i32(7))) == b"\x00\x00\x00\x07"
    assert encode(v1(a=i32(7), b="x")) == b"\x00\x00\x00\x07\x02x\x00"
    assert definition.entity(1) is v1


def test_tagged_field_is_written_only_when_not_default():
    definition = _definition(
        [{"name": "Count", "type": "int16", "versions": "1+", "taggedVersions": "1+", "tag": 0, "default": "-1"}]
    )
    entity = definition.entity(1)
    assert encode(entity()) == b"\x00"
    assert encode(entity(count=i16(5))) == b"\x01\x00\x02\x00\x05"
    assert decode_entity(entity, b"\x01\x00\x02\x00\x05") == entity(count=i16(5))


def test_common_structs_and_comments_are_understood():
    text = "// a comment line, as in Kafka's files\n" + json.dumps(
        {
            "name": "Thing", "type": "data", "validVersions": "0", "flexibleVersions": "0+",
            "fields": [{"name": "Items", "type": "[]Item", "versions": "0+"}],
            "commonStructs": [{"name": "Item", "versions": "0+", "fields": [{"name": "X", "type": "int8", "versions": "0+"}]}],
        }
    )
    entity = MessageDefinition.from_text(text).entity(0)
    assert entity.Item(x=1).x == 1


@pytest.mark.parametrize(
    "definition",
    [
        {"name": "X", "type": "data", "validVersions": "0"},
        {"name": "X", "type": "weird", "validVersions": "0", "fields": []},
        {"name": "X", "type": "data", "validVersions": "0+", "fields": []},
    ],
)
def test_malformed_definitions_raise_schema_errors(definition):
    with pytest.raises(SchemaDefinitionError):
        MessageDefinition(definition)


def test_tagged_field_in_non_flexible_version_is_refused():
    definition = _definition([{"name": "T", "type": "int8", "versions": "0+", "taggedVersions": "0+", "tag": 1}])
    with pytest.raises(SchemaDefinitionError):
        definition.entity(0)


def test_null_default_needs_a_nullable_version():
    definition = _definition([{"name": "S", "type": "string", "versions": "0+", "nullableVersions": "2+", "default": "null"}])
    with pytest.raises(SchemaDefinitionError):
        definition.entity(0)


def test_unknown_version_and_unknown_struct_are_schema_errors():
    with pytest.raises(SchemaDefinitionError):
        _definition([]).entity(5)
    with pytest.raises(SchemaDefinitionError):
        _definition([{"name": "S", "type": "Missing", "versions": "0+"}]).entity(0)
