/*
 * state_machine — the handler that applies a declarative transition table to one row with one
 * guarded UPDATE, or to a batch's rows with one locked read and one multi-row UPDATE (design in
 * state_machine.c).
 * Errors: see handlers/handler.h. Thread affinity: the DB worker owning call->db.
 */
#ifndef IDEMQ_HANDLERS_STATE_MACHINE_H
#define IDEMQ_HANDLERS_STATE_MACHINE_H

#include "handlers/handler.h"

/* handler_apply, handler_prepare_all and handler_release for type: state_machine. */
apply_status state_machine_apply(handler_call *call);
apply_status state_machine_apply_batch(handler_call *call, handler_batch_item *items, size_t n);
apply_status state_machine_prepare_all(handler_call *call);
void state_machine_release(const config_consumer *consumer, void *state);

#endif
