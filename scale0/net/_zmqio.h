/*
 * What scale0/net/_zmqio.c shares with scale0/net/_lane.c, the two sources of the extension
 * scale0.net._zmqio: the libzmq calls (resolved at import from pyzmq's libzmq, see _zmqio.c's
 * header comment), the frame helpers, and the plain-HEARTBEAT options parser, all plain C that
 * needs no GIL.
 */
#ifndef S0_ZMQIO_H
#define S0_ZMQIO_H

#include <stddef.h>
#include <stdint.h>

#define S0_HIDDEN __attribute__((visibility("hidden")))

#define S0_ZMQ_DONTWAIT 1
#define S0_ZMQ_SNDMORE 2
#define S0_ZMQ_SRCFD 2
#define S0_ZMQ_POLLIN 1
#define S0_ZMQ_POLLOUT 2

typedef struct {
    unsigned char _[64];
} __attribute__((aligned(sizeof(void *)))) s0_zmq_msg_t;

/* libzmq's zmq_pollitem_t on POSIX. */
typedef struct {
    void *socket;
    int fd;
    short events;
    short revents;
} s0_zmq_pollitem_t;

S0_HIDDEN extern int (*p_msg_init)(s0_zmq_msg_t *);
S0_HIDDEN extern int (*p_msg_recv)(s0_zmq_msg_t *, void *, int);
S0_HIDDEN extern int (*p_msg_send)(s0_zmq_msg_t *, void *, int);
S0_HIDDEN extern void *(*p_msg_data)(s0_zmq_msg_t *);
S0_HIDDEN extern size_t (*p_msg_size)(const s0_zmq_msg_t *);
S0_HIDDEN extern int (*p_msg_more)(const s0_zmq_msg_t *);
S0_HIDDEN extern int (*p_msg_close)(s0_zmq_msg_t *);
S0_HIDDEN extern int (*p_msg_copy)(s0_zmq_msg_t *, s0_zmq_msg_t *);
S0_HIDDEN extern int (*p_msg_get)(const s0_zmq_msg_t *, int);
S0_HIDDEN extern const char *(*p_msg_gets)(const s0_zmq_msg_t *, const char *);
S0_HIDDEN extern int (*p_send)(void *, const void *, size_t, int);
S0_HIDDEN extern int (*p_poll)(s0_zmq_pollitem_t *, int, long);
S0_HIDDEN extern int (*p_errno)(void);

/* One frame without blocking, EINTR retried: 0, or the errno (see _zmqio.c). */
S0_HIDDEN int recv_frame(void *sock, s0_zmq_msg_t *msg);
S0_HIDDEN int send_frame(void *sock, const char *buf, size_t len, int flags);

/* The options frame of a plain HEARTBEAT (scale0/wire/hot.py heartbeat_fields): 1 with *time,
 * *version and *promise (0: no interval_ms) set; 0 if it is not that form or the time is not
 * finite. No GIL, no allocation, locale-independent. */
S0_HIDDEN int s0_beat_options(const char *p, size_t size, double *time, long long *version,
                              long long *promise);

/* The Lane type (scale0/net/_lane.c) added to the module: 0, or -1 with an exception. */
S0_HIDDEN int s0_lane_add(void *module);

#endif
