/*
 * scale0.net._zmqio.Lane: a C thread that owns the broker's frontend and backend ROUTER sockets
 * and takes plain HEARTBEATs, S0P and Majordomo workers', without waking Python (phase 3a of
 * the C lane, docs/architecture.md
 * "Decided, being built: the data plane moves to a C lane"; issue 14).
 *
 *   Lane(frontend, backend, front_pipe, back_pipe, keyed_front, keyed_back, max_frame_bytes)
 *       handles: pyzmq Socket.underlying ints. front_pipe/back_pipe: the lane's ends of two
 *       inproc PAIR pipes whose other ends Python keeps. From start() until stop() returns the
 *       lane thread is the only user of these four sockets.
 *   start()                     spawn the thread (once)
 *   stop()                      idempotent: wake the thread (an eventfd in its poll set), join
 *       it with the GIL released. Before it exits the thread forwards everything waiting on both
 *       pipes to the ROUTERs (Python's last sends).
 *   configure(config_version, max_skew_s)
 *   note(channel, routing_id, promise_ms, gap_s, last_seen, majordomo=False)   insert or
 *       update a session; last_seen only ever raises the entry's; gap_s 0 or inf: no gap
 *       check; majordomo: it speaks Majordomo (the core's Majordomo.speaks)
 *   forget(channel, routing_id); clear()
 *   negotiated(channel, fd); gone(channel, fd)                 R20: the negotiated connections
 *   heard() -> [(channel, routing_id, last_seen)]   the entries a HEARTBEAT taken by the lane
 *       raised since the last call, once each, by last_seen ascending
 *   last_seen(channel, routing_id) -> float | None
 *   stats() -> dict[str, int]   wakeups, received (from the ROUTERs), beats (taken), passed (to
 *       Python), sent (Python's, to the ROUTERs), send_dropped (of those, and of answers, that
 *       libzmq refused), answers, stalled (a pipe was full), lost (held at stop, or out of
 *       memory), errors (socket errors), marks (Python's "done" marks, see "Order"). After
 *       stop(): received == beats + passed + lost.
 *
 * Channels: 0 = frontend (S0C1), 1 = backend (S0W1).
 *
 * ROUTER -> Python: a message the lane does not take goes to its channel's pipe as [header,
 * routing id, frames...], every frame as received (zmq_msg_send: zero-copy), in order. header:
 * 4 bytes little-endian int32, the connection's fd (ZMQ_SRCFD of the first frame, -1 if none),
 * then, on a keyed channel, the sender's User-Id (zmq_msg_gets) as UTF-8 bytes ("" when none
 * or not UTF-8: recv_batch_keyed's key).
 * Python -> ROUTER: [routing id, frames...] written to a pipe is sent to that channel's ROUTER
 * unchanged (DONTWAIT; a failure is counted in send_dropped). Each wake-up forwards Python's
 * sends before it reads the ROUTERs.
 *
 * The take rule (the fast path of scale0.core.sessions.Sessions.heard_many, its twin): the lane
 * takes a message iff it is exactly [rid, b"", signature, b"HEARTBEAT", options], the options
 * at most max_frame_bytes and read by s0_beat_options, the session table has (channel, rid) and
 * it does not speak Majordomo (the core would note it speaks S0P now), its
 * fd is < 0 or negotiated on the channel, not |time - wall| > max_skew_s, config_version >= the
 * configured one, interval_ms == the entry's promise_ms, and (backend only) not now - the
 * entry's previous last_seen > gap_s (gap_s 0 or inf: no check), and, once Python marks what it
 * has done, no message of the peer still in Python's hands ("Order" below). Before configure()
 * nothing is taken. A frontend beat taken is answered at once: [rid, b"", S0C1, b"HEARTBEAT",
 * {"time":<wall>,"config_version":<configured>[,"interval_ms":<promise_ms>]}], as
 * scale0.wire.client.Heartbeat.to_frames writes it. Every message whose rid has an entry raises
 * its last_seen to now (max), whatever it is.
 *
 * A Majordomo worker's HEARTBEAT (the twin of scale0.core.majordomo.Majordomo.worker_heartbeat,
 * which for a worker with a session only marks it seen: no answer, no skew, version, promise or
 * gap check, whatever protocol the session speaks): on the backend, after configure(), the lane
 * also takes a message iff it is exactly [rid, b"", b"MDPW01", 0x04], [rid, b"", b"MDPW02",
 * 0x05] (majortomo's worker too) or 18/MDP's undelimited [rid, b"MDPW02", 0x05] (every form
 * scale0.wire.registry decodes to MdpWorkerHeartbeat, so max_frame_bytes >= 6), the session
 * table has (1, rid), its fd is < 0 or negotiated, and "Order" allows it. Not answered.
 *
 * Order (optional, on once Python sends its first mark). A message of exactly one 8-byte frame
 * that Python writes to a pipe is not a send but a "done" mark: the number (uint64, little
 * endian) of messages Python has read from that pipe so far, sent after its answers to them
 * (it counts what it reads; the lane numbers what it passes, from 1, in the same order). The
 * take rule then also asks that the peer have no message still in Python's hands: the entry's
 * last passed message, or the last one before Python's latest note() of it, is numbered at most
 * the mark. Else the HEARTBEAT goes to Python too, so the peer sees the answers in the order it
 * sent (a beat after a CHECKCONFIG or a stale HEARTBEAT is answered after Python's answer to
 * that). Without marks the lane answers at once, whatever Python still holds of the peer.
 *
 * Never blocks, never drops a message bound for Python: a ROUTER is read in batches (at most
 * S0_LANE_BUDGET messages per wake-up, one clock read per batch); if its pipe is full (EAGAIN)
 * the rest of the batch is held and that ROUTER is not read until the pipe takes it (the pipe
 * is polled for POLLOUT): backpressure is the ROUTER's RCVHWM, as without a lane. At stop(),
 * what is still held goes to the pipe if it takes it now, else it is counted in "lost" (the
 * only loss: a lane stopped while Python is not reading its pipe).
 *
 * Threads. The session table has one mutex: the Python-called methods hold the GIL and take it
 * briefly (never while making a Python object); the thread takes it once per batch and never
 * takes the GIL. Counters are atomics. The thread uses only these C structures and libzmq.
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>
#include <errno.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "../_table.h"
#include "_zmqio.h"

#define S0_LANE_BUDGET 256 /* messages read per socket per wake-up */
#define S0_LANE_INLINE_FRAMES 8
#define S0_LANE_MAX_FD (1 << 24)

