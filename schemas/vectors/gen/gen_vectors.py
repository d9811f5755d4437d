#!/usr/bin/python3
"""Generates schemas/vectors/vectors.json, the shared envelope test vectors.

Run from anywhere:  /usr/bin/python3 schemas/vectors/gen/gen_vectors.py
(or with --check to fail when the committed file is out of date, or with --corpus DIR to write
the bodies as a seed corpus for tests/fuzz/fuzz_envelope.c).

The script has no dependencies. It carries its own small MessagePack encoder so that it can also
write the hostile encodings on purpose (container headers that lie, bin, ext, str holding invalid
UTF-8, non-minimal forms). When python3-msgpack happens to be installed, every well-formed body
is cross-checked against it.

Each logical message becomes a JSON case and a MessagePack case with the same expectation; a
MessagePack case that decodes also names the JSON case whose record it must equal.
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "vectors.json")

JSON_CT = "application/json"
MP_CT = "application/msgpack"


# ---- a tiny MessagePack encoder ------------------------------------------------------------

class Bin(bytes):
    """Encoded as bin."""


class RawStr(bytes):
    """Encoded as str with exactly these bytes (may be invalid UTF-8)."""


class Ext:
    def __init__(self, code, data):
        self.code, self.data = code, data


class Raw(bytes):
    """Inserted verbatim: for headers that lie or reserved bytes."""


class F32(float):
    """Encoded as float 32."""


class Wide:
    """A map, str or int in its widest encoding (map32, str32, uint64): legal but not minimal."""

    def __init__(self, value):
        self.value = value


class Pairs(list):
    """A map given as a list of (key, value), so keys may repeat or be non-strings."""


def _str_header(n):
    if n < 32:
        return bytes([0xA0 | n])
    if n < 0x100:
        return b"\xd9" + bytes([n])
    if n < 0x10000:
        return b"\xda" + struct.pack(">H", n)
    return b"\xdb" + struct.pack(">I", n)


def _container_header(n, fix, h16, h32):
    if n < 16:
        return bytes([fix | n])
    if n < 0x10000:
        return bytes([h16]) + struct.pack(">H", n)
    return bytes([h32]) + struct.pack(">I", n)


def mp(v):
    if isinstance(v, Raw):
        return bytes(v)
    if isinstance(v, Wide):
        x = v.value
        if isinstance(x, dict):
            return b"\xdf" + struct.pack(">I", len(x)) + b"".join(mp(k) + mp(y) for k, y in x.items())
        if isinstance(x, str):
            b = x.encode()
            return b"\xdb" + struct.pack(">I", len(b)) + b
        if isinstance(x, int) and x >= 0:
            return b"\xcf" + struct.pack(">Q", x)
        raise TypeError(x)
    if v is None:
        return b"\xc0"
    if v is True:
        return b"\xc3"
    if v is False:
        return b"\xc2"
    if isinstance(v, int):
        if 0 <= v < 0x80:
            return bytes([v])
        if -32 <= v < 0:
            return struct.pack(">b", v)
        if v >= 0:
            for tag, fmt, lim in ((0xCC, ">B", 1 << 8), (0xCD, ">H", 1 << 16),
                                  (0xCE, ">I", 1 << 32), (0xCF, ">Q", 1 << 64)):
                if v < lim:
                    return bytes([tag]) + struct.pack(fmt, v)
        for tag, fmt, lim in ((0xD0, ">b", 1 << 7), (0xD1, ">h", 1 << 15),
                              (0xD2, ">i", 1 << 31), (0xD3, ">q", 1 << 63)):
            if -lim <= v:
                return bytes([tag]) + struct.pack(fmt, v)
        raise OverflowError(v)
    if isinstance(v, F32):
        return b"\xca" + struct.pack(">f", v)
    if isinstance(v, float):
        return b"\xcb" + struct.pack(">d", v)
    if isinstance(v, RawStr):
        return _str_header(len(v)) + bytes(v)
    if isinstance(v, str):
        b = v.encode("utf-8", "surrogatepass")
        return _str_header(len(b)) + b
    if isinstance(v, Bin):
        n = len(v)
        hdr = b"\xc4" + bytes([n]) if n < 0x100 else b"\xc5" + struct.pack(">H", n)
        return hdr + bytes(v)
    if isinstance(v, Ext):
        n = len(v.data)
        fixed = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
        hdr = bytes([fixed[n]]) if n in fixed else b"\xc7" + bytes([n])
        return hdr + struct.pack(">b", v.code) + v.data
    if isinstance(v, Pairs):
        return _container_header(len(v), 0x80, 0xDE, 0xDF) + b"".join(mp(k) + mp(x) for k, x in v)
    if isinstance(v, dict):
        return _container_header(len(v), 0x80, 0xDE, 0xDF) + b"".join(
            mp(k) + mp(x) for k, x in v.items())
    if isinstance(v, list):
        return _container_header(len(v), 0x90, 0xDC, 0xDD) + b"".join(mp(x) for x in v)
    raise TypeError(type(v))


def _plain(v):
    """True when v uses no wrapper, so python3-msgpack must encode it the same way."""
    if isinstance(v, (Raw, RawStr, Bin, Ext, F32, Wide, Pairs)):
        return False
    if isinstance(v, dict):
        return all(_plain(k) and _plain(x) for k, x in v.items())
    if isinstance(v, list):
        return all(_plain(x) for x in v)
    return True


# ---- cases ---------------------------------------------------------------------------------

cases = []
encoded = []  # every value given to mp() by a case, for the optional cross-check


def ok(biz_key, **extra):
    e = {"biz_key": biz_key}
    e.update(extra)
    return e


def err(name):
    return {"error": name}


def add(name, content_type, expect, note=None, **body):
    case = {"name": name, "content_type": content_type}
    case.update(body)
    case["expect"] = expect
    if note:
        case["note"] = note
    cases.append(case)


def both(name, value, expect, note=None):
    """One logical message as a JSON case and a MessagePack case."""
    add(name + "/json", JSON_CT, expect, note, body_json=value)
    extra = {"same_record_as": name + "/json"} if "biz_key" in expect else {}
    encoded.append(value)
    add(name + "/msgpack", MP_CT, expect, note, body_hex=mp(value).hex(), **extra)


def json_text(name, text, expect, note=None, content_type=JSON_CT):
    add(name, content_type, expect, note, body_text=text)


def json_hex(name, data, expect, note=None, content_type=JSON_CT):
    add(name, content_type, expect, note, body_hex=data.hex())


def msgpack(name, value, expect, note=None, content_type=MP_CT, same_record_as=None):
    extra = {"same_record_as": same_record_as} if same_record_as else {}
    encoded.append(value)
    add(name, content_type, expect, note, body_hex=mp(value).hex(), **extra)


def nested(levels, inner=1):
    """An envelope whose maps nest `levels` deep, the top-level map counting as 1."""
    v = inner
    for _ in range(levels - 1):
        v = {"d": v}
    return {"biz_key": "deep", "d": v}


SEED = {
    "message_id": "7f3c2a9e-2f6b-4d7e-9d1a-0c5e8b1f4a21",
    "biz_key": "order_id:20250101_0001:PAY_SUCCESS",
    "order_id": "20250101_0001",
    "event_type": "PAY_SUCCESS",
    "amount": 10000,
    "occurred_at": "2025-01-01T10:00:00Z",
}
K128 = "order_id:" + "0" * 119
K129 = "order_id:" + "0" * 120
K300 = "order_id:" + "9" * 291
EURO128 = "\u20ac" * 42 + "ab"  # 42 * 3 + 2 = 128 bytes, 44 characters
EURO129 = "\u20ac" * 43  # 129 bytes, only 43 characters

# Valid messages.
both("minimal", {"biz_key": "k1"}, ok("k1"))
both("seed_payment_callback", SEED,
     ok(SEED["biz_key"], message_id=SEED["message_id"], event_type="PAY_SUCCESS"),
     "the worked example of the seed, section 4")
both("unicode_biz_key", {"biz_key": "订单:20250101_0001:支付成功"}, ok("订单:20250101_0001:支付成功"))
both("biz_key_128_bytes", {"biz_key": K128}, ok(K128), "exactly the limit")
both("biz_key_128_bytes_multibyte", {"biz_key": EURO128}, ok(EURO128),
     "44 characters, 128 bytes: the limit is in bytes")
both("message_id_not_a_string", {"biz_key": "k1", "message_id": 42, "event_type": None},
     ok("k1", message_id=None, event_type=None),
     "message_id and event_type are optional; a non-string reads as absent")
both("business_fields", {"biz_key": "k1", "amount": 100.5, "paid": True, "refund": None,
                         "items": [{"sku": "A-1", "qty": 2}], "customer": {"address": {"city": "Hangzhou"}},
                         "min": -9223372036854775808, "max": 9223372036854775807},
     ok("k1"), "every JSON type, and the 64-bit signed range")
both("depth_32", nested(32), ok("deep"), "nesting exactly at the default limit of 32")
both("biz_key_not_first", {"z": 1, "a": [], "biz_key": "k1"}, ok("k1"))
both("empty_key_and_value", {"": "", "biz_key": "k1"}, ok("k1"),
     "an empty key is legal; found by fuzzing (msgpack-c gives a zero-length str no pointer)")

# biz_key rules.
both("biz_key_129_bytes", {"biz_key": K129}, err("biz_key_too_long"))
both("biz_key_129_bytes_multibyte", {"biz_key": EURO129}, err("biz_key_too_long"),
     "43 characters but 129 bytes")
both("biz_key_300_bytes", {"biz_key": K300}, err("biz_key_too_long"))
both("biz_key_missing", {"order_id": "20250101_0001", "event_type": "PAY_SUCCESS"},
     err("biz_key_missing"))
both("biz_key_camel_case", {"bizKey": "k1"}, err("biz_key_missing"), "keys are snake_case")
both("empty_map", {}, err("biz_key_missing"))
both("biz_key_empty", {"biz_key": ""}, err("biz_key_empty"))
both("biz_key_number", {"biz_key": 12345}, err("biz_key_type"))
both("biz_key_null", {"biz_key": None}, err("biz_key_type"))
both("biz_key_bool", {"biz_key": True}, err("biz_key_type"))
both("biz_key_map", {"biz_key": {"order_id": "1"}}, err("biz_key_type"))
both("biz_key_array", {"biz_key": ["order_id", "1"]}, err("biz_key_type"))
both("biz_key_nul", {"biz_key": "order\u0000id"}, err("biz_key_utf8"), "NUL inside biz_key")

# Shape.
both("top_level_array", [{"biz_key": "k1"}], err("not_map"))
both("top_level_string", "k1", err("not_map"))
both("top_level_number", 7, err("not_map"))
both("depth_33", nested(33), err("too_deep"), "one level above the default limit")
both("depth_33_empty_inner", nested(32, inner={}), err("too_deep"),
     "an empty map still counts as a level")
both("depth_40", nested(40), err("too_deep"))
deep_array = 1
for _ in range(39):
    deep_array = [deep_array]
both("depth_40_arrays", {"biz_key": "deep", "a": deep_array}, err("too_deep"))

# JSON only.
json_text("json/malformed_unterminated", '{"biz_key": "k1",', err("syntax"))
json_text("json/malformed_single_quotes", "{'biz_key': 'k1'}", err("syntax"))
json_text("json/malformed_bare_word", "biz_key=k1", err("syntax"))
json_text("json/trailing_garbage", '{"biz_key":"k1"} x', err("syntax"))
json_text("json/two_documents", '{"biz_key":"k1"}{"biz_key":"k2"}', err("syntax"))
json_text("json/trailing_whitespace", '{"biz_key":"k1"}\r\n', ok("k1"))
json_text("json/duplicate_biz_key", '{"biz_key":"a","biz_key":"b"}', err("duplicate_key"))
json_text("json/duplicate_nested_key", '{"biz_key":"k1","x":{"y":1,"y":2}}',
          err("duplicate_key"))
json_text("json/integer_above_int64", '{"biz_key":"k1","n":18446744073709551615}',
          err("unsupported"), "same rule as a msgpack uint64 above INT64_MAX")
json_text("json/nul_in_key", '{"biz_key":"k1","a\\u0000b":1}', err("unsupported"))
json_text("json/escaped_biz_key", '{"biz_key":"order\\u005f1\\ud83d\\ude00"}',
          ok("order_1\U0001F600"), "escapes, including a surrogate pair, decode to UTF-8")
json_hex("json/invalid_utf8", b'{"biz_key":"k\xff"}', err("syntax"),
         "JSON text must be UTF-8; jansson rejects it while parsing")
json_hex("json/utf8_bom", b'\xef\xbb\xbf{"biz_key":"k1"}', err("syntax"))
json_text("json/whitespace_only", " \n\t ", err("syntax"))
json_text("json/empty_body", "", err("empty"))
json_text("json/charset_parameter", '{"biz_key":"k1"}', ok("k1"),
          content_type="application/json; charset=utf-8")
json_text("json/content_type_upper_case", '{"biz_key":"k1"}', ok("k1"),
          content_type="Application/JSON")

# MessagePack only.
seed_mp = mp(SEED)
add("msgpack/truncated", MP_CT, err("syntax"), body_hex=seed_mp[:-3].hex())
add("msgpack/truncated_header", MP_CT, err("syntax"), "map16 header cut in half",
    body_hex="de00")
add("msgpack/trailing_bytes", MP_CT, err("syntax"), body_hex=(mp({"biz_key": "k1"}) + b"\x00").hex())
add("msgpack/two_documents", MP_CT, err("syntax"),
    body_hex=(mp({"biz_key": "k1"}) + mp({"biz_key": "k2"})).hex())
msgpack("msgpack/reserved_byte_c1", {"biz_key": Raw(b"\xc1")}, err("syntax"))
msgpack("msgpack/huge_map_header", Raw(b"\xdf\xff\xff\xff\xff"), err("syntax"),
        "map32 claiming 2^32-1 entries in 5 bytes: must fail without allocating for them")
msgpack("msgpack/huge_array_header_nested", {"biz_key": "k1", "x": Raw(b"\xdd\xff\xff\xff\xff")},
        err("syntax"))
msgpack("msgpack/huge_str_header", {"biz_key": Raw(b"\xdb\xff\xff\xff\xff")}, err("syntax"))
msgpack("msgpack/huge_bin_header", {"biz_key": "k1", "b": Raw(b"\xc6\xff\xff\xff\xff")},
        err("syntax"))
msgpack("msgpack/biz_key_invalid_utf8", {"biz_key": RawStr(b"order\xff1")}, err("biz_key_utf8"),
        "a str that is not UTF-8 is a syntax error, except biz_key, which names the field")
msgpack("msgpack/biz_key_overlong_utf8", {"biz_key": RawStr(b"a\xc0\xafb")}, err("biz_key_utf8"))
msgpack("msgpack/biz_key_surrogate", {"biz_key": RawStr(b"a\xed\xa0\x80")}, err("biz_key_utf8"))
msgpack("msgpack/field_invalid_utf8", {"biz_key": "k1", "name": RawStr(b"\xfe")}, err("syntax"))
msgpack("msgpack/key_invalid_utf8", {"biz_key": "k1", RawStr(b"\xfe"): 1}, err("syntax"))
msgpack("msgpack/bin_value", {"biz_key": "k1", "payload": Bin(b"\x01\x02\x03")},
        err("unsupported"), "bin has no JSON form")
msgpack("msgpack/bin_biz_key", {"biz_key": Bin(b"k1")}, err("unsupported"),
        "biz_key sent as bytes instead of str")
msgpack("msgpack/ext_value", {"biz_key": "k1", "e": Ext(5, b"abcd")}, err("unsupported"))
msgpack("msgpack/timestamp_ext", {"biz_key": "k1", "at": Ext(-1, b"\x00\x00\x00\x00")},
        err("unsupported"), "send times as RFC 3339 strings")
msgpack("msgpack/integer_key", Pairs([("biz_key", "k1"), (1, "x")]), err("unsupported"))
msgpack("msgpack/nil_key", Pairs([(None, "x"), ("biz_key", "k1")]), err("unsupported"))
msgpack("msgpack/nul_in_key", {"biz_key": "k1", "a\u0000b": 1}, err("unsupported"))
msgpack("msgpack/duplicate_biz_key", Pairs([("biz_key", "a"), ("biz_key", "b")]),
        err("duplicate_key"))
msgpack("msgpack/uint64_above_int64", {"biz_key": "k1", "n": 2 ** 64 - 1}, err("unsupported"))
msgpack("msgpack/nan", {"biz_key": "k1", "x": float("nan")}, err("unsupported"))
msgpack("msgpack/infinity", {"biz_key": "k1", "x": float("-inf")}, err("unsupported"))
msgpack("msgpack/float32", {"biz_key": "k1", "x": F32(1.5)}, ok("k1"),
        same_record_as="float_1_5/json")
both("float_1_5", {"biz_key": "k1", "x": 1.5}, ok("k1"))
msgpack("msgpack/wide_encodings", Wide({Wide("biz_key"): Wide("k1"), "n": Wide(7)}), ok("k1"),
        "map32, str32 and uint64 for small values are legal", same_record_as="wide_reference/json")
both("wide_reference", {"biz_key": "k1", "n": 7}, ok("k1"))
add("msgpack/empty_body", MP_CT, err("empty"), body_hex="")
msgpack("msgpack/x_msgpack", {"biz_key": "k1"}, ok("k1"), content_type="application/x-msgpack",
        same_record_as="minimal/json")
msgpack("msgpack/content_type_parameter", {"biz_key": "k1"}, ok("k1"),
        content_type="application/msgpack; v=1", same_record_as="minimal/json")

# Content type and sniffing.
json_text("sniff/json", '{"biz_key":"k1"}', ok("k1"), content_type=None)
json_text("sniff/json_leading_whitespace", ' \r\n\t{"biz_key":"k1"}', ok("k1"), content_type=None)
json_text("sniff/json_empty_content_type", '{"biz_key":"k1"}', ok("k1"), content_type="")
json_text("sniff/json_array", '[{"biz_key":"k1"}]', err("not_map"), content_type=None)
msgpack("sniff/msgpack", SEED, ok(SEED["biz_key"]), content_type=None,
        same_record_as="seed_payment_callback/json")
msgpack("sniff/msgpack_empty_content_type", {"biz_key": "k1"}, ok("k1"), content_type="",
        same_record_as="minimal/json")
add("sniff/empty_body", None, err("empty"), body_hex="")
json_text("content_type/unknown", '{"biz_key":"k1"}', err("unsupported"), content_type="text/plain")
json_text("content_type/xml", "<biz_key>k1</biz_key>", err("unsupported"),
          content_type="application/xml")
msgpack("content_type/msgpack_body_labelled_json", {"biz_key": "k1"}, err("syntax"),
        content_type=JSON_CT)
json_text("content_type/json_body_labelled_msgpack", '{"biz_key":"k1"}', err("syntax"),
          content_type=MP_CT)


def cross_check():
    try:
        import msgpack as lib  # python3-msgpack, optional
    except ImportError:
        return 0
    samples = encoded + [1, -1, -33, 200, -200, 70000, -70000, 2 ** 40, -(2 ** 40), 2 ** 64 - 1,
                         -(2 ** 63), 1.25, "x" * 31, "x" * 32, "x" * 300, "x" * 70000,
                         list(range(20)), {str(i): i for i in range(20)}]
    n = 0
    for v in samples:
        if _plain(v) and v == v:  # NaN is plain but never equal; it is written by hand anyway
            assert mp(v) == lib.packb(v, use_bin_type=True), v
            n += 1
    return n


def schema_check():
    """With python3-jsonschema installed, checks envelope.schema.json against the JSON cases.
    The schema cannot count bytes or see depth and duplicates, so those cases are skipped."""
    try:
        import jsonschema
    except ImportError:
        return 0
    with open(os.path.join(HERE, "..", "..", "envelope.schema.json"), encoding="utf-8") as f:
        validator = jsonschema.Draft202012Validator(json.load(f))
    schema_errors = {"biz_key_missing", "biz_key_type", "biz_key_empty", "biz_key_utf8", "not_map"}
    lenient = {"message_id_not_a_string/json"}  # the schema asks more than idemq enforces
    n = 0
    for c in cases:
        if "body_json" not in c or c["name"] in lenient:
            continue
        want = c["expect"].get("error")
        if want is None or want in schema_errors:
            assert validator.is_valid(c["body_json"]) == (want is None), c["name"]
            n += 1
    return n


def render():
    names = [c["name"] for c in cases]
    assert len(names) == len(set(names)), "duplicate case names"
    for c in cases:
        ref = c.get("same_record_as")
        assert ref is None or ref in names, ref
    lines = [json.dumps(c, ensure_ascii=False, separators=(", ", ": ")) for c in cases]
    return "[\n  " + ",\n  ".join(lines) + "\n]\n"


def body_bytes(c):
    if "body_hex" in c:
        return bytes.fromhex(c["body_hex"])
    if "body_text" in c:
        return c["body_text"].encode("utf-8")
    return json.dumps(c["body_json"], ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def write_corpus(directory):
    """Seeds tests/fuzz/fuzz_envelope.c: one file per case, a selector byte then the body."""
    selector = {None: 0, JSON_CT: 1, MP_CT: 2, "": 3}
    os.makedirs(directory, exist_ok=True)
    for c in cases:
        name = c["name"].replace("/", "_")
        with open(os.path.join(directory, name), "wb") as f:
            f.write(bytes([selector.get(c["content_type"], 0)]) + body_bytes(c))


def main():
    text = render()
    if "--corpus" in sys.argv[1:]:
        write_corpus(sys.argv[sys.argv.index("--corpus") + 1])
        return
    checked = cross_check()
    schema_checked = schema_check()
    if "--check" in sys.argv[1:]:
        with open(OUT, encoding="utf-8") as f:
            if f.read() != text:
                sys.exit("vectors.json is out of date: run schemas/vectors/gen/gen_vectors.py")
        return
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {len(cases)} cases to {os.path.relpath(OUT)}"
          + (f"; {checked} encodings cross-checked against python3-msgpack" if checked else "")
          + (f"; {schema_checked} cases checked against envelope.schema.json" if schema_checked
             else ""))


if __name__ == "__main__":
    main()
