"""Plain data across the wall between the program's jail and the tests' jail (eval/verdict.py).

JSON, with a one-key object for each type JSON lacks: ``{"tuple": [...]}``, ``{"set": [...]}``,
``{"frozenset": [...]}``, ``{"dict": [[k, v], ...]}``, ``{"bytes": "hex"}``, ``{"complex": [re, im]}``,
``{"float": "nan" | "inf" | "-inf"}``, ``{"range": [start, stop, step]}``, ``{"iterator": [...]}`` (a
generator or another iterator of up to CHUNK items, drained: it arrives as an iterator over the same
items, so ``list(f())`` works and ``f() == [...]`` is false, as in one process; a longer or endless one
crosses as a :class:`LazyIterator` reference that the tests' side pulls a chunk at a time); the standard library's value types as the data
they are rebuilt from on the other side, so they compare as in one process (issue 53: ``bytearray``,
``Fraction``, ``Decimal``, ``date``, ``datetime``, ``time``, ``timedelta``, ``deque``, ``Counter``,
``OrderedDict``, a named tuple, an int past 4,300 digits in hex). Only data crosses, never an object: a subclass of a plain type
crosses as its plain value (a ``defaultdict`` as its dict, an ``int`` subclass
with an ``__eq__`` that is always true as its integer); any other object (a ``re.Match``, an instance
of a class the program defines) crosses as a reference: ``{"object": [type, truth, handle]}``, which
the tests' side turns into a stand-in that asks the program's jail for the object's public attributes
and methods (judge.py) and equals only itself; without a handle, into :class:`Opaque`. What the tests
compare is data the program computed. Decoding builds plain types and those stand-ins and nothing else
(no pickle, no classes by name).

Runs inside the jails (standard library only) and in codila itself (the tests of this module).
"""

import collections
import datetime
import decimal
import fractions
import json
import math

MAX_DEPTH = 100
PLAIN = (bool, int, float, complex, str, bytes, list, tuple, set, frozenset, dict)
MAX_ITEMS = 100_000  # an iterator the tests' side sends longer than this is endless for the tests' purposes
CHUNK = 1_000  # a program's iterator crosses whole up to this many items, else lazily in chunks of this size
BIG_INT_BITS = 13_000  # about 3,900 digits: larger ints cross in hex (decimal text stops at 4,300 digits)
TIMES = {"date": datetime.date, "datetime": datetime.datetime, "time": datetime.time}


class NotPlain(TypeError):
    """A value that cannot cross: it nests too deep, or (``opaque=False``) it is not plain data."""


class Opaque:
    """An object of the program's that stayed in the program's jail: equal only to itself."""

    __slots__ = ("truth", "type_name")

    def __init__(self, type_name, truth):
        object.__setattr__(self, "type_name", str(type_name)[:100])
        object.__setattr__(self, "truth", bool(truth))

    def __bool__(self):
        return self.truth

    def __repr__(self):
        return f"<{self.type_name} object, left in the program's jail>"

    def __getattr__(self, name):
        raise AttributeError(f"the program returned a {self.type_name} object, which stays in the program's jail; "
                             'tests that use the program\'s own objects need "verdict": "in-process"')


class LazyIterator:
    """An iterator of the program's whose first items are encoded already (``head``) and whose ``rest`` the
    tests' side pulls a chunk at a time (judge.py's stand-in asks ``next``): an endless generator is
    never drained, only as much of it as the tests take (issue 53)."""

    __slots__ = ("head", "rest")

    def __init__(self, head, rest):
        self.head, self.rest = head, rest

    def chunk(self, encode_item):
        """[done, up to CHUNK encoded items]: the head first, then the rest."""
        items, self.head = self.head[:CHUNK], self.head[CHUNK:]
        while len(items) < CHUNK:
            try:
                items.append(encode_item(next(self.rest)))
            except StopIteration:
                return [not self.head, items]
        return [False, items]