static const char *const SIGNATURES[2] = {"S0C1", "S0W1"};

/* ---- the session table ------------------------------------------------------------------- */

typedef struct {
    s0_key key; /* the routing id */
    long long promise_ms;
    double gap_s;
    double last_seen;
    Py_ssize_t heard_at; /* index in the lane's heard list, -1 if not in it */
    int channel;
    int majordomo;        /* it speaks Majordomo: an S0P HEARTBEAT from it is Python's */
    uint64_t last_passed; /* the number of its last message passed to Python (see "Order") */
} s0_entry;

typedef struct {
    s0_table entries[2];
    unsigned char *negotiated[2]; /* one byte per fd */
    size_t negotiated_cap[2];
    s0_entry **heard;
    size_t n_heard, heard_cap;
    int configured;
    long long config_version;
    double max_skew_s;
    uint64_t passed_seq[2]; /* messages passed to Python per channel, numbered from 1 */
    uint64_t done_seq[2];   /* (the thread's own) Python's last "done" mark per channel */
    int ordered[2];         /* (the thread's own) a mark came: the order rule is on */
} s0_sessions;

static s0_entry *entry_find(s0_sessions *t, int channel, const unsigned char *rid, size_t len) {
    return (s0_entry *)table_find(&t->entries[channel], rid, len, hash_bytes(rid, len));
}

static void heard_drop(s0_sessions *t, s0_entry *e) {
    if (e->heard_at < 0)
        return;
    size_t i = (size_t)e->heard_at;
    s0_entry *last = t->heard[--t->n_heard];
    t->heard[i] = last;
    last->heard_at = (Py_ssize_t)i;
    e->heard_at = -1;
}

/* 0, or -1 out of memory (the entry is then not listed; heard() misses it once). */
static int heard_add(s0_sessions *t, s0_entry *e) {
    if (e->heard_at >= 0)
        return 0;
    if (t->n_heard == t->heard_cap) {
        size_t cap = t->heard_cap ? 2 * t->heard_cap : 64;
        s0_entry **grown = realloc(t->heard, cap * sizeof(*grown));
        if (grown == NULL)
            return -1;
        t->heard = grown;
        t->heard_cap = cap;
    }
    e->heard_at = (Py_ssize_t)t->n_heard;
    t->heard[t->n_heard++] = e;
    return 0;
}

static void sessions_clear(s0_sessions *t) {
    for (int c = 0; c < 2; c++) {
        s0_table *tab = &t->entries[c];
        if (tab->slots != NULL)
            for (size_t i = 0; i <= tab->mask; i++)
                free(tab->slots[i]);
        free(tab->slots);
        tab->slots = NULL;
        tab->mask = 0;
        tab->used = 0;
    }
    t->n_heard = 0;
}

static void sessions_free(s0_sessions *t) {
    sessions_clear(t);
    for (int c = 0; c < 2; c++) {
        free(t->negotiated[c]);
        t->negotiated[c] = NULL;
        t->negotiated_cap[c] = 0;
    }
    free(t->heard);
    t->heard = NULL;
    t->heard_cap = 0;
}

static int is_negotiated(const s0_sessions *t, int channel, int fd) {
    return fd < 0 || ((size_t)fd < t->negotiated_cap[channel] && t->negotiated[channel][fd]);
}

/* ---- a message read from a ROUTER ------------------------------------------------------------ */

typedef struct {
    s0_zmq_msg_t *frames; /* inline or heap */
    size_t n, cap;
    s0_zmq_msg_t inline_frames[S0_LANE_INLINE_FRAMES];
    int fd;
    int take;            /* taken by the lane: answered (frontend) and dropped */
    long long promise;   /* the answer's interval_ms (0: none) */
    char *header;        /* inline or heap */
    size_t header_len;
    char inline_header[4 + 64];
} s0_message;

static void message_close(s0_message *m) {
    for (size_t i = 0; i < m->n; i++)
        p_msg_close(&m->frames[i]);
    if (m->frames != m->inline_frames)
        free(m->frames);
    if (m->header != m->inline_header)
        free(m->header);
    m->frames = m->inline_frames;
    m->cap = S0_LANE_INLINE_FRAMES;
    m->n = 0;
    m->header = m->inline_header;
    m->header_len = 0;
}

/* Strict UTF-8 (what Python's decoder accepts): no overlong forms, surrogates or > U+10FFFF. */
static int utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0)
                lo = 0xA0;
            else if (c == 0xED)
                hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;
        } else {
            return 0;
        }
        if (n - i < len)
            return 0;
        if (s[i + 1] < lo || s[i + 1] > hi)
            return 0;
        for (size_t k = 2; k < len; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF)
                return 0;
        i += len;
    }
    return 1;
}

