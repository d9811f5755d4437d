/*
 * freeze_proxy — a loopback TCP proxy a test controls, to give a real server the faults the
 * shared services must never get (they are shared: no SIGSTOP, no restart, no reconfiguring).
 * It listens on 127.0.0.1 at an ephemeral port and forwards every connection it accepts to a
 * target host:port (MariaDB, RabbitMQ, anything TCP). Point the code under test at
 * 127.0.0.1:freeze_proxy_port() instead of the server, then:
 *   freeze   stop forwarding in both directions and stop accepting, but keep every connection
 *            open: what a SIGSTOPped server, or a network that silently drops packets, looks like
 *            to a client (connects still complete in the kernel's backlog; no byte comes back;
 *            a client that hangs up is not noticed until the thaw);
 *   thaw     carry on where the freeze stopped, nothing lost (bytes held in the proxy's buffers
 *            and the kernel's are delivered);
 *   hold requests  stop forwarding what clients send while the server's bytes still reach
 *            them: a client whose every write is lost on the way (its acks never reach a
 *            broker, which keeps delivering up to its prefetch);
 *   drop     reset every open connection (RST to both sides): a crashed server, a reset network;
 *            new connections are accepted as before;
 *   target   send new connections elsewhere, e.g. to a closed port (the server is down: the
 *            client sees its connection reset right after the connect) and back again;
 *   refuse   close the listening socket, so a connect is refused (ECONNREFUSED) as when nothing
 *            listens at all; refuse(false) listens again on the same port.
 * Every control call returns after the proxy thread has applied it: once freeze_proxy_freeze
 * returns, not one more byte is forwarded.
 *
 * One thread per proxy, with poll(2) over non-blocking sockets: it forwards, the test's thread
 * only asks. A connection whose upstream connect fails is reset, so the client sees the failure
 * at once rather than an open socket that never answers.
 *
 * Errors: freeze_proxy_start and freeze_proxy_refuse return 0 or -1 with a reason in err; the
 * other calls cannot fail. Test-only code. Thread affinity: every call from any one thread at a
 * time (the test's); the proxy's own work runs on its thread. freeze_proxy_free joins it.
 */
#ifndef IDEMQ_TEST_FREEZE_PROXY_H
#define IDEMQ_TEST_FREEZE_PROXY_H

#include <stdbool.h>
#include <stddef.h>

typedef struct freeze_proxy freeze_proxy;

/* Starts a proxy to target_host:target_port (borrowed; a numeric address, or a name looked up at
 * each connection: its first address that does not refuse at once is used, so prefer numeric)
 * on 127.0.0.1 at an ephemeral port. Returns 0 with the owned proxy in *out, or
 * -1 with a reason in err (socket, bind, thread). */
int freeze_proxy_start(const char *target_host, unsigned target_port, freeze_proxy **out, char *err,
                       size_t err_len);

/* The port it listens on (127.0.0.1). */
unsigned freeze_proxy_port(const freeze_proxy *p);

/* Stops forwarding and accepting; connections stay open. Idempotent. */
void freeze_proxy_freeze(freeze_proxy *p);

/* Forwards and accepts again. Idempotent. */
void freeze_proxy_thaw(freeze_proxy *p);

/* hold: client-to-server bytes stop where they are (unread in the kernel or in the proxy's
 * buffer) while server-to-client bytes still flow; !hold: they flow again, nothing lost.
 * Idempotent; independent of freeze. */
void freeze_proxy_hold_requests(freeze_proxy *p, bool hold);

/* Whether the client-to-server bytes held back now (what the proxy read but has not forwarded,
 * and what waits unread in the kernel) contain needle (borrowed; 1..64 bytes) on any
 * connection. Lets a test wait for a client's write that is known to be held, e.g. an ack. */
bool freeze_proxy_held_requests_contain(freeze_proxy *p, const void *needle, size_t needle_len);

/* Resets (RST) every connection open now, frozen or not. */
void freeze_proxy_drop(freeze_proxy *p);

/* Connections accepted from now on go to host:port (host borrowed, copied). Open ones stay
 * where they are. */
void freeze_proxy_set_target(freeze_proxy *p, const char *host, unsigned port);

/* refuse: closes the listening socket (connects are refused; connections already accepted
 * go on). !refuse: listens again on the same port. Returns 0, or -1 with a reason in err when
 * the port cannot be bound again (another socket took it meanwhile). */
int freeze_proxy_refuse(freeze_proxy *p, bool refuse, char *err, size_t err_len);

/* Connections open now (accepted and not yet closed on both sides). */
size_t freeze_proxy_connections(freeze_proxy *p);

/* Connections accepted since the start. */
unsigned long freeze_proxy_accepted(freeze_proxy *p);

/* Stops the thread, closes every connection (an orderly close, not a reset) and frees p.
 * NULL is a no-op. */
void freeze_proxy_free(freeze_proxy *p);

#endif
