#include "ops/sd_notify.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ops/log.h"

int sd_notify_init(sd_notify *n, char *err, size_t err_len)
{
    memset(n, 0, sizeof *n);
    n->fd = -1;
    const char *name = getenv("NOTIFY_SOCKET");
    if (!name || !name[0])
        return 0;
    size_t len = strlen(name);
    if (name[0] != '/' && name[0] != '@') {
        /* systemd 256 added vsock: addresses, for virtual machines; idemq runs on the host. */
        if (err_len)
            snprintf(err, err_len, "NOTIFY_SOCKET=%s: not a socket path or @abstract name", name);
        return -1;
    }
    if (len > sizeof n->addr.sun_path - (name[0] == '/' ? 1 : 0)) {
        if (err_len)
            snprintf(err, err_len,
                     "NOTIFY_SOCKET is %zu bytes long, more than a unix socket address holds", len);
        return -1;
    }
    n->addr.sun_family = AF_UNIX;
    memcpy(n->addr.sun_path, name, len);
    if (name[0] == '@') {
        /* An abstract name is its bytes after a NUL, with no terminator: the length says where it
         * ends, so a trailing NUL would name a different socket. */
        n->addr.sun_path[0] = '\0';
        n->addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
    } else {
        n->addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + 1);
    }
    n->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (n->fd < 0) {
        if (err_len)
            snprintf(err, err_len, "NOTIFY_SOCKET: cannot make a datagram socket: %s",
                     strerror(errno));
        return -1;
    }
    return 0;
}

bool sd_notify_enabled(const sd_notify *n)
{
    return n->fd >= 0;
}

int sd_notify_send(sd_notify *n, const char *state)
{
    if (n->fd < 0)
        return 0;
    size_t len = strlen(state);
    ssize_t sent;
    do
        sent =
            sendto(n->fd, state, len, MSG_NOSIGNAL, (const struct sockaddr *)&n->addr, n->addr_len);
    while (sent < 0 && errno == EINTR);
    if (sent == (ssize_t)len)
        return 0;
    int rc = sent < 0 ? -errno : -EMSGSIZE;
    if (!n->failure_logged) {
        n->failure_logged = true;
        log_warn(LOG_NO_CONTEXT,
                 "cannot notify the service manager (NOTIFY_SOCKET): %s; carrying on without "
                 "(this is logged once)",
                 strerror(-rc));
    }
    return rc;
}

void sd_notify_close(sd_notify *n)
{
    if (n->fd >= 0)
        close(n->fd);
    n->fd = -1;
}