/* ---- the lane ------------------------------------------------------------------------------ */

enum {
    ST_WAKEUPS,
    ST_RECEIVED,
    ST_BEATS,
    ST_PASSED,
    ST_SENT,
    ST_SEND_DROPPED,
    ST_ANSWERS,
    ST_STALLED,
    ST_LOST,
    ST_ERRORS,
    ST_MARKS,
    ST_COUNT,
};

static const char *const STAT_NAMES[ST_COUNT] = {
    "wakeups", "received", "beats", "passed", "sent", "send_dropped", "answers", "stalled",
    "lost", "errors", "marks",
};

typedef struct {
    void *router;
    void *pipe;
    int keyed;
    s0_message batch[S0_LANE_BUDGET];
    size_t count;  /* messages in batch */
    size_t cursor; /* the next one to deliver; cursor < count: held (the pipe was full) */
} s0_channel;

typedef struct {
    PyObject_HEAD
    s0_channel ch[2];
    Py_ssize_t max_frame_bytes;
    int wake_fd;
    int started, stopped, joined;
    pthread_t thread;
    pthread_mutex_t join_mutex; /* one stop() joins; a concurrent one waits for it */
    pthread_mutex_t mutex;
    s0_sessions sessions;
    uint64_t stats[ST_COUNT];
    int stop_flag;
} LaneObject;

static void count(LaneObject *self, int which, uint64_t n) {
    __atomic_fetch_add(&self->stats[which], n, __ATOMIC_RELAXED);
}

