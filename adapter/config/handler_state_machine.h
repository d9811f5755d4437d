/*
 * handler_state_machine — the keys of a state_machine handler and their rules.
 *
 * Table, key and state columns are SQL identifiers (they are pasted into the UPDATE, inside
 * backticks, so only a strict alphabet); fields are dotted paths into the message; each
 * transition is EVENT: {from: [STATE, ...], to: STATE}, with `from` also accepted as a single
 * state. The UPDATE writes the state and `set` columns and filters on the key column, so no two
 * of them may be the same column. Internal to config/. Thread affinity: the loading thread.
 */
#ifndef IDEMQ_CONFIG_HANDLER_STATE_MACHINE_H
#define IDEMQ_CONFIG_HANDLER_STATE_MACHINE_H

#include "config/table.h"

/* The keys of a state_machine handler; the base struct is config_handler. */
extern const opt config_state_machine_table[];

/* Cross-field checks of a walked state_machine handler (base: config_handler). */
void config_validate_state_machine(load_ctx *ctx, yaml_node_t *node, void *base,
                                   const char *path);

#endif
