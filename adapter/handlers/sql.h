/*
 * sql — the handler that runs the consumer's configured statements, with :field placeholders
 * bound as parameters, in order (design in sql.c).
 * Errors: see handlers/handler.h. Thread affinity: the DB worker owning call->db.
 */
#ifndef IDEMQ_HANDLERS_SQL_H
#define IDEMQ_HANDLERS_SQL_H

#include "handlers/handler.h"

/* handler_apply, handler_prepare_all and handler_release for type: sql. */
apply_status sql_handler_apply(handler_call *call);
apply_status sql_handler_prepare_all(handler_call *call);
void sql_handler_release(const config_consumer *consumer, void *state);

#endif