static double clock_of(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Receive one whole message into m (closed before). 1: one was read; 0: none waiting (EAGAIN);
 * -1: a socket error (errno in *err). */
static int receive_message(void *sock, s0_message *m, int keyed, int *err) {
    m->n = 0;
    int more = 1;
    while (more) {
        if (m->n == m->cap) {
            size_t cap = m->cap * 2;
            s0_zmq_msg_t *grown;
            if (m->frames == m->inline_frames) {
                grown = malloc(cap * sizeof(*grown));
                if (grown != NULL)
                    memcpy(grown, m->inline_frames, sizeof(m->inline_frames));
            } else {
                grown = realloc(m->frames, cap * sizeof(*grown));
            }
            if (grown == NULL) { /* out of memory: the message is lost, counted */
                s0_zmq_msg_t scratch;
                while (more) {
                    p_msg_init(&scratch);
                    more = recv_frame(sock, &scratch) == 0 && p_msg_more(&scratch);
                    p_msg_close(&scratch);
                }
                message_close(m);
                *err = ENOMEM;
                return -1;
            }
            m->frames = grown;
            m->cap = cap;
        }
        s0_zmq_msg_t *f = &m->frames[m->n];
        p_msg_init(f);
        int rc = recv_frame(sock, f);
        if (rc != 0) {
            p_msg_close(f);
            if (rc == EAGAIN && m->n == 0)
                return 0;
            message_close(m);
            *err = rc;
            return -1;
        }
        m->n++;
        more = p_msg_more(f);
    }
    int fd = p_msg_get(&m->frames[0], S0_ZMQ_SRCFD);
    m->fd = fd < 0 ? -1 : fd;
    const char *uid = keyed ? p_msg_gets(&m->frames[0], "User-Id") : NULL;
    size_t uid_len = uid ? strlen(uid) : 0;
    if (uid_len && !utf8_valid((const unsigned char *)uid, uid_len))
        uid_len = 0;
    m->header = m->inline_header;
    if (4 + uid_len > sizeof(m->inline_header)) {
        m->header = malloc(4 + uid_len);
        if (m->header == NULL) {
            m->header = m->inline_header;
            uid_len = 0; /* out of memory: the key is lost, not the message */
        }
    }
    uint32_t v = (uint32_t)(int32_t)m->fd;
    m->header[0] = (char)(v & 0xff);
    m->header[1] = (char)((v >> 8) & 0xff);
    m->header[2] = (char)((v >> 16) & 0xff);
    m->header[3] = (char)((v >> 24) & 0xff);
    if (uid_len)
        memcpy(m->header + 4, uid, uid_len);
    m->header_len = 4 + uid_len;
    m->take = 0;
    return 1;
}

static int frame_is(s0_zmq_msg_t *f, const char *text, size_t len) {
    return p_msg_size(f) == len && (len == 0 || memcmp(p_msg_data(f), text, len) == 0);
}

/* Whether frames 1.. of m are exactly a Majordomo worker HEARTBEAT as the registry decodes it
 * to MdpWorkerHeartbeat (scale0/wire/registry.py, scale0/wire/mdp.py): [b"", b"MDPW01", 0x04],
 * [b"", b"MDPW02", 0x05], or 18/MDP's undelimited [b"MDPW02", 0x05]; every frame at most
 * max_frame_bytes (an MDPW01 without its empty frame is malformed there: not this). */
static int mdp_worker_beat(s0_message *m, Py_ssize_t max_frame_bytes) {
    s0_zmq_msg_t *f = m->frames;
    if (max_frame_bytes < 6)
        return 0;
    if (m->n == 4 && frame_is(&f[1], "", 0))
        return (frame_is(&f[2], "MDPW01", 6) && frame_is(&f[3], "\x04", 1)) ||
               (frame_is(&f[2], "MDPW02", 6) && frame_is(&f[3], "\x05", 1));
    return m->n == 3 && frame_is(&f[1], "MDPW02", 6) && frame_is(&f[2], "\x05", 1);
}

/* Whether the take rule takes the message (the mutex held); raises the entry's last_seen. */
static int takes(LaneObject *self, int channel, s0_message *m, s0_entry *e, double now,
                 double wall) {
    s0_sessions *t = &self->sessions;
    double previous = e->last_seen;
    if (now > e->last_seen)
        e->last_seen = now;
    if (!t->configured)
        return 0;
    /* A Majordomo worker's HEARTBEAT: Majordomo.worker_heartbeat only marks its session heard
     * (Sessions.seen: no answer, no skew, version, promise or gap to check) */
    if (channel == 1 && mdp_worker_beat(m, self->max_frame_bytes))
        return is_negotiated(t, channel, m->fd) &&
               !(t->ordered[channel] && e->last_passed > t->done_seq[channel]);
    if (e->majordomo || m->n != 5 || !frame_is(&m->frames[1], "", 0) ||
        !frame_is(&m->frames[2], SIGNATURES[channel], 4) ||
        !frame_is(&m->frames[3], "HEARTBEAT", 9) ||
        p_msg_size(&m->frames[4]) > (size_t)self->max_frame_bytes)
        return 0;
    double sent;
    long long version, interval;
    if (!s0_beat_options(p_msg_data(&m->frames[4]), p_msg_size(&m->frames[4]), &sent, &version,
                         &interval))
        return 0;
    if (!is_negotiated(t, channel, m->fd) || fabs(sent - wall) > t->max_skew_s ||
        version < t->config_version || interval != e->promise_ms)
        return 0;
    if (channel == 1 && e->gap_s != 0.0 && !isinf(e->gap_s) && now - previous > e->gap_s)
        return 0;
    /* Order: not while one of its messages is still in Python's hands */
    if (t->ordered[channel] && e->last_passed > t->done_seq[channel])
        return 0;
    return 1;
}

/* Take the message or number it for Python (the mutex held). */
static void classify(LaneObject *self, int channel, s0_message *m, double now, double wall) {
    s0_sessions *t = &self->sessions;
    s0_zmq_msg_t *rid = &m->frames[0];
    s0_entry *e = entry_find(t, channel, p_msg_data(rid), p_msg_size(rid));
    if (e != NULL && takes(self, channel, m, e, now, wall)) {
        m->take = 1;
        m->promise = e->promise_ms;
        heard_add(t, e);
        return;
    }
    uint64_t seq = ++t->passed_seq[channel];
    if (e != NULL)
        e->last_passed = seq;
}

/* `wall` as JSON's float, as Python's repr writes it: the shortest of %.15g..%.17g that reads
 * back as it (the thread runs in the C locale), with a "." when it has neither "." nor exponent.
 * number: at least 40 bytes. */
static void format_time(char *number, size_t size, double wall) {
    for (int precision = 15; precision <= 17; precision++) {
        snprintf(number, size, "%.*g", precision, wall);
        if (strtod(number, NULL) == wall)
            break;
    }
    if (strpbrk(number, ".eEn") == NULL)
        strcat(number, ".0");
}

/* The frontend's answer to a beat taken (Heartbeat.to_frames' bytes); `number` its time. */
static void answer(LaneObject *self, s0_message *m, const char *number, long long version) {
    char opts[160];
    int len;
    if (m->promise > 0)
        len = snprintf(opts, sizeof(opts),
                       "{\"time\":%s,\"config_version\":%lld,\"interval_ms\":%lld}", number,
                       version, m->promise);
    else
        len = snprintf(opts, sizeof(opts), "{\"time\":%s,\"config_version\":%lld}", number,
                       version);
    void *router = self->ch[0].router;
    s0_zmq_msg_t *rid = &m->frames[0];
    int flags = S0_ZMQ_DONTWAIT | S0_ZMQ_SNDMORE;
    int err = send_frame(router, p_msg_data(rid), p_msg_size(rid), flags);
    if (err == 0)
        err = send_frame(router, "", 0, flags);
    if (err == 0)
        err = send_frame(router, SIGNATURES[0], 4, flags);
    if (err == 0)
        err = send_frame(router, "HEARTBEAT", 9, flags);
    if (err == 0)
        err = send_frame(router, opts, (size_t)len, S0_ZMQ_DONTWAIT);
    count(self, err == 0 ? ST_ANSWERS : ST_SEND_DROPPED, 1);
}

/* Send the held and new messages of `c` to its pipe, in order, until it is full. 1: all gone. */
static int deliver(LaneObject *self, s0_channel *c) {
    while (c->cursor < c->count) {
        s0_message *m = &c->batch[c->cursor];
        int err = send_frame(c->pipe, m->header, m->header_len,
                             S0_ZMQ_DONTWAIT | S0_ZMQ_SNDMORE);
        if (err == EAGAIN) {
            count(self, ST_STALLED, 1);
            return 0;
        }
        for (size_t i = 0; err == 0 && i < m->n; i++) {
            int flags = S0_ZMQ_DONTWAIT | (i + 1 < m->n ? S0_ZMQ_SNDMORE : 0);
            for (;;) {
                if (p_msg_send(&m->frames[i], c->pipe, flags) >= 0)
                    break;
                err = p_errno();
                if (err != EINTR)
                    break;
                err = 0;
            }
        }
        /* a pipe that took the first frame takes the rest; a failure is its end (ETERM) */
        count(self, err == 0 ? ST_PASSED : ST_LOST, 1);
        message_close(m);
        c->cursor++;
    }
    c->count = c->cursor = 0;
    return 1;
}

/* Read up to a budget of messages from c's ROUTER, take what the rule takes, pass the rest. */
static void read_router(LaneObject *self, int channel) {
    s0_channel *c = &self->ch[channel];
    size_t n = 0;
    int err = 0;
    while (n < S0_LANE_BUDGET) {
        int rc = receive_message(c->router, &c->batch[n], c->keyed, &err);
        if (rc == 0)
            break;
        if (rc < 0) {
            if (err != ENOMEM) {
                count(self, ST_ERRORS, 1);
                break;
            }
            count(self, ST_RECEIVED, 1); /* received and lost (out of memory) */
            count(self, ST_LOST, 1);
            continue;
        }
        n++;
    }
    if (n == 0)
        return;
    count(self, ST_RECEIVED, n);
    double now = clock_of(CLOCK_MONOTONIC);
    double wall = clock_of(CLOCK_REALTIME);
    pthread_mutex_lock(&self->mutex);
    for (size_t i = 0; i < n; i++)
        classify(self, channel, &c->batch[i], now, wall);
    long long version = self->sessions.config_version;
    pthread_mutex_unlock(&self->mutex);
    size_t kept = 0;
    uint64_t beats = 0;
    char number[40] = ""; /* the answers' time, made once per batch */
    for (size_t i = 0; i < n; i++) {
        s0_message *m = &c->batch[i];
        if (m->take) {
            beats++;
            if (channel == 0) {
                if (number[0] == '\0')
                    format_time(number, sizeof(number), wall);
                answer(self, m, number, version);
            }
            message_close(m);
            continue;
        }
        if (kept != i) { /* move it down: its frames are plain bytes (zmq_msg_t is movable) */
            s0_message *to = &c->batch[kept];
            *to = *m;
            if (m->frames == m->inline_frames)
                to->frames = to->inline_frames;
            if (m->header == m->inline_header)
                to->header = to->inline_header;
            m->frames = m->inline_frames;
            m->cap = S0_LANE_INLINE_FRAMES;
            m->n = 0;
            m->header = m->inline_header;
        }
        kept++;
    }
    count(self, ST_BEATS, beats);
    c->count = kept;
    c->cursor = 0;
    deliver(self, c);
}

/* Forward Python's sends on channel k's pipe to its ROUTER: at most `budget` messages (0: all).
 * A message of one 8-byte frame is Python's "done" mark (see "Order"), not a send. */
static void forward(LaneObject *self, int k, size_t budget) {
    s0_channel *c = &self->ch[k];
    for (size_t done = 0; budget == 0 || done < budget; done++) {
        int more = 1, first = 1, failed = 0, mark = 0;
        while (more) {
            s0_zmq_msg_t f;
            p_msg_init(&f);
            int err = recv_frame(c->pipe, &f);
            if (err != 0) {
                p_msg_close(&f);
                if (!(err == EAGAIN && first))
                    count(self, ST_ERRORS, 1);
                return;
            }
            more = p_msg_more(&f);
            if (first && !more && p_msg_size(&f) == 8) {
                const unsigned char *b = p_msg_data(&f);
                uint64_t seq = 0;
                for (int i = 7; i >= 0; i--)
                    seq = (seq << 8) | b[i];
                s0_sessions *t = &self->sessions;
                if (seq > t->done_seq[k])
                    t->done_seq[k] = seq;
                t->ordered[k] = 1;
                mark = 1;
                p_msg_close(&f);
                break;
            }
            first = 0;
            if (!failed) {
                int flags = S0_ZMQ_DONTWAIT | (more ? S0_ZMQ_SNDMORE : 0);
                for (;;) {
                    if (p_msg_send(&f, c->router, flags) >= 0)
                        break;
                    if (p_errno() != EINTR) {
                        failed = 1;
                        break;
                    }
                }
            }
            p_msg_close(&f);
        }
        count(self, mark ? ST_MARKS : failed ? ST_SEND_DROPPED : ST_SENT, 1);
    }
}

static void *lane_main(void *arg) {
    LaneObject *self = arg;
    locale_t c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
    locale_t previous = c_locale ? uselocale(c_locale) : (locale_t)0;
    for (;;) {
        s0_zmq_pollitem_t items[5];
        int n = 0;
        for (int k = 0; k < 2; k++) {
            s0_channel *c = &self->ch[k];
            int held = c->cursor < c->count;
            items[n++] = (s0_zmq_pollitem_t){c->router, 0, held ? 0 : S0_ZMQ_POLLIN, 0};
            items[n++] = (s0_zmq_pollitem_t){
                c->pipe, 0, (short)(S0_ZMQ_POLLIN | (held ? S0_ZMQ_POLLOUT : 0)), 0};
        }
        items[n++] = (s0_zmq_pollitem_t){NULL, self->wake_fd, S0_ZMQ_POLLIN, 0};
        int rc = p_poll(items, n, -1);
        if (rc < 0) {
            int err = p_errno();
            if (err == EINTR)
                continue;
            count(self, ST_ERRORS, 1);
            break; /* ETERM, or a socket closed under us */
        }
        count(self, ST_WAKEUPS, 1);
        if (__atomic_load_n(&self->stop_flag, __ATOMIC_ACQUIRE))
            break;
        for (int k = 0; k < 2; k++)
            if (items[2 * k + 1].revents & S0_ZMQ_POLLIN)
                forward(self, k, S0_LANE_BUDGET);
        for (int k = 0; k < 2; k++) {
            s0_channel *c = &self->ch[k];
            if (c->cursor < c->count && !deliver(self, c))
                continue;
            if (items[2 * k].revents & S0_ZMQ_POLLIN || items[2 * k].events == 0)
                read_router(self, k);
        }
    }
    /* Python's last sends (its DISCONNECTs at shutdown), all of them. */
    for (int k = 0; k < 2; k++)
        forward(self, k, 0);
    for (int k = 0; k < 2; k++) { /* held for a full pipe: what it takes now, the rest is lost */
        s0_channel *c = &self->ch[k];
        if (c->cursor < c->count && !deliver(self, c)) {
            count(self, ST_LOST, c->count - c->cursor);
            for (size_t i = c->cursor; i < c->count; i++)
                message_close(&c->batch[i]);
            c->count = c->cursor = 0;
        }
    }
    if (c_locale) {
        uselocale(previous);
        freelocale(c_locale);
    }
    return NULL;
}

/* ---- Python methods ------------------------------------------------------------------------ */

static int parse_channel(int channel) {
    if (channel != 0 && channel != 1) {
        PyErr_Format(PyExc_ValueError, "channel must be 0 (frontend) or 1 (backend), not %d",
                     channel);
        return -1;
    }
    return 0;
}

static void *handle_of(PyObject *obj, const char *name) {
    void *handle = PyLong_Check(obj) ? PyLong_AsVoidPtr(obj) : NULL;
    if (handle == NULL) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError) ||
            PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "Lane: %s must be a libzmq socket handle (pyzmq Socket.underlying), "
                         "not %.100R",
                         name, obj);
        }
    }
    return handle;
}

