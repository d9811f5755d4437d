/*
 * nodes — which node of a database cluster idemq works on, and whether a node may take writes.
 *
 * With mysql.urls (db_dsn's other_nodes) db_connect tries the nodes in order, starting from the
 * one the process last connected to, and keeps only a node that takes writes: read_only and
 * (MySQL) super_read_only off, and on a Galera node (MariaDB, wsrep_on) wsrep_ready ON in the
 * Primary component. A node that is lost, read-only or outside the primary component is passed
 * over; every part of idemq that connects (the DB workers, the health probe, the retention job,
 * the outbox relay) goes through db_connect, so they all converge on the node that works.
 * One cluster per process: the node in use is process-wide state, so /readyz, the logs and the
 * idemq_mysql_node metric name one node.
 *
 * Errors: db_node_check_writable returns 0, or a MySQL error number with the reason in err
 * (util/errors.h's buffer rule). Thread affinity: any thread (the state is locked).
 */
#ifndef IDEMQ_DB_NODES_H
#define IDEMQ_DB_NODES_H

#include <mysql.h>
#include <stddef.h>
#include <stdint.h>

#include "db/dsn.h"

/* The error numbers db_node_check_writable gives a node that is up but must not take writes;
 * both classify as APPLY_UNAVAILABLE (db/error.h): pause, do not spend a retry. */
#define DB_NODE_READ_ONLY 1290u /* ER_OPTION_PREVENTS_STATEMENT, what a write there would get */
#define DB_NODE_NOT_READY 1047u /* ER_UNKNOWN_COM_ERROR, Galera's "not prepared for use" */

/* 0 when db (borrowed, autocommit off) may take writes; otherwise DB_NODE_READ_ONLY,
 * DB_NODE_NOT_READY or the error number of the query that failed, with the reason in err.
 * Ends the read's transaction. */
unsigned db_node_check_writable(MYSQL *db, char *err, size_t err_len);

/* The node of dsn to try first: the one the process last connected to when it is one of dsn's
 * nodes, else 0. */
size_t db_nodes_first(const db_dsn *dsn);

/* Records that a connection to node i of dsn (borrowed) works; logs when the node in use
 * changes (a failover). */
void db_nodes_connected(const db_dsn *dsn, size_t i);

/* The node in use, "host:port" or a socket path; "" before the first connection. */
void db_nodes_current(char *buf, size_t len);

/* How many times the node in use changed since the process started. */
uint64_t db_nodes_failovers(void);

/* Counts one COMMIT a cluster refused for a conflict with another node's write; the count since
 * the process started. */
void db_nodes_count_conflict(void);
uint64_t db_nodes_conflicts(void);

#endif
