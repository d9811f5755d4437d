/*
 * freeze_proxy — see freeze_proxy.h.
 *
 * The thread polls a wake-up pipe, the listening socket and every connection pair. A control
 * call changes the requested state under the lock, bumps `requests`, writes a byte to the pipe
 * and waits until the thread has applied that request (`applied`): this is what makes "after
 * freeze returns, nothing more is forwarded" true. While frozen the thread polls the pipe only,
 * so bytes stay wherever they are (client's kernel buffers, the proxy's, the server's).
 */
#include "freeze_proxy.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#define BUFFER_BYTES 65536

typedef struct direction {
    char data[BUFFER_BYTES]; /* read from fd[i], to be written to fd[1 - i] */
    size_t len;
    bool eof;  /* fd[i] said EOF */
    bool shut; /* ... and that EOF was passed on: shutdown(fd[1 - i], SHUT_WR) */
} direction;

typedef struct pair {
    int fd[2]; /* 0: the client's connection, 1: the upstream one */
    bool connecting;
    direction dir[2];
    int slot[2]; /* index of fd[k] in this round's pollfd array, -1: not polled */
} pair;

struct freeze_proxy {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t applied_cond;
    int wake[2];
    unsigned port;

    /* Requested state and statistics, guarded by lock. */
    bool frozen, refuse, stopping;
    bool holding_requests; /* client-to-server bytes stay where they are; replies still flow */
    char host[256];
    unsigned target_port;
    unsigned long drops;    /* drop requests so far */
    unsigned long requests; /* control calls so far */
    unsigned long applied;  /* control calls the thread has applied */
    int listen_rc;          /* result of the last re-listen */
    bool scan_pending;      /* a held-bytes search waits for the thread */
    unsigned char needle[64];
    size_t needle_len;
    bool scan_found;
    char listen_err[256];
    size_t open;
    unsigned long accepted;

    /* The thread's own. */
    int listen_fd;
    pair **pairs;
    size_t count, cap;
    unsigned long drops_done;
};

static int set_nonblocking(int fd)
{
    int flags = fcntl(fd, F_GETFL);
    return flags < 0 ? -1 : fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

/* Closes fd with a reset (RST) instead of an orderly FIN. */
static void close_reset(int fd)
{
    struct linger linger = {.l_onoff = 1, .l_linger = 0};
    if (fd < 0)
        return;
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, sizeof linger);
    close(fd);
}

/* A listening socket on 127.0.0.1:port (0: any). Returns the fd, or -1 with a reason in err. */
static int listen_on(unsigned port, unsigned *bound, char *err, size_t err_len)
{
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
        snprintf(err, err_len, "socket: %s", strerror(errno));
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    socklen_t len = sizeof addr;
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 128) != 0 ||
        getsockname(fd, (struct sockaddr *)&addr, &len) != 0 || set_nonblocking(fd) != 0) {
        snprintf(err, err_len, "listen on 127.0.0.1:%u: %s", port, strerror(errno));
        close(fd);
        return -1;
    }
    if (bound)
        *bound = ntohs(addr.sin_port);
    return fd;
}

/* Starts a non-blocking connect to host:port. Returns the fd (connected or in progress), or -1
 * when it failed at once (nothing listens on a loopback port, the name does not resolve). */
static int connect_upstream(const char *host, unsigned port, bool *in_progress)
{
    char service[16];
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV},
                    *res = NULL;
    snprintf(service, sizeof service, "%u", port);
    if (getaddrinfo(host, service, &hints, &res) != 0)
        return -1;
    int fd = -1;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd < 0)
            continue;
        if (set_nonblocking(fd) == 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            *in_progress = false;
        } else if (errno == EINPROGRESS) {
            *in_progress = true;
        } else {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    return fd;
}

static void remove_pair(freeze_proxy *p, size_t i, bool reset)
{
    pair *c = p->pairs[i];
    for (int k = 0; k < 2; k++) {
        if (reset)
            close_reset(c->fd[k]);
        else
            close(c->fd[k]);
    }
    free(c);
    p->pairs[i] = p->pairs[--p->count];
}