static PyObject *lane_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"frontend", "backend", "front_pipe", "back_pipe", "keyed_front",
                             "keyed_back", "max_frame_bytes", NULL};
    PyObject *handles[4];
    int keyed_front, keyed_back;
    Py_ssize_t max_frame_bytes;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOppn:Lane", kwlist, &handles[0], &handles[1],
                                     &handles[2], &handles[3], &keyed_front, &keyed_back,
                                     &max_frame_bytes))
        return NULL;
    static const char *names[4] = {"frontend", "backend", "front_pipe", "back_pipe"};
    void *socks[4];
    for (int i = 0; i < 4; i++) {
        socks[i] = handle_of(handles[i], names[i]);
        if (socks[i] == NULL)
            return NULL;
    }
    if (max_frame_bytes < 0) {
        PyErr_Format(PyExc_ValueError, "Lane: max_frame_bytes must be >= 0, not %zd",
                     max_frame_bytes);
        return NULL;
    }
    LaneObject *self = (LaneObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    /* tp_alloc zeroed it */
    self->wake_fd = -1;
    for (int k = 0; k < 2; k++) {
        s0_channel *c = &self->ch[k];
        c->router = socks[k];
        c->pipe = socks[2 + k];
        c->keyed = k == 0 ? keyed_front : keyed_back;
        for (size_t i = 0; i < S0_LANE_BUDGET; i++) {
            c->batch[i].frames = c->batch[i].inline_frames;
            c->batch[i].cap = S0_LANE_INLINE_FRAMES;
            c->batch[i].header = c->batch[i].inline_header;
        }
    }
    self->max_frame_bytes = max_frame_bytes;
    pthread_mutex_init(&self->mutex, NULL);
    pthread_mutex_init(&self->join_mutex, NULL);
    self->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (self->wake_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* Stop and join the thread (if it runs), the GIL released; when two Python threads call stop()
 * at once, the second returns once the first has joined. */
static void lane_join(LaneObject *self) {
    if (!self->started)
        return;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->join_mutex);
    if (!self->joined) {
        __atomic_store_n(&self->stop_flag, 1, __ATOMIC_RELEASE);
        uint64_t one = 1;
        ssize_t w = write(self->wake_fd, &one, sizeof(one));
        (void)w; /* EAGAIN: the counter is already set, the thread wakes anyway */
        pthread_join(self->thread, NULL);
        self->joined = 1;
    }
    pthread_mutex_unlock(&self->join_mutex);
    Py_END_ALLOW_THREADS
}

static void lane_dealloc(LaneObject *self) {
    lane_join(self);
    if (self->wake_fd >= 0)
        close(self->wake_fd);
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < S0_LANE_BUDGET; i++)
            message_close(&self->ch[k].batch[i]);
    sessions_free(&self->sessions);
    pthread_mutex_destroy(&self->mutex);
    pthread_mutex_destroy(&self->join_mutex);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *lane_start(LaneObject *self, PyObject *unused) {
    (void)unused;
    if (self->started || self->stopped) {
        PyErr_SetString(PyExc_RuntimeError,
                        self->stopped ? "Lane.start: the lane was stopped; make a new one"
                                      : "Lane.start: already started");
        return NULL;
    }
    /* Signals go to Python's threads, never to the lane's (its poll would only see EINTR). */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&self->thread, NULL, lane_main, self);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    self->started = 1;
    Py_RETURN_NONE;
}

