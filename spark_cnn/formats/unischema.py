"""Petastorm's Unischema, as plain data, and its pickled form in a dataset's `_common_metadata`.

Petastorm stores the dataset schema as a pickle of its own classes (`petastorm.unischema.Unischema`, fields,
codecs, NumPy scalar types, pyspark type objects). We cannot import petastorm (it needs pyarrow <= 14 and
pyspark 3), and unpickling a file's metadata with `pickle.loads` would run whatever code the file names. So:

- reading goes through `loads_unischema`, an Unpickler whose `find_class` maps the few classes a Unischema
  uses onto the stand-ins below and refuses every other global, and which refuses a BUILD (set state) on a
  class: that would patch the allowed class itself, for the whole process, not one object;
- writing goes through `dumps_unischema`, which emits the pickle opcodes for a Unischema by hand, naming
  petastorm's classes, so petastorm itself unpickles the result into its real objects.
"""

from __future__ import annotations

import io
import pickle
import struct
from collections import OrderedDict
from typing import Any, NamedTuple

import numpy as np

from spark_cnn.errors import InputError

UNISCHEMA_MODULE = "petastorm.unischema"
CODECS_MODULE = "petastorm.codecs"
SPARK_TYPES_MODULE = "pyspark.sql.types"
# Scalar pyspark types a ScalarCodec may hold; all are plain classes without constructor arguments.
SPARK_SCALAR_TYPES = ("StringType", "BinaryType", "BooleanType", "ByteType", "ShortType", "IntegerType",
                      "LongType", "FloatType", "DoubleType", "DateType", "TimestampType", "DecimalType")
# NumPy scalar types a field's numpy_dtype may name.
NUMPY_SCALAR_TYPES = ("str_", "bytes_", "unicode_", "string_", "bool_", "int8", "int16", "int32", "int64",
                      "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64", "object_")


class CompressedImageCodec:
    """Stand-in for petastorm's CompressedImageCodec: image bytes (png or jpeg) decoded with OpenCV by petastorm."""

    def __init__(self, image_codec: str = "png", quality: int = 80):
        self._image_codec = "." + image_codec
        self._quality = quality

    @property
    def image_codec(self) -> str:
        return self._image_codec.lstrip(".")

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __repr__(self) -> str:
        return f"CompressedImageCodec({self.image_codec!r}, {self._quality})"


class NdarrayCodec:
    """Stand-in for petastorm's NdarrayCodec: arrays stored as `numpy.save` bytes."""

    def __eq__(self, other) -> bool:
        return type(other) is type(self)

    def __repr__(self) -> str:
        return "NdarrayCodec()"


class CompressedNdarrayCodec(NdarrayCodec):
    """Stand-in for petastorm's CompressedNdarrayCodec: arrays stored as `numpy.savez_compressed` bytes."""

    def __repr__(self) -> str:
        return "CompressedNdarrayCodec()"


class SparkType:
    """Stand-in for a pyspark.sql.types scalar type object, known by its class name."""

    name = "DataType"

    def __eq__(self, other) -> bool:
        return isinstance(other, SparkType) and other.name == self.name

    def __repr__(self) -> str:
        return f"{self.name}()"


_SPARK_TYPE_CLASSES = {name: type(name, (SparkType,), {"name": name}) for name in SPARK_SCALAR_TYPES}


def spark_type(name: str) -> SparkType:
    """`spark_type("StringType")` stands for `pyspark.sql.types.StringType()`."""
    return _SPARK_TYPE_CLASSES[name]()


class ScalarCodec:
    """Stand-in for petastorm's ScalarCodec: a plain Parquet column of the given Spark type."""

    def __init__(self, spark_type: SparkType):
        self._spark_type = spark_type

    @property
    def spark_type(self) -> SparkType:
        return self._spark_type

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other._spark_type == self._spark_type

    def __repr__(self) -> str:
        return f"ScalarCodec({self._spark_type!r})"


class UnischemaField(NamedTuple):
    """One field: name, NumPy scalar type, shape (None = any length), codec, nullable."""

    name: str
    numpy_dtype: Any
    shape: tuple
    codec: Any = None
    nullable: bool = False


