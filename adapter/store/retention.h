/*
 * retention — the background job that deletes expired msg_dedup rows (config `dedup:`).
 *
 * A dedup row only has to outlive every possible redelivery or replay of its message: after
 * that it is dead weight in the unique index every message insert checks. When
 * dedup.retention is set, one thread with its own MySQL connection runs, every dedup.interval,
 *   DELETE FROM msg_dedup WHERE created_at < NOW(3) - INTERVAL ? SECOND ORDER BY created_at LIMIT ?
 * committing after each batch and stopping at the first batch that deletes fewer than
 * dedup.batch rows. The range scan on idx_created_at touches only expired rows, at the old end of
 * the index, far from the rows new messages insert, so each batch holds few locks for a short
 * time; its lock wait timeout is short too, so it yields to business transactions rather than
 * queueing behind them. Every sweep is logged at info (rows deleted, batches, duration); an
 * error is logged as a warning and the next sweep reconnects. Several idemq instances may sweep
 * the same table: they just share the work.
 *
 * With dedup.layout: rotating the same thread instead checks every dedup.interval whether the
 * period is over and rotates the two tables (store/rotation.h); nothing is deleted row by row.
 *
 * Choosing the window: longer than any redelivery (broker requeue after a crash, a lost ack),
 * DLQ replay or producer resend you want deduplicated. A redelivery of a message whose row was
 * already deleted is applied again. Below 1h a warning is logged at startup (tests use seconds).
 *
 * Errors: retention_start returns 0 or -1 with a reason in the caller's err buffer; a failing
 * sweep is logged, never returned.
 * Thread affinity: start/stop on the main (loop) thread; the sweeps run on the job's own thread,
 * which calls mysql_thread_init/mysql_thread_end. The database may be down: the job keeps trying
 * every interval and never affects message processing.
 */
#ifndef IDEMQ_RETENTION_H
#define IDEMQ_RETENTION_H

#include <stddef.h>

#include "config/config.h"

typedef struct retention retention;

/*
 * Starts the job when cfg->dedup.retention_ms > 0; otherwise sets *out to NULL and returns 0.
 * cfg is borrowed and must outlive the job. The first sweep runs at once. Returns 0 with an owned
 * job in *out, or -1 with a reason in err.
 */
int retention_start(const config *cfg, retention **out, char *err, size_t err_len);

/* Wakes the job, waits for the batch in progress (if any) to finish, joins the thread and frees
 * the job. retention_stop(NULL) is a no-op. */
void retention_stop(retention *job);

#endif
