"""Kafka JSON message definitions turned into kio entity classes at import time.

Theory of operation: Apache Kafka describes every wire message and every
coordinator record as JSON (``clients/src/main/resources/common/message/*.json``):
a name, ``validVersions``, ``flexibleVersions`` and a tree of fields, each with the
versions it exists in, the versions it is nullable or tagged in, and a default.
kio ships classes generated from those files ahead of time. For the messages kio
does not know -- our extension RPCs, the share coordinator's state records, the
proxy's own metadata records -- we keep definitions of the same shape under
``codec/schemas/`` and build equivalent frozen dataclasses here, one per
(definition, version), carrying exactly the field metadata kio's
``entity_reader`` / ``entity_writer`` read (``kafka_type``, ``tag``,
``__flexible__`` ...). Serialization is then kio's, not a second codec.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.resources
import json
import re
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar

from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType
from kio.static.primitive import Records, f64, i8, i16, i32, i32Timedelta, i64, u16, u32

from .errors import SchemaDefinitionError

# Through importlib.resources, not __file__: the Spark jobs ship codec/ to executors inside a zip.
SCHEMA_DIR = importlib.resources.files(__package__) / "schemas"

# Kafka JSON primitive type -> (Python annotation, kio kafka_type, implicit default)
_PRIMITIVES: Mapping[str, tuple[type, str, object]] = {
    "int8": (i8, "int8", i8(0)),
    "int16": (i16, "int16", i16(0)),
    "int32": (i32, "int32", i32(0)),
    "int64": (i64, "int64", i64(0)),
    "uint16": (u16, "uint16", u16(0)),
    "uint32": (u32, "uint32", u32(0)),
    "float64": (f64, "float64", f64(0.0)),
    "string": (str, "string", ""),
    "bytes": (bytes, "bytes", b""),
    "records": (Records, "records", None),
    "bool": (bool, "bool", False),
    "uuid": (uuid.UUID, "uuid", None),
}

# Optional per-field "kioType" hints: kio's own semantic types, so that a definition we
# carry for a standard API (a version kio lacks) yields classes shaped like kio's.
_KIO_TYPES: Mapping[str, tuple[type, object]] = {
    "error_code": (ErrorCode, ErrorCode.none),
    "timedelta_i32": (i32Timedelta, i32Timedelta.parse(datetime.timedelta(0))),
}

_ENTITY_TYPES: Mapping[str, EntityType] = {
    "request": EntityType.request,
    "response": EntityType.response,
    "header": EntityType.header,
    "data": EntityType.data,
    "coordinator-key": EntityType.data,
    "coordinator-value": EntityType.data,
}


@dataclasses.dataclass(frozen=True, slots=True)
class VersionRange:
    """A Kafka version spec: ``"0+"``, ``"1-2"``, ``"3"`` or ``"none"``."""

    low: int
    high: int | None  # None: open-ended ("0+")

    @classmethod
    def parse(cls, spec: str | None) -> VersionRange | None:
        if spec is None or spec == "none":
            return None
        match = re.fullmatch(r"(\d+)(\+|-(\d+))?", spec.strip())
        if match is None:
            raise SchemaDefinitionError(f"bad version spec {spec!r}")
        low = int(match.group(1))
        if match.group(2) == "+":
            return cls(low, None)
        high = int(match.group(3)) if match.group(3) else low
        return cls(low, high)

    def __contains__(self, version: object) -> bool:
        return isinstance(version, int) and self.low <= version and (self.high is None or version <= self.high)


def _in(spec: VersionRange | None, version: int) -> bool:
    return spec is not None and version in spec


def snake_case(name: str) -> str:
    """``DeliveryCompleteCount`` -> ``delivery_complete_count``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def _strip_comments(text: str) -> str:
    # Kafka's definitions carry // line comments, which JSON itself does not allow.
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//"))


