/*
 * trace_context: the W3C traceparent parser and the child traceparent idemq writes on its emits,
 * as a table of valid and invalid values, and the tracestate rules.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "util/trace_context.h"

#define TID "4bf92f3577b34da6a3ce929d0e0e4736"
#define PID "00f067aa0ba902b7"

static bool parses(const char *text)
{
    trace_context t;
    memset(&t, 0, sizeof t);
    return trace_parent_parse(text, strlen(text), &t);
}

Test(trace_context, valid_values_parse_into_their_parts)
{
    trace_context t;
    memset(&t, 0, sizeof t);
    const char *v = "00-" TID "-" PID "-01";
    cr_assert(trace_parent_parse(v, strlen(v), &t));
    cr_expect_str_eq(t.trace_id, TID);
    cr_expect_str_eq(t.parent_id, PID);
    cr_expect_str_eq(t.flags, "01");

    cr_expect(parses("00-" TID "-" PID "-00"), "not sampled");
    cr_expect(parses("00-" TID "-" PID "-ff"), "unknown flag bits are kept, not refused");
    /* A later version is read by its first 55 bytes, with or without fields after them. */
    cr_expect(parses("01-" TID "-" PID "-01"));
    cr_expect(parses("cc-" TID "-" PID "-01-what-the-future-adds"));
}