class Unischema:
    """A named, ordered set of fields (petastorm also exposes each field as an attribute; so do we)."""

    def __init__(self, name: str, fields: list[UnischemaField]):
        self._name = name
        self._fields = OrderedDict((f.name, f) for f in fields)

    def __setstate__(self, state: dict) -> None:  # how a pickled petastorm Unischema becomes this object
        self._name = state.get("_name", "")
        self._fields = OrderedDict(state.get("_fields", {}))

    @property
    def name(self) -> str:
        return self._name

    @property
    def fields(self) -> OrderedDict:
        return self._fields

    def __repr__(self) -> str:
        return f"Unischema({self._name!r}, {list(self._fields.values())!r})"


_ALLOWED = {
    (UNISCHEMA_MODULE, "Unischema"): Unischema,
    (UNISCHEMA_MODULE, "UnischemaField"): UnischemaField,
    (CODECS_MODULE, "CompressedImageCodec"): CompressedImageCodec,
    (CODECS_MODULE, "NdarrayCodec"): NdarrayCodec,
    (CODECS_MODULE, "CompressedNdarrayCodec"): CompressedNdarrayCodec,
    (CODECS_MODULE, "ScalarCodec"): ScalarCodec,
    ("collections", "OrderedDict"): OrderedDict,
    ("numpy", "dtype"): np.dtype,
    **{(SPARK_TYPES_MODULE, name): cls for name, cls in _SPARK_TYPE_CLASSES.items()},
    **{("numpy", name): getattr(np, name) for name in NUMPY_SCALAR_TYPES if hasattr(np, name)},
}
# NumPy 2 removed these aliases; datasets written with NumPy 1 still name them.
_ALLOWED.setdefault(("numpy", "unicode_"), np.str_)
_ALLOWED.setdefault(("numpy", "string_"), np.bytes_)


class _Refused(pickle.UnpicklingError):
    """The pickle names a class or function outside the allow-list, or would change a class."""


