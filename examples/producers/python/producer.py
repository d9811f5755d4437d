#!/usr/bin/python3
"""A payment-callback producer for idemq, with pika (and msgpack for --msgpack).

Reads events from stdin, one per line: ORDER_ID EVENT_TYPE AMOUNT (amount in minor units), and
publishes each as an idemq envelope, persistent, with publisher confirms.

  AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f \\
    /usr/bin/python3 producer.py --routing-key payments [--exchange EX] [--msgpack] < events.txt
  /usr/bin/python3 producer.py --check-vectors ../../../schemas/vectors/vectors.json

AMQP_EXCHANGE and AMQP_ROUTING_KEY stand in for the options. On Debian use /usr/bin/python3 with
python3-pika and python3-msgpack; elsewhere `pip install -r requirements.txt`.
"""
import argparse
import datetime
import json
import math
import os
import sys
import uuid

import msgpack
import pika

MAX_KEY_BYTES = 128  # bytes of UTF-8, not characters
MAX_DEPTH = 32       # nested maps/arrays; the top-level map is level 1


def build_biz_key(order_id, event_type):
    """The business key: built here, from business data only. Never from a timestamp, a random
    id or the message_id: a resend of the same event must carry the same key."""
    return f"order_id:{order_id}:{event_type}"


def make_event(order_id, event_type, amount, occurred_at=None, message_id=None):
    """The envelope: snake_case keys, money as an integer in minor units (never a float)."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "message_id": message_id or str(uuid.uuid4()),  # fresh per message: tracing only
        "biz_key": build_biz_key(order_id, event_type),
        "order_id": order_id,
        "event_type": event_type,
        "amount": amount,
        "occurred_at": occurred_at or now,
    }


def value_error(value, level=0):
    """'too_deep' or 'unsupported' when a value breaks the envelope's rules, else None."""
    if isinstance(value, (dict, list)):
        if level + 1 > MAX_DEPTH:
            return "too_deep"
        children = value.values() if isinstance(value, dict) else value
        return next(filter(None, (value_error(v, level + 1) for v in children)), None)
    if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**63:
        return "unsupported"  # idemq reads integers as signed 64-bit
    if isinstance(value, float) and not math.isfinite(value):
        return "unsupported"
    return None


def envelope_error(env):
    """What idemq would dead-letter this envelope for (names as in schemas/vectors), or None."""
    if not isinstance(env, dict):
        return "not_map"
    if "biz_key" not in env:
        return "biz_key_missing"
    key = env["biz_key"]
    if not isinstance(key, str):
        return "biz_key_type"
    if key == "":
        return "biz_key_empty"
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        return "biz_key_too_long"
    if "\0" in key:
        return "biz_key_utf8"
    return value_error(env)


def encode(env, use_msgpack):
    if use_msgpack:  # str stays str (use_bin_type): idemq refuses bin and ext
        return msgpack.packb(env, use_bin_type=True), "application/msgpack"
    return json.dumps(env, ensure_ascii=False).encode("utf-8"), "application/json"


def publish(events, url, exchange, routing_key, use_msgpack):
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()  # basic_publish now waits for the broker's confirm
    for env in events:
        error = envelope_error(env)
        if error:
            raise ValueError(f"refusing to publish {env.get('biz_key')!r}: {error}")
        body, content_type = encode(env, use_msgpack)
        props = pika.BasicProperties(content_type=content_type, message_id=env["message_id"],
                                     delivery_mode=pika.spec.PERSISTENT_DELIVERY_MODE)
        # Raises NackError when the broker refuses it, UnroutableError when no queue took it.
        channel.basic_publish(exchange, routing_key, body, props, mandatory=True)
    connection.close()
    return len(events)


def check_vectors(path):
    """Checks this producer against the shared vectors; returns the number of failures."""
    with open(path, encoding="utf-8") as f:
        cases = json.load(f)
    by_name = {c["name"]: c for c in cases}
    checked, failures = 0, []

    def check(ok, what):
        nonlocal checked
        checked += 1
        if not ok:
            failures.append(what)

    for case in cases:
        want_key, want_error = case["expect"].get("biz_key"), case["expect"].get("error")
        if "body_json" in case:  # our pre-publish validation agrees with idemq on every map
            body = case["body_json"]
            got = envelope_error(body)
            check(got == want_error and (got or body["biz_key"] == want_key),
                  f"{case['name']}: validation says {got}, idemq says {want_error or want_key}")
            if want_key and isinstance(body.get("order_id"), str) and "event_type" in body:
                got_key = build_biz_key(body["order_id"], body["event_type"])
                check(got_key == want_key, f"{case['name']}: built key {got_key!r}")
        ref = by_name.get(case.get("same_record_as"), {})
        if "body_hex" in case and "body_json" in ref:  # msgpack reads as the same record
            record = msgpack.unpackb(bytes.fromhex(case["body_hex"]), raw=False)
            check(record == ref["body_json"], f"{case['name']}: decodes to {record!r}")

    # Our own encoder, both ways: the seed event built by make_event reads back as the vector,
    # and so do a non-ASCII key and the largest amount.
    seed = by_name["seed_payment_callback/json"]["body_json"]
    ours = make_event(seed["order_id"], seed["event_type"], seed["amount"],
                      seed["occurred_at"], seed["message_id"])
    big = make_event("订单-café-😀", "PAY_SUCCESS", 2**63 - 1)
    for env, want in ((ours, seed), (big, big)):
        for use_msgpack in (False, True):
            body, _ = encode(env, use_msgpack)
            back = msgpack.unpackb(body, raw=False) if use_msgpack else json.loads(body)
            check(back == want and envelope_error(back) is None,
                  f"encoding {env['biz_key']!r} (msgpack={use_msgpack}) reads back as {back!r}")

    for failure in failures:
        print("FAIL", failure, file=sys.stderr)
    print(f"python check-vectors: {checked - len(failures)} passed, {len(failures)} failed")
    return len(failures)


def read_events(lines):
    events = []
    for line in lines:
        if line.strip():
            order_id, event_type, amount = line.split()
            events.append(make_event(order_id, event_type, int(amount)))
    return events


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exchange", default=os.environ.get("AMQP_EXCHANGE", ""))
    parser.add_argument("--routing-key", default=os.environ.get("AMQP_ROUTING_KEY"))
    parser.add_argument("--msgpack", action="store_true", help="send application/msgpack")
    parser.add_argument("--check-vectors", metavar="VECTORS_JSON")
    args = parser.parse_args()
    if args.check_vectors:
        return 1 if check_vectors(args.check_vectors) else 0
    if not args.routing_key:
        parser.error("--routing-key (or AMQP_ROUTING_KEY) is required")
    url = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
    sent = publish(read_events(sys.stdin), url, args.exchange, args.routing_key, args.msgpack)
    print(f"python: {sent} messages confirmed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