static void accept_all(freeze_proxy *p, const char *host, unsigned port)
{
    for (;;) {
        int client = accept(p->listen_fd, NULL, NULL);
        if (client < 0)
            return; /* EAGAIN, or an error that the next round retries */
        pthread_mutex_lock(&p->lock);
        p->accepted++;
        pthread_mutex_unlock(&p->lock);
        bool in_progress = false;
        int upstream =
            set_nonblocking(client) == 0 ? connect_upstream(host, port, &in_progress) : -1;
        pair *c = upstream >= 0 ? calloc(1, sizeof *c) : NULL;
        if (c && p->count == p->cap) {
            size_t cap = p->cap ? p->cap * 2 : 8;
            pair **grown = realloc(p->pairs, cap * sizeof *grown);
            if (grown) {
                p->pairs = grown;
                p->cap = cap;
            }
        }
        if (!c || p->count == p->cap) {
            free(c);
            close_reset(upstream);
            close_reset(client); /* the target refused: the client learns it at once */
            continue;
        }
        c->fd[0] = client;
        c->fd[1] = upstream;
        c->connecting = in_progress;
        p->pairs[p->count++] = c;
    }
}

/* The poll events pair c wants on fd[k]. Holding requests, the client's socket is not read
 * (what it sent stays in the kernel) and what the proxy already read is not written upstream. */
static short wanted(const pair *c, int k, bool holding_requests)
{
    if (c->connecting)
        return k == 1 ? POLLOUT : 0;
    short events = 0;
    if (!c->dir[k].eof && c->dir[k].len < BUFFER_BYTES && !(holding_requests && k == 0))
        events |= POLLIN;
    if (c->dir[1 - k].len > 0 && !(holding_requests && k == 1))
        events |= POLLOUT;
    return events;
}

/* Moves what poll said is possible. Returns false when the pair is finished (both directions
 * passed their EOF on) or broken (then reset is set). */
static bool service_pair(pair *c, const struct pollfd *fds, bool *reset)
{
    *reset = false;
    if (c->connecting) {
        if (c->slot[1] < 0 || !fds[c->slot[1]].revents)
            return true;
        int error = 0;
        socklen_t len = sizeof error;
        if (getsockopt(c->fd[1], SOL_SOCKET, SO_ERROR, &error, &len) != 0 || error != 0) {
            *reset = true;
            return false;
        }
        c->connecting = false;
        return true;
    }
    for (int k = 0; k < 2; k++) {
        if (c->slot[k] < 0 || !fds[c->slot[k]].revents)
            continue;
        short events = fds[c->slot[k]].events;
        direction *in = &c->dir[k], *out = &c->dir[1 - k];
        if (events & POLLIN) {
            ssize_t n = recv(c->fd[k], in->data + in->len, BUFFER_BYTES - in->len, 0);
            if (n > 0)
                in->len += (size_t)n;
            else if (n == 0)
                in->eof = true;
            else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                *reset = true;
                return false;
            }
        }
        if (events & POLLOUT) {
            ssize_t n = send(c->fd[k], out->data, out->len, MSG_NOSIGNAL);
            if (n > 0) {
                memmove(out->data, out->data + n, out->len - (size_t)n);
                out->len -= (size_t)n;
            } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                *reset = true;
                return false;
            }
        }
    }
    for (int k = 0; k < 2; k++) {
        direction *d = &c->dir[k];
        if (d->eof && d->len == 0 && !d->shut) {
            shutdown(c->fd[1 - k], SHUT_WR);
            d->shut = true;
        }
    }
    return !(c->dir[0].shut && c->dir[1].shut);
}

/* Whether what the client of c sent and the proxy holds (its unforwarded buffer, then the
 * kernel's unread bytes, peeked) contains the needle. Runs on the proxy's thread, which owns
 * the pairs. */
static bool held_contains(const pair *c, const unsigned char *needle, size_t needle_len)
{
    int unread = 0;
    if (c->connecting || ioctl(c->fd[0], FIONREAD, &unread) != 0 || unread < 0)
        unread = 0;
    size_t total = c->dir[0].len + (size_t)unread;
    unsigned char *held = malloc(total ? total : 1);
    if (!held)
        return false;
    memcpy(held, c->dir[0].data, c->dir[0].len);
    size_t have = c->dir[0].len;
    if (unread > 0) {
        ssize_t n = recv(c->fd[0], held + have, (size_t)unread, MSG_PEEK | MSG_DONTWAIT);
        if (n > 0)
            have += (size_t)n;
    }
    bool found = false;
    for (size_t i = 0; !found && i + needle_len <= have; i++)
        found = memcmp(held + i, needle, needle_len) == 0;
    free(held);
    return found;
}