class MessageDefinition:
    """One JSON message definition; ``entity(version)`` builds (and caches) its class."""

    __slots__ = ("name", "kind", "api_key", "valid_versions", "flexible_versions", "_fields", "_common", "_cache")

    def __init__(self, definition: Mapping[str, Any], *, api_key: int | None = None) -> None:
        try:
            self.name: str = definition["name"]
            self.kind: str = definition["type"]
            valid = VersionRange.parse(definition["validVersions"])
            self._fields: list[Mapping[str, Any]] = list(definition["fields"])
        except (KeyError, TypeError) as error:
            raise SchemaDefinitionError(f"definition lacks name/type/validVersions/fields: {error}") from None
        if self.kind not in _ENTITY_TYPES:
            raise SchemaDefinitionError(f"{self.name}: unknown definition type {self.kind!r}")
        if valid is None or valid.high is None:
            raise SchemaDefinitionError(f"{self.name}: validVersions must be a closed range")
        self.valid_versions: tuple[int, int] = (valid.low, valid.high)
        self.flexible_versions = VersionRange.parse(definition.get("flexibleVersions", "none"))
        self.api_key: int | None = api_key if api_key is not None else definition.get("apiKey")
        self._common = {struct["name"]: struct for struct in definition.get("commonStructs", ())}
        self._cache: dict[int, type] = {}

    @classmethod
    def from_text(cls, text: str, *, api_key: int | None = None) -> MessageDefinition:
        try:
            return cls(json.loads(_strip_comments(text)), api_key=api_key)
        except json.JSONDecodeError as error:
            raise SchemaDefinitionError(f"definition is not JSON: {error}") from None

    @classmethod
    def bundled(cls, name: str, *, api_key: int | None = None) -> MessageDefinition:
        """Load ``codec/schemas/<name>.json``."""
        return cls.from_text((SCHEMA_DIR / f"{name}.json").read_text(), api_key=api_key)

    @property
    def versions(self) -> range:
        return range(self.valid_versions[0], self.valid_versions[1] + 1)

    def entity(self, version: int) -> type:
        """The kio-compatible entity class for ``version``."""
        if version not in self.versions:
            raise SchemaDefinitionError(f"{self.name} has no version {version}; valid {self.valid_versions}")
        try:
            return self._cache[version]
        except KeyError:
            pass
        builder = _Builder(self, version)
        entity = builder.build_struct(self.name, self._fields, _ENTITY_TYPES[self.kind])
        # Expose nested struct classes as attributes (``ShareSnapshotValue.StateBatch``) so
        # callers can build values without digging through type annotations.
        for struct_name, struct in builder.structs.items():
            setattr(entity, struct_name, struct)
        self._cache[version] = entity
        return entity


