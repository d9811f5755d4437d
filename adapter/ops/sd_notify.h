/*
 * sd_notify — tells the service manager (systemd's Type=notify) when idemq is ready and when it
 * stops, without linking libsystemd.
 *
 * The protocol is one datagram of "KEY=value" lines to the AF_UNIX socket named by
 * $NOTIFY_SOCKET: a path, or an abstract name when it starts with '@'. Without $NOTIFY_SOCKET
 * nothing is sent (idemq started by hand, by a container runtime, by a test). A failed send is
 * logged once and never stops the run: the service manager's own timeout reports a start that
 * never became ready. Thread affinity: the thread that owns the notifier (the loop thread).
 */
#ifndef IDEMQ_OPS_SD_NOTIFY_H
#define IDEMQ_OPS_SD_NOTIFY_H

#include <stdbool.h>
#include <sys/socket.h>
#include <sys/un.h>

typedef struct sd_notify {
    int fd; /* -1 when disabled */
    struct sockaddr_un addr;
    socklen_t addr_len;
    bool failure_logged; /* a failed send is logged once, not at every state change */
} sd_notify;

/* Reads $NOTIFY_SOCKET into n (caller-owned storage). Returns 0 also when it is unset (n is then
 * disabled and every send a no-op), -1 when it is set but unusable (not a path or '@' name, too
 * long, or no socket could be made: err says why, n is disabled). Either way sd_notify_close
 * must be called. */
int sd_notify_init(sd_notify *n, char *err, size_t err_len);

/* Whether init found a usable $NOTIFY_SOCKET. */
bool sd_notify_enabled(const sd_notify *n);

/* Sends state (borrowed: "READY=1", "STOPPING=1", "STATUS=…", several separated by '\n') as one
 * datagram. Returns 0 (also when disabled), or -errno of the failed send, which is logged the
 * first time only. */
int sd_notify_send(sd_notify *n, const char *state);

/* Closes the socket; n is disabled afterwards. Safe to call twice. */
void sd_notify_close(sd_notify *n);

#endif