class _AllowListUnpickler(pickle._Unpickler):
    """The pure-Python unpickler: its opcode table can be amended (the C one's cannot), and a Unischema pickle
    is a few hundred bytes, so its speed does not matter."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def find_class(self, module: str, name: str):
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise _Refused(f"refusing to load {module}.{name}: a Unischema holds only petastorm "
                           "schema, codec, NumPy and pyspark type classes") from None

    def _load_build(self) -> None:
        target = self.stack[-2]  # BUILD: stack [..., object, state]
        if isinstance(target, type):
            # Its state (a (dict, slots) pair sets attributes) would land on the class: every object of it in
            # this process, e.g. a codec's properties or Unischema.__setstate__, would change.
            raise _Refused(f"refusing to set state on the class {target.__module__}.{target.__qualname__}: a "
                           "Unischema pickle sets state on objects only")
        pickle._Unpickler.load_build(self)

    dispatch[pickle.BUILD[0]] = _load_build


def loads_unischema(data: bytes, *, source: str = "the dataset") -> Unischema:
    """A pickled petastorm Unischema -> our Unischema; refuses any other class named in the pickle."""
    try:
        schema = _AllowListUnpickler(io.BytesIO(data)).load()
    except _Refused as e:
        raise InputError(f"{source}: the stored petastorm Unischema cannot be read safely: {e}") from e
    except Exception as e:  # truncated or malformed pickles raise many types
        raise InputError(f"{source}: the stored petastorm Unischema is corrupt: {type(e).__name__}: {e}") from e
    if not isinstance(schema, Unischema):
        raise InputError(f"{source}: the stored petastorm schema is a {type(schema).__name__}, not a Unischema")
    return schema


def dumps_unischema(schema: Unischema) -> bytes:
    """Pickle (protocol 2) of `schema` naming petastorm's classes, as petastorm's `materialize_dataset` stores it."""
    out = _OpcodeWriter()
    out.new_object(UNISCHEMA_MODULE, "Unischema", ())
    out.raw(b"}(")  # EMPTY_DICT, MARK: the instance state
    out.string("_name")
    out.string(schema.name)
    out.string("_fields")
    out.global_(("collections", "OrderedDict"))
    out.raw(b")R(")  # EMPTY_TUPLE, REDUCE: OrderedDict(); MARK
    memo = {}
    for field in schema.fields.values():
        out.string(field.name)
        memo[field.name] = out.field(field)
    out.raw(b"u")  # SETITEMS into the OrderedDict
    for field in schema.fields.values():  # petastorm also sets each field as an attribute of the schema
        out.string(field.name)
        out.get(memo[field.name])
    out.raw(b"ub.")  # SETITEMS into the state dict, BUILD, STOP
    return out.getvalue()


class _OpcodeWriter:
    """The handful of pickle protocol-2 opcodes a Unischema needs, written directly."""

    def __init__(self):
        self._buffer = io.BytesIO()
        self._buffer.write(b"\x80\x02")  # PROTO 2
        self._memo_size = 0

    def raw(self, opcodes: bytes) -> None:
        self._buffer.write(opcodes)

    def getvalue(self) -> bytes:
        return self._buffer.getvalue()

    def string(self, text: str) -> None:
        data = text.encode("utf-8")
        self._buffer.write(b"X" + struct.pack("<I", len(data)) + data)  # BINUNICODE

    def int(self, value: int) -> None:
        self._buffer.write(b"J" + struct.pack("<i", value))  # BININT

    def global_(self, qualified: tuple[str, str]) -> None:
        module, name = qualified
        self._buffer.write(b"c" + module.encode("ascii") + b"\n" + name.encode("ascii") + b"\n")  # GLOBAL

    def put(self) -> int:
        index = self._memo_size
        self._memo_size += 1
        self._buffer.write(b"r" + struct.pack("<I", index))  # LONG_BINPUT
        return index

    def get(self, index: int) -> None:
        self._buffer.write(b"j" + struct.pack("<I", index))  # LONG_BINGET

    def new_object(self, module: str, name: str, args: tuple) -> None:
        """cls.__new__(cls, *args) for simple args: None, bool, int, str, tuples of those."""
        self.global_((module, name))
        self.value(tuple(args))
        self._buffer.write(b"\x81")  # NEWOBJ

    def value(self, value) -> None:
        if value is None:
            self._buffer.write(b"N")
        elif value is True or value is False:
            self._buffer.write(b"\x88" if value else b"\x89")
        elif isinstance(value, int):
            self.int(value)
        elif isinstance(value, str):
            self.string(value)
        elif isinstance(value, tuple):
            self._buffer.write(b"(")
            for item in value:
                self.value(item)
            self._buffer.write(b"t")
        else:
            raise TypeError(f"cannot write {type(value).__name__} into a Unischema pickle")

    def codec(self, codec) -> None:
        if codec is None:
            self._buffer.write(b"N")
            return
        name = type(codec).__name__
        if name not in ("CompressedImageCodec", "NdarrayCodec", "CompressedNdarrayCodec", "ScalarCodec"):
            raise TypeError(f"cannot write codec {codec!r} into a Unischema pickle")
        self.new_object(CODECS_MODULE, name, ())
        state = vars(codec)
        if not state:
            return
        self._buffer.write(b"}(")
        for key, item in state.items():
            self.string(key)
            if isinstance(item, SparkType):
                self.new_object(SPARK_TYPES_MODULE, item.name, ())
            else:
                self.value(item)
        self._buffer.write(b"ub")  # SETITEMS, BUILD

    def field(self, field: UnischemaField) -> int:
        """UnischemaField(name, numpy_dtype, shape, codec, nullable), memoised; returns its memo index."""
        self.global_((UNISCHEMA_MODULE, "UnischemaField"))
        self._buffer.write(b"(")
        self.string(field.name)
        self.global_(("numpy", _numpy_name(field.numpy_dtype)))
        self.value(tuple(field.shape))
        self.codec(field.codec)
        self.value(bool(field.nullable))
        self._buffer.write(b"t\x81")  # TUPLE, NEWOBJ
        return self.put()


def _numpy_name(numpy_type) -> str:
    """`np.uint8` -> "uint8", `np.str_` -> "str_": the name NumPy pickles the scalar type under."""
    scalar = np.dtype(numpy_type).type
    for name in NUMPY_SCALAR_TYPES:
        if getattr(np, name, None) is scalar:
            return name
    raise TypeError(f"cannot write NumPy type {numpy_type!r} into a Unischema pickle")