Test(trace_context, invalid_values_are_rejected)
{
    static const char *const bad[] = {
        "",
        "00",
        "00-" TID "-" PID "-0",                           /* short flags */
        "00-" TID "-" PID "-011",                         /* version 00 is exactly 55 bytes */
        "00-" TID "-" PID "-01-",                         /* ... no fields after it */
        "00-" TID "0-" PID "-01",                         /* trace id too long */
        "00-4bf92f3577b34da6a3ce929d0e0e473-" PID "-01",  /* trace id too short */
        "00-" TID "-00f067aa0ba902b-01",                  /* parent id too short */
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-" PID "-01", /* uppercase */
        "00-" TID "-00F067AA0BA902B7-01",
        "00-" TID "-" PID "-0A",
        "0A-" TID "-" PID "-01",
        "00-00000000000000000000000000000000-" PID "-01", /* all-zero trace id */
        "00-" TID "-0000000000000000-01",                 /* all-zero parent id */
        "ff-" TID "-" PID "-01",                          /* version ff is forbidden */
        "00_" TID "-" PID "-01",                          /* separators */
        "00-" TID "_" PID "-01",
        "00-" TID "-" PID "_01",
        "00-" TID "-" PID "-0g", /* not hex */
        "00-4bf92f3577b34da6a3ce929d0e0e473g-" PID "-01",
        "01-" TID "-" PID "-01x", /* a later version's extra needs a '-' */
        " 00-" TID "-" PID "-01", /* surrounding blanks */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_expect(!parses(bad[i]), "accepted: \"%s\"", bad[i]);
}

Test(trace_context, a_value_with_a_nul_inside_is_rejected)
{
    char v[] = "00-" TID "-" PID "-01";
    v[10] = '\0';
    trace_context t;
    cr_expect(!trace_parent_parse(v, sizeof v - 1, &t));
}

Test(trace_context, read_and_child_continue_the_trace_with_our_span)
{
    trace_context t;
    const char *tp = "00-" TID "-" PID "-01";
    cr_assert_eq(trace_context_read(&t, tp, strlen(tp), "rojo=00f067aa0ba902b7,congo=t61", 31),
                 TRACE_CONTEXT_VALID);
    cr_expect_str_eq(t.tracestate, "rojo=00f067aa0ba902b7,congo=t61");
    cr_expect_eq(t.tracestate_len, 31);
    char child[TRACE_TRACEPARENT_LEN + 1];
    cr_expect(!trace_context_child(&t, child, sizeof child), "no span yet: no child");
    trace_context_start_span(&t, 0x0123456789abcdefULL);
    cr_expect_str_eq(t.span_id, "0123456789abcdef");
    cr_assert(trace_context_child(&t, child, sizeof child));
    cr_expect_str_eq(child, "00-" TID "-0123456789abcdef-01");
    cr_expect(parses(child), "the child must itself be a valid traceparent");

    /* The flags byte is kept as received, and a later version's child is version 00. */
    tp = "7f-" TID "-" PID "-00-extra";
    cr_assert_eq(trace_context_read(&t, tp, strlen(tp), NULL, 0), TRACE_CONTEXT_VALID);
    trace_context_start_span(&t, 0); /* never the invalid all-zero span id */
    cr_expect_str_neq(t.span_id, "0000000000000000");
    cr_assert(trace_context_child(&t, child, sizeof child));
    cr_expect_eq(strncmp(child, "00-" TID "-", 36), 0);
    cr_expect_str_eq(child + 53, "00");
    cr_expect(parses(child));
}

Test(trace_context, absent_and_invalid_keep_nothing_not_even_tracestate)
{
    trace_context t;
    cr_expect_eq(trace_context_read(&t, NULL, 0, "a=b", 3), TRACE_CONTEXT_ABSENT);
    cr_expect_eq(t.tracestate_len, 0);
    cr_expect_str_eq(t.trace_id, "");
    const char *bad = "00-" TID "-0000000000000000-01";
    cr_expect_eq(trace_context_read(&t, bad, strlen(bad), "a=b", 3), TRACE_CONTEXT_INVALID);
    cr_expect_eq(t.tracestate_len, 0);
    cr_expect_str_eq(t.trace_id, "");
    trace_context_start_span(&t, 42);
    char child[TRACE_TRACEPARENT_LEN + 1];
    cr_expect(!trace_context_child(&t, child, sizeof child));
    cr_expect_str_eq(child, "");
}

Test(trace_context, tracestate_is_copied_cut_at_a_member_or_dropped)
{
    trace_context t;
    const char *tp = "00-" TID "-" PID "-01";
    /* Exactly 512 bytes: unchanged. */
    char state[1200];
    memset(state, 'x', 512);
    memcpy(state, "k=", 2);
    state[512] = '\0';
    trace_context_read(&t, tp, strlen(tp), state, 512);
    cr_expect_eq(t.tracestate_len, 512);

    /* Longer: whole members from the left that fit. */
    size_t n = 0;
    for (int i = 0; i < 60; i++)
        n += (size_t)snprintf(state + n, sizeof state - n, "%svendor%02d=abcdefghij", i ? "," : "",
                              i);
    trace_context_read(&t, tp, strlen(tp), state, n);
    cr_expect_leq(t.tracestate_len, TRACE_TRACESTATE_MAX);
    cr_expect_gt(t.tracestate_len, TRACE_TRACESTATE_MAX - 20);
    cr_expect_eq(memcmp(t.tracestate, state, t.tracestate_len), 0);
    cr_expect_eq(state[t.tracestate_len], ',', "cut inside a member: \"%s\"", t.tracestate);

    /* One member longer than 512: nothing fits. */
    memset(state, 'y', 700);
    memcpy(state, "k=", 2);
    trace_context_read(&t, tp, strlen(tp), state, 700);
    cr_expect_eq(t.tracestate_len, 0);

    /* Control bytes or non-ASCII: not passed on. */
    trace_context_read(&t, tp, strlen(tp), "a=b\nc", 5);
    cr_expect_eq(t.tracestate_len, 0);
    trace_context_read(&t, tp, strlen(tp), "a=\xc3\xa9", 4);
    cr_expect_eq(t.tracestate_len, 0);
}

Test(trace_context, random_span_ids_differ_and_are_never_zero)
{
    uint64_t prev = 0;
    for (int i = 0; i < 1000; i++) {
        uint64_t v = trace_span_id_random();
        cr_assert_neq(v, 0);
        cr_assert_neq(v, prev);
        prev = v;
    }
}

Test(trace_context, trace_id_of_a_header)
{
    char id[TRACE_ID_HEX + 1];
    const char *tp = "00-" TID "-" PID "-01";
    cr_expect(trace_id_of(tp, strlen(tp), id, sizeof id));
    cr_expect_str_eq(id, TID);
    cr_expect(!trace_id_of("00-nope", 7, id, sizeof id));
    cr_expect_str_eq(id, "");
}