static void *proxy_main(void *arg)
{
    freeze_proxy *p = arg;
    struct pollfd *fds = NULL;
    size_t fds_cap = 0;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        bool frozen = p->frozen, refuse = p->refuse, stopping = p->stopping;
        bool holding_requests = p->holding_requests;
        unsigned long drops = p->drops, request = p->requests;
        char host[sizeof p->host];
        memcpy(host, p->host, sizeof host);
        unsigned target_port = p->target_port;
        bool scan = p->scan_pending;
        pthread_mutex_unlock(&p->lock);

        bool found = false;
        for (size_t i = 0; scan && !found && i < p->count; i++)
            found = held_contains(p->pairs[i], p->needle, p->needle_len);

        if (drops != p->drops_done) {
            while (p->count)
                remove_pair(p, p->count - 1, true);
            p->drops_done = drops;
        }
        int listen_rc = 0;
        char listen_err[256] = "";
        if (refuse && p->listen_fd >= 0) {
            close(p->listen_fd);
            p->listen_fd = -1;
        } else if (!refuse && p->listen_fd < 0) {
            p->listen_fd = listen_on(p->port, NULL, listen_err, sizeof listen_err);
            listen_rc = p->listen_fd < 0 ? -1 : 0;
        }
        pthread_mutex_lock(&p->lock);
        if (p->applied != request) {
            p->listen_rc = listen_rc;
            memcpy(p->listen_err, listen_err, sizeof listen_err);
        }
        if (scan) {
            p->scan_found = found;
            p->scan_pending = false;
        }
        p->applied = request;
        p->open = p->count;
        pthread_cond_broadcast(&p->applied_cond);
        pthread_mutex_unlock(&p->lock);
        if (stopping)
            break;

        size_t need = 2 + 2 * p->count;
        if (need > fds_cap) {
            struct pollfd *grown = realloc(fds, need * sizeof *fds);
            if (!grown) {
                poll(NULL, 0, 10); /* out of memory: try again shortly */
                continue;
            }
            fds = grown;
            fds_cap = need;
        }
        size_t n = 0;
        fds[n++] = (struct pollfd){.fd = p->wake[0], .events = POLLIN};
        int listen_slot = -1;
        if (!frozen && p->listen_fd >= 0) {
            listen_slot = (int)n;
            fds[n++] = (struct pollfd){.fd = p->listen_fd, .events = POLLIN};
        }
        for (size_t i = 0; i < p->count; i++) {
            pair *c = p->pairs[i];
            for (int k = 0; k < 2; k++) {
                short events = frozen ? 0 : wanted(c, k, holding_requests);
                c->slot[k] = events ? (int)n : -1;
                if (events)
                    fds[n++] = (struct pollfd){.fd = c->fd[k], .events = events};
            }
        }
        if (poll(fds, (nfds_t)n, -1) < 0)
            continue; /* EINTR */
        if (fds[0].revents) {
            char drain[64];
            while (read(p->wake[0], drain, sizeof drain) > 0)
                ;
        }
        if (frozen)
            continue;
        /* Pairs first: accept_all appends pairs that have no slot in this round. */
        for (size_t i = p->count; i-- > 0;) {
            bool reset;
            if (!service_pair(p->pairs[i], fds, &reset))
                remove_pair(p, i, reset);
        }
        if (listen_slot >= 0 && fds[listen_slot].revents)
            accept_all(p, host, target_port);
    }
    free(fds);
    return NULL;
}

/* Applies change under the lock, wakes the thread and waits until it has applied it. */
static void request(freeze_proxy *p, void (*change)(freeze_proxy *p, const void *arg),
                    const void *arg)
{
    pthread_mutex_lock(&p->lock);
    change(p, arg);
    unsigned long mine = ++p->requests;
    pthread_mutex_unlock(&p->lock);
    char byte = 1;
    while (write(p->wake[1], &byte, 1) < 0 && errno == EINTR)
        ;
    pthread_mutex_lock(&p->lock);
    while (p->applied < mine)
        pthread_cond_wait(&p->applied_cond, &p->lock);
    pthread_mutex_unlock(&p->lock);
}

static void set_frozen(freeze_proxy *p, const void *arg)
{
    p->frozen = *(const bool *)arg;
}

static void set_holding_requests(freeze_proxy *p, const void *arg)
{
    p->holding_requests = *(const bool *)arg;
}

static void set_refuse(freeze_proxy *p, const void *arg)
{
    p->refuse = *(const bool *)arg;
}

static void add_drop(freeze_proxy *p, const void *arg)
{
    (void)arg;
    p->drops++;
}

