/*
 * fuzz_envelope — libFuzzer target for envelope_decode (JSON, MessagePack, sniffing).
 *
 * Not built by CMake. From the project root:
 *
 *   mkdir -p build-envelope/corpus
 *   /usr/bin/python3 schemas/vectors/gen/gen_vectors.py --corpus build-envelope/corpus
 *   clang -g -O1 -std=c11 -D_DEFAULT_SOURCE -fsanitize=fuzzer,address,undefined \
 *     -fno-sanitize-recover=all -I adapter tests/fuzz/fuzz_envelope.c adapter/envelope/envelope.c \
 *     $(pkg-config --cflags --libs jansson msgpack) -o build-envelope/fuzz_envelope
 *   build-envelope/fuzz_envelope -max_total_time=60 -max_len=8192 build-envelope/corpus
 *
 * Input: the first byte picks the content type (bits 0-1: none, JSON, MessagePack, empty
 * string), the limits (bits 2-3) and the size of the error buffer (bits 4-5); the rest is the
 * body. Besides the sanitizers, it checks the decoder's promises: a known error code with a
 * terminated reason; on success a biz_key of 1..128 bytes without NUL that is the root's own
 * string; and that re-encoding the record as JSON decodes to an equal record, which catches a
 * msgpack conversion that produces a tree JSON cannot carry.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "envelope/envelope.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok)
{
    if (!ok)
        abort();
}

static void check_roundtrip(const envelope *env, const envelope_limits *limits)
{
    char *text = json_dumps(env->root, JSON_COMPACT);
    check(text != NULL);
    envelope again = {0};
    envelope_limits unbounded = {.max_body = SIZE_MAX, .max_depth = limits->max_depth};
    char err[256];
    int rc = envelope_decode(text, strlen(text), "application/json", &unbounded, &again, err,
                             sizeof err);
    check(rc == 0);
    check(json_equal(env->root, again.root));
    check(strcmp(env->biz_key, again.biz_key) == 0);
    envelope_close(&again);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const types[] = {NULL, "application/json", "application/msgpack", ""};
    static const size_t err_lens[] = {512, 7, 1, 0};

    if (size < 1)
        return 0;
    unsigned sel = data[0];
    const uint8_t *body = data + 1;
    size_t len = size - 1;

    envelope_limits limits = {0, 0};
    switch ((sel >> 2) & 3) {
    case 1:
        limits = (envelope_limits){.max_body = 256, .max_depth = 3};
        break;
    case 2:
        limits = (envelope_limits){.max_depth = 64};
        break;
    case 3:
        limits = (envelope_limits){.max_body = len ? len : 1, .max_depth = 1};
        break;
    }

    char errbuf[512];
    size_t err_len = err_lens[(sel >> 4) & 3];
    char *err = err_len ? errbuf : NULL;
    memset(errbuf, 'Z', sizeof errbuf);

    envelope env = {0};
    int rc = envelope_decode(body, len, types[sel & 3], &limits, &env, err, err_len);

    check(rc == ENVELOPE_OK || (rc <= ENVELOPE_E_TOO_LARGE && rc >= ENVELOPE_E_DUPLICATE_KEY));
    check(strcmp(envelope_error_name(rc), "unknown") != 0);
    if (err) {
        check(memchr(errbuf, '\0', err_len) != NULL);
        check(rc == 0 ? errbuf[0] == '\0' : err_len == 1 || errbuf[0] != '\0');
    }
    if (rc < 0) {
        check(env.root == NULL);
        return 0;
    }

    check(json_is_object(env.root));
    const json_t *key = json_object_get(env.root, "biz_key");
    check(env.biz_key != NULL && env.biz_key == json_string_value(key));
    size_t klen = json_string_length(key);
    check(klen >= 1 && klen <= ENVELOPE_BIZ_KEY_MAX && strlen(env.biz_key) == klen);
    check(env.format == ENVELOPE_FORMAT_JSON || env.format == ENVELOPE_FORMAT_MSGPACK);
    check(envelope_field(&env, "biz_key") == key);

    /* a dotted path taken from the input itself */
    char path[33];
    size_t plen = len < sizeof path - 1 ? len : sizeof path - 1;
    memcpy(path, body, plen);
    path[plen] = '\0';
    const json_t *f = envelope_field(&env, path);
    (void)f;

    check_roundtrip(&env, &limits);
    envelope_close(&env);
    check(env.root == NULL);
    return 0;
}