class _Builder:
    """Builds the classes of one definition at one version."""

    def __init__(self, definition: MessageDefinition, version: int) -> None:
        self.definition = definition
        self.version = version
        self.flexible = _in(definition.flexible_versions, version)
        self.structs: dict[str, type] = {}

    def class_vars(self, entity_type: EntityType) -> list[tuple[str, Any, Any]]:
        class_vars: list[tuple[str, Any, Any]] = [
            ("__type__", ClassVar, entity_type),
            ("__version__", ClassVar[i16], i16(self.version)),
            ("__flexible__", ClassVar[bool], self.flexible),
        ]
        if self.definition.api_key is not None:
            class_vars.append(("__api_key__", ClassVar[i16], i16(self.definition.api_key)))
        if self.definition.kind == "request":
            header = RequestHeaderV2 if self.flexible else RequestHeaderV1
            class_vars.append(("__header_schema__", ClassVar[type], header))
        elif self.definition.kind == "response":
            header = ResponseHeaderV1 if self.flexible else ResponseHeaderV0
            class_vars.append(("__header_schema__", ClassVar[type], header))
        return class_vars

    def build_struct(self, name: str, fields: list[Mapping[str, Any]], entity_type: EntityType) -> type:
        specs = [self.field_spec(field) for field in fields if _in(VersionRange.parse(field.get("versions")), self.version)]
        cls = dataclasses.make_dataclass(
            name,
            self.class_vars(entity_type) + [spec for spec in specs if spec is not None],
            frozen=True,
            slots=True,
            kw_only=True,
        )
        cls.__module__ = f"codec.generated.{snake_case(self.definition.name)}.v{self.version}"
        cls.__doc__ = f"{name} (from {self.definition.name} v{self.version})."
        return cls

    def nested(self, type_name: str, field: Mapping[str, Any]) -> type:
        if type_name in self.structs:
            return self.structs[type_name]
        fields = field.get("fields")
        if fields is None:
            common = self.definition._common.get(type_name)
            if common is None:
                raise SchemaDefinitionError(f"{self.definition.name}: unknown struct type {type_name!r}")
            fields = common["fields"]
        cls = self.build_struct(type_name, list(fields), EntityType.nested)
        self.structs[type_name] = cls
        return cls

    def field_spec(self, field: Mapping[str, Any]) -> tuple[str, Any, dataclasses.Field] | None:
        try:
            name, kafka_json_type = field["name"], field["type"]
        except KeyError as error:
            raise SchemaDefinitionError(f"{self.definition.name}: field lacks {error}") from None
        nullable = _in(VersionRange.parse(field.get("nullableVersions")), self.version)
        tagged = _in(VersionRange.parse(field.get("taggedVersions")), self.version)
        if tagged and not self.flexible:
            raise SchemaDefinitionError(f"{self.definition.name}.{name}: tagged field in a non-flexible version")
        metadata: dict[str, Any] = {}
        if tagged:
            metadata["tag"] = int(field["tag"])

        is_array = kafka_json_type.startswith("[]")
        inner = kafka_json_type[2:] if is_array else kafka_json_type
        python_name = field.get("pythonName", snake_case(name))
        if inner in _PRIMITIVES:
            python_type, kafka_type, implicit = _PRIMITIVES[inner]
            kio_type = field.get("kioType")
            if kio_type is not None:
                if kio_type not in _KIO_TYPES or is_array or nullable:
                    raise SchemaDefinitionError(f"{self.definition.name}.{name}: unusable kioType {kio_type!r}")
                python_type, implicit = _KIO_TYPES[kio_type]
                kafka_type = kio_type
            metadata["kafka_type"] = kafka_type
            if inner in ("uuid", "records"):
                nullable_inner = True  # kio reads the zero UUID / null records as None
            else:
                nullable_inner = nullable and not is_array
            annotation: Any = python_type | None if nullable_inner else python_type
            if is_array:
                annotation = tuple[annotation, ...]
                if nullable:
                    annotation = annotation | None
                default: Any = None if nullable and field.get("default") == "null" else ()
            else:
                default = self.parse_default(field, inner, implicit, nullable)
                if kio_type is not None and "default" in field:
                    default = self.parse_kio_default(field, kio_type)
            return python_name, annotation, dataclasses.field(default=default, metadata=metadata)

        struct = self.nested(inner, field)
        if is_array:
            annotation = tuple[struct, ...]
            if nullable:
                annotation = annotation | None
            default = None if nullable and field.get("default") == "null" else ()
            return python_name, annotation, dataclasses.field(default=default, metadata=metadata)
        if nullable:
            return python_name, struct | None, dataclasses.field(default=None, metadata=metadata)
        return python_name, struct, dataclasses.field(default_factory=struct, metadata=metadata)

    def parse_kio_default(self, field: Mapping[str, Any], kio_type: str) -> object:
        milliseconds_or_code = int(str(field["default"]), 0)
        if kio_type == "error_code":
            return ErrorCode(milliseconds_or_code)
        return i32Timedelta.parse(datetime.timedelta(milliseconds=milliseconds_or_code))

    def parse_default(self, field: Mapping[str, Any], kind: str, implicit: object, nullable: bool) -> object:
        raw = field.get("default")
        if raw is None:
            return implicit
        if raw == "null":
            if not nullable and kind not in ("uuid", "records"):
                raise SchemaDefinitionError(f"{self.definition.name}.{field['name']}: null default on non-nullable")
            return None
        python_type = _PRIMITIVES[kind][0]
        try:
            if kind == "bool":
                return {"true": True, "false": False}[str(raw).lower()]
            if kind in ("string",):
                return str(raw)
            if kind == "float64":
                return f64(float(raw))
            return python_type(int(str(raw), 0))
        except (KeyError, ValueError) as error:
            raise SchemaDefinitionError(f"{self.definition.name}.{field['name']}: bad default {raw!r}: {error}") from None
