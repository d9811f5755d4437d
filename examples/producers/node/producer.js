#!/usr/bin/env node
// A payment-callback producer for idemq, with amqplib.
//
// Reads events from stdin, one per line: ORDER_ID EVENT_TYPE AMOUNT (amount in minor units), and
// publishes each as an idemq envelope, persistent, with publisher confirms.
//
//   npm install && AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f \
//     node producer.js --routing-key payments [--exchange EX] < events.txt
//   npm run check-vectors
//
// AMQP_EXCHANGE and AMQP_ROUTING_KEY stand in for the options.
//
// Large integers: a JavaScript number is a double, exact only up to 2^53 - 1, and JSON.parse /
// JSON.stringify go through numbers. Amounts are therefore BigInt here, from parsing the input to
// writing the body, and toJson writes a BigInt as the bare integer it is: 9007199254740993 stays
// 9007199254740993 (a number would send ...992). idemq reads integers as signed 64-bit.
'use strict';
const amqp = require('amqplib');
const crypto = require('node:crypto');
const fs = require('node:fs');
const readline = require('node:readline');
const { isDeepStrictEqual } = require('node:util');

const INT64_MIN = -(2n ** 63n);
const INT64_MAX = 2n ** 63n - 1n;

// The business key: built here, from business data only. Never from a timestamp, a random id or
// the message id: a resend of the same event must carry the same key.
function buildBizKey(orderId, eventType) {
  return `order_id:${orderId}:${eventType}`;
}

// The envelope: snake_case keys (not the camelCase JavaScript would reach for).
function makeEvent(orderId, eventType, amount) {
  return {
    message_id: crypto.randomUUID(), // fresh per message: tracing only
    biz_key: buildBizKey(orderId, eventType),
    order_id: orderId,
    event_type: eventType,
    amount: BigInt(amount), // minor units
    occurred_at: new Date().toISOString().replace(/\.\d+Z$/, 'Z'),
  };
}

// JSON.stringify, except that a BigInt is written as an integer literal, and an unsafe number
// (one that has already lost digits) is refused.
function toJson(value) {
  if (typeof value === 'bigint') {
    if (value < INT64_MIN || value > INT64_MAX) throw new RangeError(`${value} is not a 64-bit integer`);
    return value.toString();
  }
  if (typeof value === 'number' && Number.isInteger(value) && !Number.isSafeInteger(value))
    throw new RangeError(`${value} is beyond 2^53: use a BigInt`);
  if (Array.isArray(value)) return `[${value.map(toJson).join(',')}]`;
  if (value !== null && typeof value === 'object') {
    const fields = Object.entries(value).filter(([, v]) => v !== undefined);
    return `{${fields.map(([k, v]) => `${JSON.stringify(k)}:${toJson(v)}`).join(',')}}`;
  }
  return JSON.stringify(value);
}

const depth = (v) => (v !== null && typeof v === 'object'
  ? 1 + Math.max(0, ...Object.values(v).map(depth)) : 0);

// What idemq would dead-letter a body for (the names of schemas/vectors), or null.
function envelopeError(body) {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) return 'not_map';
  if (!Object.hasOwn(body, 'biz_key')) return 'biz_key_missing';
  const key = body.biz_key;
  if (typeof key !== 'string') return 'biz_key_type';
  if (key === '') return 'biz_key_empty';
  if (Buffer.byteLength(key, 'utf8') > 128) return 'biz_key_too_long'; // bytes, not characters
  if (key.includes('\0')) return 'biz_key_utf8';
  if (depth(body) > 32) return 'too_deep'; // the top-level map is level 1
  return null;
}

async function publish(events, url, exchange, routingKey) {
  const connection = await amqp.connect(url);
  try {
    const channel = await connection.createConfirmChannel();
    let returned = 0;
    channel.on('return', () => { returned += 1; }); // comes before that message's confirm
    for (const event of events) {
      const error = envelopeError(event);
      if (error) throw new Error(`refusing to publish ${event.biz_key}: ${error}`);
      channel.publish(exchange, routingKey, Buffer.from(toJson(event), 'utf8'), {
        persistent: true, mandatory: true, contentType: 'application/json', messageId: event.message_id,
      });
    }
    await channel.waitForConfirms(); // rejects when the broker nacks any of them
    if (returned > 0) throw new Error(`${returned} message(s) were unroutable`);
  } finally {
    await connection.close();
  }
}

// Checks this producer against the shared vectors; returns the number of failures.
function checkVectors(path) {
  const cases = JSON.parse(fs.readFileSync(path, 'utf8'));
  let passed = 0;
  let failed = 0;
  const check = (ok, what) => {
    if (ok) passed += 1;
    else { failed += 1; console.error(`FAIL ${what}`); }
  };
  for (const c of cases.filter((v) => 'body_json' in v)) {
    const got = envelopeError(c.body_json); // our validation agrees with idemq on every map
    const want = c.expect.error ?? null;
    check(got === want && (got !== null || c.body_json.biz_key === c.expect.biz_key),
      `${c.name}: validation says ${got}, idemq says ${JSON.stringify(c.expect)}`);
    if (want === null && typeof c.body_json.order_id === 'string') {
      const key = buildBizKey(c.body_json.order_id, c.body_json.event_type);
      check(key === c.expect.biz_key, `${c.name}: built key ${key}`);
    }
  }
  // Our own encoder: the seed event built by makeEvent reads back as the vector, and a
  // non-ASCII key and the largest amount are written exactly.
  const seed = cases.find((c) => c.name === 'seed_payment_callback/json').body_json;
  const ours = { ...makeEvent(seed.order_id, seed.event_type, seed.amount),
    message_id: seed.message_id, occurred_at: seed.occurred_at };
  check(isDeepStrictEqual(JSON.parse(toJson(ours)), seed), `seed event encodes as ${toJson(ours)}`);
  const big = toJson(makeEvent('订单-café-😀', 'PAY_SUCCESS', INT64_MAX));
  check(big.includes('"amount":9223372036854775807') && envelopeError(JSON.parse(big)) === null
    && JSON.parse(big).biz_key === 'order_id:订单-café-😀:PAY_SUCCESS', `encoding ${big}`);
  console.log(`node check-vectors: ${passed} passed, ${failed} failed`);
  return failed;
}

async function main() {
  const args = process.argv.slice(2);
  const option = (name, env) => (args.includes(name) ? args[args.indexOf(name) + 1] : process.env[env]);
  if (args.includes('--check-vectors')) {
    process.exitCode = checkVectors(option('--check-vectors')) === 0 ? 0 : 1;
    return;
  }
  const routingKey = option('--routing-key', 'AMQP_ROUTING_KEY');
  if (!routingKey) throw new Error('--routing-key (or AMQP_ROUTING_KEY) is required');
  const events = [];
  for await (const line of readline.createInterface({ input: process.stdin })) {
    const fields = line.trim().split(/\s+/);
    if (fields.length === 3) events.push(makeEvent(fields[0], fields[1], fields[2])); // BigInt('...')
    else if (line.trim()) throw new Error(`want ORDER_ID EVENT_TYPE AMOUNT: ${line}`);
  }
  const url = process.env.AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672/%2f';
  await publish(events, url, option('--exchange', 'AMQP_EXCHANGE') ?? '', routingKey);
  console.log(`node: ${events.length} messages confirmed`);
}

main().catch((err) => { console.error(`node: ${err.message}`); process.exitCode = 1; });