def _plain(value):
    """A subclass of a plain type as its plain value, read through the base type's own slots (the
    subclass's overrides, e.g. an ``__eq__`` or ``__iter__`` of its own, play no part)."""
    if isinstance(value, int):  # bool cannot be subclassed, so this is an int subclass
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, complex):
        return complex(complex.real.__get__(value), complex.imag.__get__(value))
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bytes):
        return bytes.__getitem__(value, slice(None))
    if isinstance(value, dict):
        return {k: dict.__getitem__(value, k) for k in dict.__iter__(value)}
    for base in (list, tuple, set, frozenset):
        if isinstance(value, base):
            return base(base.__iter__(value))
    raise NotPlain(f"a {type(value).__name__} is not plain data")


def encode(value, depth=0, opaque=True, refer=None):
    """``value`` as JSON-ready data (lists, str, numbers, one-key tag objects). An object that is not
    plain data: ``refer(obj)``'s tag where that gives one (a handle the other side can use), else an
    :class:`Opaque` tag, or with ``opaque=False`` NotPlain."""
    t = type(value)
    if t is int and value.bit_length() > BIG_INT_BITS:
        return {"int": format(value, "x")}
    if value is None or t is bool or t is int or t is str:
        return value
    if t is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if depth >= MAX_DEPTH:
        raise NotPlain(f"the value nests deeper than {MAX_DEPTH} levels")
    again = lambda v: encode(v, depth + 1, opaque, refer)
    if t is list:
        return [again(v) for v in value]
    if t is tuple or t is set or t is frozenset:
        return {t.__name__: [again(v) for v in value]}
    if t is dict:
        return {"dict": [[again(k), again(v)] for k, v in value.items()]}
    if t is bytes:
        return {"bytes": value.hex()}
    if t is complex:
        return {"complex": [encode(value.real), encode(value.imag)]}
    stdlib = _stdlib(value, t, again)
    if stdlib is not None:
        return stdlib
    if isinstance(value, PLAIN):
        return again(_plain(value))
    if t is range:
        return {"range": [value.start, value.stop, value.step]}
    if opaque and hasattr(t, "__next__") and hasattr(t, "__iter__"):  # a generator, map, zip, …
        items = []
        for item in value:
            items.append(again(item))
            if len(items) >= (CHUNK if refer is not None else MAX_ITEMS):
                break
        else:
            return {"iterator": items}  # it ended: drained
        if refer is None:
            raise NotPlain(f"the iterator yields more than {MAX_ITEMS} items")
        return refer(LazyIterator(items, value))  # endless, or long: the rest crosses as the tests take it
    tag = refer(value) if refer is not None else None
    if tag is not None:
        return tag
    if not opaque or t is Opaque:
        raise NotPlain(f"a {t.__name__} is not plain data")
    return {"object": [t.__name__, truth_of(value)]}


def _stdlib(value, t, again):
    """The standard library's value types, by their data (the tests' side rebuilds the real type, whose
    ``==`` is the standard library's): None for anything else."""
    if t is bytearray:
        return {"bytearray": value.hex()}
    if t is fractions.Fraction:
        return {"fraction": [again(value.numerator), again(value.denominator)]}
    if t is decimal.Decimal:
        return {"decimal": str(value)}
    for tag, kind in TIMES.items():
        if t is kind:
            return {tag: value.isoformat()}
    if t is datetime.timedelta:
        return {"timedelta": [value.days, value.seconds, value.microseconds]}
    if t is collections.deque:
        return {"deque": [value.maxlen, *(again(v) for v in value)]}
    if t is collections.Counter or t is collections.OrderedDict:
        return {t.__name__.lower(): [[again(k), again(v)] for k, v in dict.items(value)]}
    if isinstance(value, tuple) and t.__bases__ == (tuple,) and type(getattr(t, "_fields", None)) is tuple:
        return {"namedtuple": [t.__name__, list(t._fields), *(again(v) for v in tuple.__iter__(value))]}
    return None