static void set_stopping(freeze_proxy *p, const void *arg)
{
    (void)arg;
    p->stopping = true;
}

typedef struct target {
    const char *host;
    unsigned port;
} target;

static void set_target(freeze_proxy *p, const void *arg)
{
    const target *t = arg;
    snprintf(p->host, sizeof p->host, "%s", t->host);
    p->target_port = t->port;
}

int freeze_proxy_start(const char *target_host, unsigned target_port, freeze_proxy **out, char *err,
                       size_t err_len)
{
    *out = NULL;
    freeze_proxy *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    p->wake[0] = p->wake[1] = -1;
    snprintf(p->host, sizeof p->host, "%s", target_host);
    p->target_port = target_port;
    p->listen_fd = listen_on(0, &p->port, err, err_len);
    if (p->listen_fd < 0)
        goto fail;
    if (pipe(p->wake) != 0 || set_nonblocking(p->wake[0]) != 0) {
        snprintf(err, err_len, "pipe: %s", strerror(errno));
        goto fail;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->applied_cond, NULL);
    int rc = pthread_create(&p->thread, NULL, proxy_main, p);
    if (rc != 0) {
        snprintf(err, err_len, "pthread_create: %s", strerror(rc));
        pthread_cond_destroy(&p->applied_cond);
        pthread_mutex_destroy(&p->lock);
        goto fail;
    }
    *out = p;
    return 0;
fail:
    if (p->listen_fd >= 0)
        close(p->listen_fd);
    if (p->wake[0] >= 0) {
        close(p->wake[0]);
        close(p->wake[1]);
    }
    free(p);
    return -1;
}

unsigned freeze_proxy_port(const freeze_proxy *p)
{
    return p->port;
}

void freeze_proxy_freeze(freeze_proxy *p)
{
    bool yes = true;
    request(p, set_frozen, &yes);
}

void freeze_proxy_thaw(freeze_proxy *p)
{
    bool no = false;
    request(p, set_frozen, &no);
}

void freeze_proxy_hold_requests(freeze_proxy *p, bool hold)
{
    request(p, set_holding_requests, &hold);
}

typedef struct held_search {
    const void *needle;
    size_t len;
} held_search;

static void set_scan(freeze_proxy *p, const void *arg)
{
    const held_search *search = arg;
    memcpy(p->needle, search->needle, search->len);
    p->needle_len = search->len;
    p->scan_pending = true;
}

bool freeze_proxy_held_requests_contain(freeze_proxy *p, const void *needle, size_t needle_len)
{
    if (needle_len == 0 || needle_len > sizeof p->needle)
        return false;
    held_search search = {needle, needle_len};
    request(p, set_scan, &search);
    pthread_mutex_lock(&p->lock);
    bool found = p->scan_found;
    pthread_mutex_unlock(&p->lock);
    return found;
}

void freeze_proxy_drop(freeze_proxy *p)
{
    request(p, add_drop, NULL);
}

void freeze_proxy_set_target(freeze_proxy *p, const char *host, unsigned port)
{
    target t = {.host = host, .port = port};
    request(p, set_target, &t);
}

int freeze_proxy_refuse(freeze_proxy *p, bool refuse, char *err, size_t err_len)
{
    request(p, set_refuse, &refuse);
    pthread_mutex_lock(&p->lock);
    int rc = p->listen_rc;
    if (rc != 0)
        snprintf(err, err_len, "%s", p->listen_err);
    pthread_mutex_unlock(&p->lock);
    return rc;
}

size_t freeze_proxy_connections(freeze_proxy *p)
{
    pthread_mutex_lock(&p->lock);
    size_t open = p->open;
    pthread_mutex_unlock(&p->lock);
    return open;
}

unsigned long freeze_proxy_accepted(freeze_proxy *p)
{
    pthread_mutex_lock(&p->lock);
    unsigned long accepted = p->accepted;
    pthread_mutex_unlock(&p->lock);
    return accepted;
}

void freeze_proxy_free(freeze_proxy *p)
{
    if (!p)
        return;
    request(p, set_stopping, NULL);
    pthread_join(p->thread, NULL);
    while (p->count)
        remove_pair(p, p->count - 1, false);
    free(p->pairs);
    if (p->listen_fd >= 0)
        close(p->listen_fd);
    close(p->wake[0]);
    close(p->wake[1]);
    pthread_cond_destroy(&p->applied_cond);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