static PyObject *lane_stop(LaneObject *self, PyObject *unused) {
    (void)unused;
    self->stopped = 1;
    lane_join(self);
    Py_RETURN_NONE;
}

static PyObject *lane_configure(LaneObject *self, PyObject *args) {
    long long version;
    double skew;
    if (!PyArg_ParseTuple(args, "Ld:configure", &version, &skew))
        return NULL;
    if (isnan(skew) || skew < 0) {
        PyErr_Format(PyExc_ValueError, "Lane.configure: max_skew_s must be >= 0, not %R",
                     PyTuple_GET_ITEM(args, 1));
        return NULL;
    }
    pthread_mutex_lock(&self->mutex);
    self->sessions.configured = 1;
    self->sessions.config_version = version;
    self->sessions.max_skew_s = skew;
    pthread_mutex_unlock(&self->mutex);
    Py_RETURN_NONE;
}

static PyObject *lane_note(LaneObject *self, PyObject *args) {
    int channel;
    const char *rid;
    Py_ssize_t rid_len;
    long long promise;
    double gap, last_seen;
    int majordomo = 0;
    if (!PyArg_ParseTuple(args, "iy#Ldd|p:note", &channel, &rid, &rid_len, &promise, &gap,
                          &last_seen, &majordomo) ||
        parse_channel(channel) < 0)
        return NULL;
    if (isnan(gap) || gap < 0) {
        PyErr_Format(PyExc_ValueError, "Lane.note: gap_s must be >= 0 (0 or inf: no check), not %R",
                     PyTuple_GET_ITEM(args, 3));
        return NULL;
    }
    if (isnan(last_seen)) {
        PyErr_SetString(PyExc_ValueError, "Lane.note: last_seen is NaN");
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)rid;
    size_t len = (size_t)rid_len;
    uint64_t hash = hash_bytes(data, len);
    int failed = 0;
    pthread_mutex_lock(&self->mutex);
    s0_table *t = &self->sessions.entries[channel];
    s0_entry *e = (s0_entry *)table_find(t, data, len, hash);
    if (e == NULL) {
        if (table_reserve(t, 1) < 0 ||
            (e = record_new(sizeof(s0_entry), data, len, hash)) == NULL) {
            failed = 1;
        } else {
            e->heard_at = -1;
            e->channel = channel;
            e->last_seen = last_seen;
            table_insert(t, &e->key);
        }
    }
    if (e != NULL) {
        e->promise_ms = promise;
        e->gap_s = gap;
        e->majordomo = majordomo;
        if (last_seen > e->last_seen)
            e->last_seen = last_seen;
        /* Python may be handling one of its messages now (its note says so): Order */
        if (self->sessions.passed_seq[channel] > e->last_passed)
            e->last_passed = self->sessions.passed_seq[channel];
    }
    pthread_mutex_unlock(&self->mutex);
    if (failed)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *lane_forget(LaneObject *self, PyObject *args) {
    int channel;
    const char *rid;
    Py_ssize_t rid_len;
    if (!PyArg_ParseTuple(args, "iy#:forget", &channel, &rid, &rid_len) ||
        parse_channel(channel) < 0)
        return NULL;
    pthread_mutex_lock(&self->mutex);
    s0_entry *e = entry_find(&self->sessions, channel, (const unsigned char *)rid, (size_t)rid_len);
    if (e != NULL) {
        heard_drop(&self->sessions, e);
        table_remove(&self->sessions.entries[channel], &e->key);
        free(e);
    }
    pthread_mutex_unlock(&self->mutex);
    Py_RETURN_NONE;
}

static PyObject *lane_clear(LaneObject *self, PyObject *unused) {
    (void)unused;
    pthread_mutex_lock(&self->mutex);
    sessions_clear(&self->sessions);
    pthread_mutex_unlock(&self->mutex);
    Py_RETURN_NONE;
}

static int parse_fd(PyObject *args, const char *format, int *channel, int *fd) {
    if (!PyArg_ParseTuple(args, format, channel, fd) || parse_channel(*channel) < 0)
        return -1;
    if (*fd < 0 || *fd >= S0_LANE_MAX_FD) {
        PyErr_Format(PyExc_ValueError, "Lane: fd must be in 0..%d, not %d", S0_LANE_MAX_FD - 1,
                     *fd);
        return -1;
    }
    return 0;
}

static PyObject *lane_negotiated(LaneObject *self, PyObject *args) {
    int channel, fd;
    if (parse_fd(args, "ii:negotiated", &channel, &fd) < 0)
        return NULL;
    int failed = 0;
    pthread_mutex_lock(&self->mutex);
    s0_sessions *t = &self->sessions;
    if ((size_t)fd >= t->negotiated_cap[channel]) {
        size_t cap = t->negotiated_cap[channel] ? t->negotiated_cap[channel] : 256;
        while (cap <= (size_t)fd)
            cap *= 2;
        unsigned char *grown = realloc(t->negotiated[channel], cap);
        if (grown == NULL) {
            failed = 1;
        } else {
            memset(grown + t->negotiated_cap[channel], 0, cap - t->negotiated_cap[channel]);
            t->negotiated[channel] = grown;
            t->negotiated_cap[channel] = cap;
        }
    }
    if (!failed)
        t->negotiated[channel][fd] = 1;
    pthread_mutex_unlock(&self->mutex);
    if (failed)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *lane_gone(LaneObject *self, PyObject *args) {
    int channel, fd;
    if (parse_fd(args, "ii:gone", &channel, &fd) < 0)
        return NULL;
    pthread_mutex_lock(&self->mutex);
    s0_sessions *t = &self->sessions;
    if ((size_t)fd < t->negotiated_cap[channel])
        t->negotiated[channel][fd] = 0;
    pthread_mutex_unlock(&self->mutex);
    Py_RETURN_NONE;
}

typedef struct {
    int channel;
    double last_seen;
    size_t len;
    unsigned char *rid; /* into the copy's block */
} s0_heard_copy;

static int heard_order(const void *a, const void *b) {
    const s0_heard_copy *x = a, *y = b;
    if (x->last_seen != y->last_seen)
        return x->last_seen < y->last_seen ? -1 : 1;
    if (x->channel != y->channel)
        return x->channel - y->channel;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = n ? memcmp(x->rid, y->rid, n) : 0;
    if (c != 0)
        return c;
    return x->len < y->len ? -1 : x->len > y->len;
}

static PyObject *lane_heard(LaneObject *self, PyObject *unused) {
    (void)unused;
    s0_heard_copy *copies = NULL;
    unsigned char *block = NULL;
    size_t n = 0;
    int failed = 0;
    pthread_mutex_lock(&self->mutex);
    s0_sessions *t = &self->sessions;
    n = t->n_heard;
    if (n > 0) {
        size_t bytes = 0;
        for (size_t i = 0; i < n; i++)
            bytes += t->heard[i]->key.len;
        copies = malloc(n * sizeof(*copies));
        block = malloc(bytes ? bytes : 1);
        if (copies == NULL || block == NULL) {
            failed = 1;
        } else {
            size_t at = 0;
            for (size_t i = 0; i < n; i++) {
                s0_entry *e = t->heard[i];
                copies[i].channel = e->channel;
                copies[i].last_seen = e->last_seen;
                copies[i].len = e->key.len;
                copies[i].rid = block + at;
                if (e->key.len)
                    memcpy(block + at, e->key.data, e->key.len);
                at += e->key.len;
                e->heard_at = -1;
            }
            t->n_heard = 0;
        }
    }
    pthread_mutex_unlock(&self->mutex);
    PyObject *out = NULL;
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    if (n > 1)
        qsort(copies, n, sizeof(*copies), heard_order);
    out = PyList_New((Py_ssize_t)n);
    if (out == NULL)
        goto done;
    for (size_t i = 0; i < n; i++) {
        PyObject *item = Py_BuildValue("(iy#d)", copies[i].channel, (const char *)copies[i].rid,
                                       (Py_ssize_t)copies[i].len, copies[i].last_seen);
        if (item == NULL) {
            Py_CLEAR(out); /* (what was heard is lost with the MemoryError) */
            goto done;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, item);
    }
done:
    free(copies);
    free(block);
    return out;
}

static PyObject *lane_last_seen(LaneObject *self, PyObject *args) {
    int channel;
    const char *rid;
    Py_ssize_t rid_len;
    if (!PyArg_ParseTuple(args, "iy#:last_seen", &channel, &rid, &rid_len) ||
        parse_channel(channel) < 0)
        return NULL;
    int found = 0;
    double seen = 0.0;
    pthread_mutex_lock(&self->mutex);
    s0_entry *e = entry_find(&self->sessions, channel, (const unsigned char *)rid, (size_t)rid_len);
    if (e != NULL) {
        found = 1;
        seen = e->last_seen;
    }
    pthread_mutex_unlock(&self->mutex);
    if (!found)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(seen);
}

static PyObject *lane_stats(LaneObject *self, PyObject *unused) {
    (void)unused;
    uint64_t values[ST_COUNT];
    for (int i = 0; i < ST_COUNT; i++)
        values[i] = __atomic_load_n(&self->stats[i], __ATOMIC_RELAXED);
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    for (int i = 0; i < ST_COUNT; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(values[i]);
        if (v == NULL || PyDict_SetItemString(out, STAT_NAMES[i], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(v);
    }
    return out;
}

static PyMethodDef lane_methods[] = {
    {"start", (PyCFunction)lane_start, METH_NOARGS, "start(): spawn the lane thread (once)"},
    {"stop", (PyCFunction)lane_stop, METH_NOARGS,
     "stop(): idempotent; forward Python's pending sends, stop and join the thread"},
    {"configure", (PyCFunction)lane_configure, METH_VARARGS,
     "configure(config_version, max_skew_s): the running config's version and R12 limit"},
    {"note", (PyCFunction)lane_note, METH_VARARGS,
     "note(channel, routing_id, promise_ms, gap_s, last_seen, majordomo=False): insert or "
     "update a session"},
    {"forget", (PyCFunction)lane_forget, METH_VARARGS, "forget(channel, routing_id)"},
    {"clear", (PyCFunction)lane_clear, METH_NOARGS, "clear(): forget every session"},
    {"negotiated", (PyCFunction)lane_negotiated, METH_VARARGS,
     "negotiated(channel, fd): the connection negotiated (R20)"},
    {"gone", (PyCFunction)lane_gone, METH_VARARGS, "gone(channel, fd): the connection closed"},
    {"heard", (PyCFunction)lane_heard, METH_NOARGS,
     "heard() -> [(channel, routing_id, last_seen)] raised by beats the lane took, once each"},
    {"last_seen", (PyCFunction)lane_last_seen, METH_VARARGS,
     "last_seen(channel, routing_id) -> float | None"},
    {"stats", (PyCFunction)lane_stats, METH_NOARGS, "stats() -> dict of counters"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "scale0.net._zmqio.Lane",
    .tp_doc = "The C lane: owns the broker's ROUTERs, answers plain HEARTBEATs "
              "(see scale0/net/_lane.c)",
    .tp_basicsize = sizeof(LaneObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = lane_new,
    .tp_dealloc = (destructor)lane_dealloc,
    .tp_methods = lane_methods,
};

int s0_lane_add(void *module) {
    s0_hash_seed();
    if (PyType_Ready(&LaneType) < 0)
        return -1;
    Py_INCREF(&LaneType);
    if (PyModule_AddObject((PyObject *)module, "Lane", (PyObject *)&LaneType) < 0) {
        Py_DECREF(&LaneType);
        return -1;
    }
    return 0;
}