def _rebuild(tag, body, again):
    """The value of a standard-library tag (:func:`_stdlib`); ValueError when malformed."""
    try:
        if tag == "int" and type(body) is str:
            return int(body, 16)
        if tag == "bytearray" and type(body) is str:
            return bytearray.fromhex(body)
        if tag == "decimal" and type(body) is str:
            return decimal.Decimal(body)
        if tag in TIMES and type(body) is str:
            return TIMES[tag].fromisoformat(body)
        if type(body) is not list:
            return None
        if tag == "fraction" and len(body) == 2:
            return fractions.Fraction(*(int(again(v)) for v in body))
        if tag == "timedelta" and len(body) == 3 and all(type(v) is int for v in body):
            return datetime.timedelta(days=body[0], seconds=body[1], microseconds=body[2])
        if tag == "deque" and body and (body[0] is None or type(body[0]) is int):
            return collections.deque((again(v) for v in body[1:]), body[0])
        if tag in ("counter", "ordereddict") and all(type(kv) is list and len(kv) == 2 for kv in body):
            kind = collections.Counter if tag == "counter" else collections.OrderedDict
            return kind({again(k): again(v) for k, v in body})
        if tag == "namedtuple" and len(body) >= 2 and type(body[0]) is str and type(body[1]) is list \
                and all(type(f) is str for f in body[1]) and len(body) - 2 == len(body[1]):
            return collections.namedtuple(body[0], body[1])(*(again(v) for v in body[2:]))
    except (ValueError, TypeError, ArithmeticError, OverflowError, decimal.InvalidOperation) as exc:
        raise ValueError(f"a malformed {tag}: {exc}") from None
    return None


def truth_of(value):
    try:
        return bool(value)
    except Exception:  # noqa: BLE001 - a __bool__ that raises: the object is still not data
        return True


def decode(obj, depth=0, resolve=None):
    """The value ``obj`` (from ``json.loads``) stands for; ValueError on anything malformed. ``resolve(tag,
    body)`` turns an ``object`` tag with a handle, or a ``handle`` tag, into the side's own stand-in or
    object; without it an object is :class:`Opaque` and a handle is refused."""
    t = type(obj)
    if obj is None or t in (bool, int, float, str):
        return obj
    if depth >= MAX_DEPTH:
        raise ValueError(f"the value nests deeper than {MAX_DEPTH} levels")
    again = lambda v: decode(v, depth + 1, resolve)
    if t is list:
        return [again(v) for v in obj]
    if t is not dict or len(obj) != 1:
        raise ValueError("a malformed value")
    (tag, body), = obj.items()
    rebuilt = _rebuild(tag, body, again)
    if rebuilt is not None:
        return rebuilt
    if tag == "float" and body in ("nan", "inf", "-inf"):
        return float(body)
    if tag == "bytes" and type(body) is str:
        return bytes.fromhex(body)
    if tag == "range" and type(body) is list and len(body) == 3 and all(type(x) is int for x in body) and body[2]:
        return range(*body)
    if tag == "object" and type(body) is list and len(body) in (2, 3) and type(body[0]) is str \
            and type(body[1]) is bool and all(type(h) is int for h in body[2:]):
        return resolve(tag, body) if resolve is not None and len(body) == 3 else Opaque(body[0], body[1])
    if tag == "handle" and type(body) is int and resolve is not None:
        return resolve(tag, body)
    if type(body) is not list:
        raise ValueError(f"a malformed {tag}")
    items = [again(v) for v in body]
    if tag == "tuple":
        return tuple(items)
    if tag == "iterator":
        return iter(items)
    if tag in ("set", "frozenset"):
        return set(items) if tag == "set" else frozenset(items)
    if tag == "dict" and all(type(kv) is list and len(kv) == 2 for kv in items):
        return {k: v for k, v in items}
    if tag == "complex" and len(items) == 2 and all(type(x) in (int, float) for x in items):
        return complex(items[0], items[1])
    raise ValueError(f"a malformed {tag}")


def dumps(message):
    """One protocol line (bytes): a JSON array whose parts are already encoded."""
    return (json.dumps(message, ensure_ascii=True, allow_nan=False, separators=(",", ":")) + "\n").encode("ascii")


def loads(line):
    """A protocol line back into its JSON array; ValueError if it is not one."""
    message = json.loads(line)
    if type(message) is not list or not message or type(message[0]) is not str:
        raise ValueError("a malformed message")
    return message
