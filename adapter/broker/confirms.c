/*
 * confirms — see confirms.h. A singly linked list in publish order: the broker confirms in
 * order too, so resolving walks only the head. Thread affinity: the connection's thread.
 */
#include "broker/confirms.h"

#include <stdlib.h>

#include "broker/connection.h"

struct broker_pending_confirm {
    broker_pending_confirm *next;
    uint64_t seq;
    bool returned;
    broker_confirm_cb cb;
    void *arg;
};

void broker_confirms_init(broker_confirms *c)
{
    *c = (broker_confirms){.next_seq = 1};
}

int broker_confirms_push(broker_confirms *c, broker_confirm_cb cb, void *arg, uint64_t *seq)
{
    broker_pending_confirm *pc = calloc(1, sizeof *pc);
    if (!pc)
        return BROKER_E_FAILED;
    pc->seq = c->next_seq++;
    pc->cb = cb;
    pc->arg = arg;
    if (c->tail)
        c->tail->next = pc;
    else
        c->head = pc;
    c->tail = pc;
    c->pending++;
    *seq = pc->seq;
    return 0;
}

void broker_confirms_cancel_last(broker_confirms *c)
{
    broker_pending_confirm *last = c->tail, *prev = NULL;
    if (!last)
        return;
    for (broker_pending_confirm *pc = c->head; pc != last; pc = pc->next)
        prev = pc; /* a failure path, and the list is at most prefetch long */
    if (prev)
        prev->next = NULL;
    else
        c->head = NULL;
    c->tail = prev;
    c->pending--;
    c->next_seq = last->seq;
    free(last);
}

void broker_confirms_resolve(broker_confirms *c, uint64_t tag, bool multiple, bool acked)
{
    broker_pending_confirm **link = &c->head;
    broker_pending_confirm *prev = NULL;
    while (*link) {
        broker_pending_confirm *pc = *link;
        if (pc->seq > tag)
            break;
        if (multiple || pc->seq == tag) {
            *link = pc->next;
            if (c->tail == pc)
                c->tail = prev;
            c->pending--;
            pc->cb(pc->arg, acked && !pc->returned);
            free(pc);
            if (!multiple)
                break;
        } else {
            prev = pc;
            link = &pc->next;
        }
    }
}

void broker_confirms_mark_returned(broker_confirms *c, uint64_t seq)
{
    for (broker_pending_confirm *pc = c->head; pc; pc = pc->next)
        if (pc->seq == seq)
            pc->returned = true;
}

void broker_confirms_fail_all(broker_confirms *c)
{
    broker_pending_confirm *pc = c->head;
    broker_confirms_init(c);
    while (pc) {
        broker_pending_confirm *next = pc->next;
        pc->cb(pc->arg, false);
        free(pc);
        pc = next;
    }
}
